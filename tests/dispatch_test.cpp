// No primitive of any model may run oneDNN's reference implementation (architecture.md section 2,
// "The engine is ISA-portable"). Every model is built and run (training forward and backward, and
// evaluation) at batch 1 and the batches the configs use, and every primitive the CPU backend made
// is checked against the allowlist of models/cpu/dnnl_dispatch.cpp. ctest runs this binary at the
// machine's own ISA and again capped with ONEDNN_MAX_CPU_ISA (AVX2, AVX512_CORE), so a machine with
// AVX-512 also tests the AVX2 path (a cap above what the CPU has changes nothing).
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "models/cpu/dnnl_dispatch.h"
#include "models/cpu/dnnl_precision.h"
#include "models/model.h"
#include "models/nets/deepspeech.h"
#include "models/nets/las.h"
#include "models/speech_model.h"
#include "skip.h"

using namespace trainer::models;

namespace {

// Fails for each reference primitive recorded since record `from` that the allowlist does not name.
void require_no_reference_since(size_t from) {
  const auto records = cpu::recorded_primitives();
  int checked = 0;
  for (size_t i = from; i < records.size(); ++i) {
    const auto& r = records[i];
    ++checked;
    if (!cpu::is_reference_impl(r.impl) || cpu::reference_allowed(r)) continue;
    FAIL_CHECK(r.kind << " (" << r.shape << ") runs oneDNN's reference implementation " << r.impl << " at ISA "
                      << cpu::dnnl_isa_name());
  }
  INFO("ISA " << cpu::dnnl_isa_name());
  CHECK(checked > 0);  // the model made primitives: the check looked at something
}

void run_image_model(const std::string& arch, int64_t batch, Backend& backend = cpu_backend()) {
  auto model = make_image_model({arch, 10, 0.f}, backend, 1);
  std::mt19937_64 rng(batch);
  std::normal_distribution<float> normal;
  std::vector<float> x(batch * 3 * 32 * 32);
  for (auto& v : x) v = normal(rng);
  std::vector<int32_t> labels(batch);
  for (auto& l : labels) l = static_cast<int32_t>(rng() % 10);
  const Tensor input{x.data(), {batch, 3, 32, 32}};
  model->forward(input, labels.data(), Mode::kTrain);
  model->backward();
  model->forward(input, labels.data(), Mode::kEval);
}

void run_speech_model(SpeechModel& model, int64_t feature_dim, int64_t batch, int64_t frames) {
  std::mt19937_64 rng(batch);
  std::normal_distribution<float> normal;
  std::vector<float> features(batch * frames * feature_dim);
  for (auto& v : features) v = normal(rng);
  std::vector<int32_t> lengths(batch), labels, label_lengths(batch, 6);
  for (int64_t n = 0; n < batch; ++n) lengths[n] = static_cast<int32_t>(frames - n % 3);  // ragged, as batches are
  for (int64_t i = 0; i < 6 * batch; ++i) labels.push_back(static_cast<int32_t>(1 + rng() % 28));
  const SpeechInput input{features.data(), batch, frames, feature_dim, lengths.data(), labels.data(),
                          label_lengths.data()};
  model.forward(input, Mode::kTrain);
  model.backward();
  model.forward(input, Mode::kEval);
}

// Under ONEDNN_MAX_CPU_ISA, whether the CPU has nothing above the ISA oneDNN runs at: then the
// capped run takes the kernels of the uncapped one (dispatch_test_NATIVE), e.g. a cap at
// AVX512_CORE or AVX2 on an AVX2-only CPU, and checks nothing new.
bool cap_repeats_native() {
  if (!std::getenv("ONEDNN_MAX_CPU_ISA")) return false;
  const std::string isa = cpu::dnnl_isa_name();
  if (isa == "avx2") return !__builtin_cpu_supports("avx512f") && !__builtin_cpu_supports("avxvnni");
  if (isa == "avx2_vnni") return !__builtin_cpu_supports("avx512f");
  if (isa == "avx512_core" || isa == "avx512_core_vnni")
    return !__builtin_cpu_supports("avx512bf16") && !__builtin_cpu_supports("amx-tile") &&
           (isa == "avx512_core_vnni" || !__builtin_cpu_supports("avx512vnni"));
  if (isa == "avx512_core_bf16") return !__builtin_cpu_supports("amx-tile");
  return false;
}

}  // namespace

// The first case: a capped run that would repeat the native one ends here as skipped (ctest
// registers every dispatch_test run with the skip code), before the minute its models take.
TEST_CASE("ISA under test", "[dispatch][isa]") {
  std::printf("dispatch_test: oneDNN ISA %s, activation layout %s\n", cpu::dnnl_isa_name(),
              layout_name(cpu::dnnl_blocked_layout(Precision::kFp32)));
  CHECK(std::string(cpu::dnnl_isa_name()) != "no SIMD");
  if (cap_repeats_native())
    trainer::testing::skip_test(std::string("ONEDNN_MAX_CPU_ISA=") + std::getenv("ONEDNN_MAX_CPU_ISA") +
                                " is not below this CPU's own ISA (oneDNN runs " + cpu::dnnl_isa_name() +
                                "): the kernels of the uncapped run");
}

