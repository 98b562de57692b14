#include "models/cpu/dnnl_dispatch.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "models/cpu/dnnl_context.h"

namespace trainer::models::cpu {
namespace {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

std::mutex g_mutex;
std::vector<PrimitiveRecord> g_records;

// Asks oneDNN which source layout its forward convolution wants for a typical 3x3, 64-channel
// layer of a CIFAR network (the shape does not matter much: the block is the ISA's vector width).
// Under runtime.precision = bf16 the convolution asked is a bf16 one with an fp32 output (what
// dnnl_ops.cpp makes): with AMX its fastest kernels want channels-last.
Layout probe_blocked_layout(Precision precision) {
  const memory::dims src{32, 64, 16, 16}, w{64, 64, 3, 3}, one{1, 1};
  const dt compute = precision == Precision::kBf16 ? dt::bf16 : dt::f32;
  const memory::desc any_src(src, compute, tag::any), any_w(w, compute, tag::any), any_dst(src, dt::f32, tag::any);
  const dnnl::convolution_forward::primitive_desc pd(dnnl_engine(), dnnl::prop_kind::forward_training,
                                                     dnnl::algorithm::convolution_direct, any_src, any_w, any_dst,
                                                     one, one, one);
  for (Layout layout : {Layout::kBlocked16, Layout::kBlocked8})
    if (pd.src_desc() == memory::desc(src, compute, layout == Layout::kBlocked16 ? tag::nChw16c : tag::nChw8c))
      return layout;
  return Layout::kChannelsLast;
}

}  // namespace

const char* dnnl_isa_name() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx2_vnni_2: return "avx2_vnni_2";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_fp16: return "avx512_core_fp16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    case dnnl::cpu_isa::avx512_core_amx_fp16: return "avx512_core_amx_fp16";
    default: return "no SIMD";
  }
}

// TRAINER_ACTIVATION_LAYOUT=nhwc|nChw8c|nChw16c overrides the probe, for measuring the layouts
// against each other (BENCHMARKS.md); a layout the CPU's kernels do not take falls to the
// convolutions' other candidates or, for batch norm and pooling, to reference kernels (warned).
Layout chosen_blocked_layout(Precision precision) {
  if (const char* env = std::getenv("TRAINER_ACTIVATION_LAYOUT"))
    for (Layout layout : {Layout::kChannelsLast, Layout::kBlocked8, Layout::kBlocked16})
      if (std::string(env) == layout_name(layout)) return layout;
  return probe_blocked_layout(precision);
}

Layout dnnl_blocked_layout(Precision precision) {
  // Asked once per precision, and only for one in use (a CPU below AVX-512 has no bf16
  // convolution to ask): the answer depends only on the CPU and the environment.
  if (precision == Precision::kBf16) {
    static const Layout bf16 = chosen_blocked_layout(Precision::kBf16);
    return bf16;
  }
  static const Layout fp32 = chosen_blocked_layout(Precision::kFp32);
  return fp32;
}

Layout dnnl_activation_layout(int64_t channels, Precision precision) {
  const Layout blocked = dnnl_blocked_layout(precision);
  const int64_t block = channel_block(blocked);
  return block > 0 && channels % block == 0 ? blocked : Layout::kChannelsLast;
}

bool is_reference_impl(const std::string& impl) {
  return impl.rfind("ref", 0) == 0 || impl.find("_ref") != std::string::npos;
}

const char* reference_allowed(const PrimitiveRecord& record) {
  // oneDNN 2.6 names its f32 RNN driver (ref_rnn_common_t) "ref" at every ISA: the driver only
  // sequences the cells, whose GEMMs run on oneDNN's JIT sgemm for the ISA it found. Measured
  // (BENCHMARKS.md, issue 17): DeepSpeech and LAS steps are 1.0-1.4x faster with it than with our
  // own GEMM LSTM (lstm_gemm.cpp) at both AVX2 and AVX-512.
  if (record.kind.rfind("lstm", 0) == 0 && record.impl == "ref")
    return "oneDNN's f32 RNN driver is called ref; its cell GEMMs are JIT";
  return nullptr;
}

void record_primitive(const std::string& kind, const std::string& shape, const std::string& impl) {
  static const bool verbose = std::getenv("TRAINER_DNNL_VERBOSE") != nullptr;
  std::lock_guard<std::mutex> lock(g_mutex);
  bool seen = false;
  for (const auto& r : g_records) seen = seen || (r.kind == kind && r.shape == shape && r.impl == impl);
  g_records.push_back({kind, shape, impl});
  if (seen) return;  // printed already
  if (verbose) std::fprintf(stderr, "dnnl: %-10s %s: %s\n", kind.c_str(), shape.c_str(), impl.c_str());
  if (is_reference_impl(impl) && !reference_allowed(g_records.back()))
    std::fprintf(stderr,
                 "warning: oneDNN runs %s (%s) with its reference implementation %s at ISA %s: such a "
                 "primitive is 100-1000x slower than a JIT kernel (tests/dispatch_test.cpp lists them)\n",
                 kind.c_str(), shape.c_str(), impl.c_str(), dnnl_isa_name());
}

std::vector<PrimitiveRecord> recorded_primitives() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_records;
}

}  // namespace trainer::models::cpu
