// The speech models on the CUDA backend against the CPU backend: a DeepSpeech and a Listen-Attend-
// Spell training step on tiny sizes and variable-length batches (loss, every parameter's gradient,
// batch norm's running statistics, an Adam update), then an evaluation forward and the decoded
// transcripts on the updated weights. The op-by-op comparisons are cuda_sequence_test (sequence ops,
// CTC), cuda_lstm_test (the LSTM) and cuda_speller_test (LAS's speller ops).
//
// Needs a GPU: without one the binary prints why and exits 77 (ctest: skipped).
#ifdef TRAINER_HAS_CUDA
#define CATCH_CONFIG_RUNNER
#include "cuda_parity.h"
#include "speech_testing.h"

#include "models/nets/deepspeech.h"
#include "models/nets/las.h"

using namespace trainer::models;
using trainer::cuda_testing::cpu;
using trainer::cuda_testing::gpu;
using trainer::cuda_testing::host_grads;
using trainer::cuda_testing::require_views_close;
using trainer::testing::SpeechTestBatch;

namespace {

// One Adam step on a model's flat buffers, through its own backend.
void adam_step(SpeechModel& model, Backend& backend, DeviceBuffer& m, DeviceBuffer& v) {
  ParameterStore& p = model.parameters();
  const AdamUpdate u{-1e-2f, 1.f, 1e-8f, 0.9f, 0.1f, 0.999f, 1e-3f, 0.f, 1.f};
  backend.adam_update(p.size(), u, p.values(), p.grads(), m.data(), v.data());
}

// The batch's features on the GPU (the trainer's DeviceCopy does this for a run).
struct GpuInput {
  trainer::cuda_testing::GpuArray features;
  SpeechInput input;
  explicit GpuInput(const SpeechTestBatch& b) : features(b.features), input(b.input()) {
    input.features = features.data();
  }
};

// A training step on both backends from the same initialization, then an update and an evaluation.
void compare_step(SpeechModel& on_cpu, SpeechModel& on_gpu, const SpeechTestBatch& batch, uint64_t seed) {
  REQUIRE(on_cpu.parameters().host_values() == on_gpu.parameters().host_values());
  SpeechInput cin = batch.input();
  cin.seed = seed;
  GpuInput gin(batch);
  gin.input.seed = seed;

  const double loss = on_cpu.forward(cin, Mode::kTrain);
  const double gloss = on_gpu.forward(gin.input, Mode::kTrain);
  REQUIRE(std::isfinite(loss));
  CHECK(gloss == Approx(loss).epsilon(1e-4));
  on_cpu.backward();
  on_gpu.backward();
  require_views_close(on_cpu.parameters(), host_grads(on_cpu.parameters()), host_grads(on_gpu.parameters()),
                      "gradient");
  if (on_cpu.buffers().size() > 0)
    require_views_close(on_cpu.buffers(), on_cpu.buffers().host_values(), on_gpu.buffers().host_values(), "buffer");

  // The update from the same gradients on both sides: Adam's first step moves an entry by
  // lr g / (|g| + eps), which turns gradients equal to 1e-4 (checked above) but as small as eps into
  // updates that differ by up to 2 lr (seen: the CPU's AVX2 LSTM against the emulated kernels). With
  // one gradient, what is compared is the update kernel itself.
  const int64_t n = on_cpu.parameters().size();
  const std::vector<float> cpu_grads = host_grads(on_cpu.parameters());
  trainer::models::copy_to_device(on_gpu.parameters().memory(), cpu_grads.data(), n, on_gpu.parameters().grads());
  DeviceBuffer cm(cpu(), n), cv(cpu(), n), gm(gpu(), n), gv(gpu(), n);
  for (auto [buffer, backend] : {std::pair{&cm, &cpu()}, {&cv, &cpu()}, {&gm, &gpu()}, {&gv, &gpu()}})
    backend->fill(n, 0.f, buffer->data());
  adam_step(on_cpu, cpu(), cm, cv);
  adam_step(on_gpu, gpu(), gm, gv);
  require_views_close(on_cpu.parameters(), on_cpu.parameters().host_values(), on_gpu.parameters().host_values(),
                      "after Adam");

  const double eval = on_cpu.forward(cin, Mode::kEval);
  const double geval = on_gpu.forward(gin.input, Mode::kEval);
  CHECK(geval == Approx(eval).epsilon(1e-4));
  // The transcripts are argmaxes of logits that agree to ~1e-5: equal unless two classes tie that
  // closely in some frame, which random weights make unlikely at these sizes.
  CHECK(on_gpu.decode(gin.input) == on_cpu.decode(cin));
}

// Frame counts with a full-length utterance, a short one and unsorted lengths; labels that fit.
SpeechTestBatch speech_batch(int64_t feature_dim, uint64_t seed) {
  return SpeechTestBatch(feature_dim, {40, 17, 33, 8}, {{3, 7, 7, 12}, {5}, {28, 1, 9}, {2, 2}}, seed);
}

}  // namespace

