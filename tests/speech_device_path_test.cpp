// The speech models' device paths on machines without a GPU: DeepSpeech and LAS built on the CPU
// backend dressed as a device (device_like_backend.h: the CPU's ops, but is_host() false) take
// every branch a GPU run takes (LAS uploads its tokens, draws, targets and beam rows; DeepSpeech
// copies its logits back to decode) and must give the CPU path's bits: loss, every gradient, an
// update's effect on the next loss, and the transcripts. The kernels themselves are the CUDA parity
// tests' business (cuda_speech_models_test on a GPU).
#include <catch2/catch.hpp>

#include <cstring>

#include "device_like_backend.h"
#include "models/nets/deepspeech.h"
#include "models/nets/las.h"
#include "speech_testing.h"

using namespace trainer::models;
using trainer::testing::SpeechTestBatch;

namespace {

// Through a copy: the device model's gradients are device memory, which host code cannot read.
std::vector<float> grads_of(SpeechModel& m) {
  ParameterStore& p = m.parameters();
  std::vector<float> grads(static_cast<size_t>(p.size()));
  copy_to_host(p.memory(), p.grads(), p.size(), grads.data());
  return grads;
}

// Both models from one seed, a training step, an SGD step on each, an evaluation and the decodes.
void same_bits(SpeechModel& host, SpeechModel& device, DeviceLikeCpu& backend, const SpeechTestBatch& batch) {
  SpeechInput in = batch.input();
  in.seed = 1234;
  REQUIRE(host.parameters().host_values() == device.parameters().host_values());
  const double loss = host.forward(in, Mode::kTrain), device_loss = device.forward(in, Mode::kTrain);
  CHECK(std::memcmp(&loss, &device_loss, sizeof loss) == 0);
  host.backward();
  device.backward();
  CHECK(grads_of(host) == grads_of(device));
  const SgdUpdate u{-0.05f, 0.f, 1.f, 0.f, false, false, false};
  cpu_backend().sgd_update(host.parameters().size(), u, host.parameters().values(), host.parameters().grads(),
                           nullptr);
  backend.sgd_update(device.parameters().size(), u, device.parameters().values(), device.parameters().grads(),
                     nullptr);
  const double eval = host.forward(in, Mode::kEval), device_eval = device.forward(in, Mode::kEval);
  CHECK(std::memcmp(&eval, &device_eval, sizeof eval) == 0);
  CHECK(host.decode(in) == device.decode(in));
}

}  // namespace

TEST_CASE("DeepSpeech on a backend that is not host memory gives the CPU path's bits", "[speech][device]") {
  DeepSpeechOptions o;
  o.feature_dim = 16;
  o.conv_channels = 3;
  o.hidden = 10;
  o.rnn_layers = 2;
  o.context = 2;
  DeviceLikeCpu backend;
  DeepSpeech host(cpu_backend(), o, 5), device(backend, o, 5);
  same_bits(host, device, backend, SpeechTestBatch(16, {40, 17, 33, 8}, {{3, 7, 7, 12}, {5}, {28, 1, 9}, {2, 2}}, 21));
  CHECK(backend.memory.to_host > 0);  // decoding read the logits back
}

TEST_CASE("LAS on a backend that is not host memory gives the CPU path's bits (sampled tokens, beam search)",
          "[speech][device]") {
  for (const int64_t beam : {1, 3}) {
    INFO("beam " << beam);
    LasOptions o = trainer::testing::tiny_las_options();
    o.teacher_forcing = 0.6;
    o.beam_width = beam;
    o.max_decode_steps = 12;
    DeviceLikeCpu backend;
    Las host(cpu_backend(), o, 9), device(backend, o, 9);
    same_bits(host, device, backend,
              SpeechTestBatch(o.feature_dim, {40, 17, 33, 8}, {{3, 7, 7, 12}, {5}, {28, 1, 9}, {2, 2}}, 31));
    CHECK(backend.memory.to_device > 0);  // tokens, draws and targets went up
    CHECK(backend.memory.to_host > 0);    // the beam read each step's logits
  }
}