TEST_CASE("Image models: no reference primitive", "[dispatch]") {
  // 128: the configs' batch on one rank; 32: its share on 4 ranks; 1: the smallest evaluation batch.
  // ResNet-32 and ResNet-56 are ResNet-20 with more blocks of the same layers at the same shapes
  // (build_resnet_cifar), so they make exactly ResNet-20's primitives: ResNet-20 checks them.
  for (const char* arch : {"resnet20", "resnet18", "vgg16"})
    for (int64_t batch : {1, 32, 128}) {
      INFO(arch << " batch " << batch);
      const size_t from = cpu::recorded_primitives().size();
      run_image_model(arch, batch);
      require_no_reference_since(from);
    }
}

TEST_CASE("DeepSpeech: no reference primitive", "[dispatch]") {
  // Batch 2: the paper's per-rank batch; 8 and 16: training and evaluation batches of the an4 configs.
  auto model = make_speech_model("deepspeech", cpu_backend(), 1);
  for (int64_t batch : {1, 2, 8, 16}) {
    INFO("batch " << batch);
    const size_t from = cpu::recorded_primitives().size();
    run_speech_model(*model, DeepSpeechOptions{}.feature_dim, batch, 120);
    require_no_reference_since(from);
  }
}

TEST_CASE("LAS: no reference primitive", "[dispatch]") {
  // The an4 size (27.5M parameters) and the quickstart's small one.
  LasOptions small;
  small.listener_hidden = 96;
  small.attention_dim = 96;
  small.embedding_dim = 32;
  small.speller_hidden = 192;
  small.speller_layers = 1;
  // One model per size, as for DeepSpeech: a primitive made at an earlier batch is reused, not made
  // (nor checked) twice.
  for (const LasOptions& options : {LasOptions{}, small}) {
    auto model = make_las(cpu_backend(), options, 1);
    for (int64_t batch : {1, 4, 8}) {
      INFO("listener " << options.listener_hidden << " batch " << batch);
      const size_t from = cpu::recorded_primitives().size();
      run_speech_model(*model, options.feature_dim, batch, 64);
      require_no_reference_since(from);
    }
  }
}

TEST_CASE("Models in bf16: no reference primitive, every convolution and Linear in bf16", "[bf16]") {
  // Run alone by ctest (dispatch_test_bf16_*): below AVX-512 there is no bf16 to dispatch.
  if (!cpu::dnnl_has_bf16())
    trainer::testing::skip_test(std::string("no bf16 at oneDNN's ISA ") + cpu::dnnl_isa_name());
  Backend& bf16 = cpu_backend({Precision::kBf16});
  std::printf("dispatch_test: bf16, oneDNN ISA %s, activation layout %s\n", cpu::dnnl_isa_name(),
              layout_name(cpu::dnnl_blocked_layout(Precision::kBf16)));
  int matmuls = 0;  // the GEMMs are made once per shape for the process, so counted over all models
  for (const char* arch : {"resnet20", "resnet18", "vgg16"})
    for (int64_t batch : {1, 32, 128}) {
      INFO(arch << " batch " << batch);
      const size_t from = cpu::recorded_primitives().size();
      run_image_model(arch, batch, bf16);
      require_no_reference_since(from);
      const auto records = cpu::recorded_primitives();
      int convs = 0;
      for (size_t i = from; i < records.size(); ++i) {
        const std::string& kind = records[i].kind;
        if (kind.rfind("conv", 0) == 0) {
          ++convs;
          CHECK_THAT(kind, Catch::EndsWith(" bf16"));
        }
        matmuls += kind.rfind("matmul bf16", 0) == 0;
      }
      CHECK(convs > 0);
    }
  CHECK(matmuls > 0);

  // The speech models train in bf16 too: their convolutions and Linear products in bf16, the LSTMs
  // (and LAS's attention products) in fp32.
  for (int64_t batch : {1, 8}) {
    INFO("deepspeech batch " << batch);
    auto model = make_speech_model("deepspeech", bf16, 1);
    const size_t from = cpu::recorded_primitives().size();
    run_speech_model(*model, DeepSpeechOptions{}.feature_dim, batch, 120);
    require_no_reference_since(from);
  }
  {
    INFO("las batch 4");
    auto model = make_las(bf16, LasOptions{}, 1);
    const size_t from = cpu::recorded_primitives().size();
    run_speech_model(*model, LasOptions{}.feature_dim, 4, 64);
    require_no_reference_since(from);
  }
}