TEST_CASE("CUDA DeepSpeech training step matches the CPU: loss, gradients, running statistics, update, decode",
          "[cuda][model][speech]") {
  DeepSpeechOptions o;
  o.feature_dim = 16;
  o.conv_channels = 4;
  o.hidden = 24;
  o.rnn_layers = 3;
  o.context = 3;
  DeepSpeech on_cpu(cpu(), o, 5), on_gpu(gpu(), o, 5);
  compare_step(on_cpu, on_gpu, speech_batch(o.feature_dim, 21), 0);
}

TEST_CASE("CUDA Listen-Attend-Spell training step matches the CPU, teacher forcing 1.0 and 0.6, beam 1 and 3",
          "[cuda][model][speech]") {
  for (const double teacher_forcing : {1.0, 0.6}) {
    for (const int64_t beam : {1, 3}) {
      INFO("teacher forcing " << teacher_forcing << ", beam " << beam);
      LasOptions o = trainer::testing::tiny_las_options();
      o.teacher_forcing = teacher_forcing;
      o.beam_width = beam;
      o.max_decode_steps = 12;
      Las on_cpu(cpu(), o, 9), on_gpu(gpu(), o, 9);
      compare_step(on_cpu, on_gpu, speech_batch(o.feature_dim, 31), 77);
    }
  }
}

// One training step's loss and gradients, no update: the paper-size models.
static void compare_loss_and_gradients(SpeechModel& on_cpu, SpeechModel& on_gpu, const SpeechTestBatch& batch,
                                const std::string& what) {
  INFO(what);
  const SpeechInput cin = batch.input();
  GpuInput gin(batch);
  CHECK(on_gpu.forward(gin.input, Mode::kTrain) == Approx(on_cpu.forward(cin, Mode::kTrain)).epsilon(1e-4));
  on_cpu.backward();
  on_gpu.backward();
  require_views_close(on_cpu.parameters(), host_grads(on_cpu.parameters()), host_grads(on_gpu.parameters()),
                      what + " gradient", 1e-3);
}

TEST_CASE("CUDA speech models at their paper sizes take a training step that matches the CPU's loss",
          "[cuda][model][speech][large]") {
  // The default sizes exercise cuDNN's and the kernels' large-shape paths (hidden 800, 5 layers;
  // listener 384, speller 640).
  DeepSpeech ds_cpu(cpu(), DeepSpeechOptions{}, 1), ds_gpu(gpu(), DeepSpeechOptions{}, 1);
  compare_loss_and_gradients(ds_cpu, ds_gpu,
                             SpeechTestBatch(161, {120, 64, 97}, {{3, 7, 7, 12, 1}, {5, 6}, {28, 1, 9}}, 41),
                             "deepspeech");
  Las las_cpu(cpu(), LasOptions{}, 2), las_gpu(gpu(), LasOptions{}, 2);
  compare_loss_and_gradients(las_cpu, las_gpu,
                             SpeechTestBatch(80, {120, 64, 97}, {{3, 7, 7, 12, 1}, {5, 6}, {28, 1, 9}}, 43), "las");
}

int main(int argc, char** argv) { return trainer::cuda_testing::run_cuda_tests(argc, argv); }

#else
#include <cstdio>
int main() {
  std::puts("skip: built without TRAINER_CUDA");
  return 77;
}
#endif
