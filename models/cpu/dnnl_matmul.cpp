#include "models/cpu/dnnl_matmul.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>

#include "models/bf16.h"
#include "models/cpu/dnnl_context.h"
#include "models/cpu/dnnl_dispatch.h"
#include "models/cpu/dnnl_staged.h"

namespace trainer::models::cpu {
namespace {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

// Counts bf16_weights_changed(): a kept weight copy is current while its count is this one.
std::atomic<uint64_t> weight_values{1};

// The row-major m x n matrix at leading dimension ld, read transposed when `trans` (its storage
// is then n x m).
memory::desc f32_matrix(int64_t rows, int64_t cols, int64_t ld, bool trans) {
  return memory::desc({rows, cols}, dt::f32, trans ? memory::dims{1, ld} : memory::dims{ld, 1});
}

class Bf16Gemm {
 public:
  Bf16Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, int64_t lda, int64_t ldb,
           float beta, int64_t ldc) {
    // Post-ops in fp32, in this order: alpha scales the product (a linear eltwise), then beta adds
    // the old C (a sum). (The layers all pass alpha = 1.)
    dnnl::primitive_attr attr = dnnl_scratchpad_attr();
    dnnl::post_ops ops;
    if (alpha != 1.f) ops.append_eltwise(dnnl::algorithm::eltwise_linear, alpha, 0.f);
    if (beta != 0.f) ops.append_sum(beta);
    attr.set_post_ops(ops);
    c_md_ = f32_matrix(m, n, ldc, false);
    pd_ = dnnl::matmul::primitive_desc(dnnl_engine(), memory::desc({m, k}, dt::bf16, tag::any),
                                       memory::desc({k, n}, dt::bf16, tag::any), c_md_, attr);
    matmul_ = dnnl::matmul(pd_);
    a_.prepare(f32_matrix(m, k, lda, trans_a), pd_.src_desc());
    // A few rows (an LSTM's or the speller's batch at one time step) are rounded here, in one
    // thread: a reorder primitive's parallel region costs more than the copy (tens of microseconds
    // for 8 x 384, at every one of a LAS step's thousand per-step products).
    if (m * k <= kSmallA && pd_.src_desc() == memory::desc({m, k}, dt::bf16, tag::ab)) {
      small_a_.resize(m * k / 2 + 1);
      a_small_ = memory(pd_.src_desc(), dnnl_engine(), small_a_.data());
      m_ = m, k_ = k, lda_ = lda, trans_a_ = trans_a;
    }
    b_.prepare(f32_matrix(k, n, ldb, trans_b), pd_.weights_desc());
    record_primitive("matmul bf16", "m" + std::to_string(m) + " n" + std::to_string(n) + " k" + std::to_string(k),
                     pd_.impl_info_str());
  }

  // keep_b: B is a weight whose copy stays current until bf16_weights_changed() (one Bf16Gemm per
  // weight then: the cache's key holds B's address).
  void run(const float* a, const float* b, float* c, bool keep_b) {
    const uint64_t values = weight_values.load();
    if (!keep_b || b_values_ != values) {
      b_mem_ = b_.in(b);
      b_values_ = keep_b ? values : 0;
    }
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, a_small_ ? round_small_a(a) : a_.in(a)},
                                         {DNNL_ARG_WEIGHTS, b_mem_},
                                         {DNNL_ARG_DST, memory(c_md_, dnnl_engine(), c)},
                                         {DNNL_ARG_SCRATCHPAD, dnnl_scratchpad(pd_.scratchpad_desc())}};
    matmul_.execute(dnnl_stream(), args);
    dnnl_stream().wait();
  }

 private:
  static constexpr int64_t kSmallA = 1 << 15;

  // A as bf16, row-major, rounded to nearest even as oneDNN's reorder rounds.
  memory round_small_a(const float* a) {
    uint16_t* out = reinterpret_cast<uint16_t*>(small_a_.data());
    for (int64_t i = 0; i < m_; ++i)
      for (int64_t j = 0; j < k_; ++j) out[i * k_ + j] = round_to_bf16(trans_a_ ? a[j * lda_ + i] : a[i * lda_ + j]);
    return a_small_;
  }

  memory::desc c_md_;
  dnnl::matmul::primitive_desc pd_;
  dnnl::matmul matmul_;
  Staged a_, b_;  // the bf16 copies of A and B (the reorders round to nearest even)
  HostBuffer small_a_;  // A's bf16 copy when it is small (round_small_a)
  memory a_small_;
  int64_t m_ = 0, k_ = 0, lda_ = 0;
  bool trans_a_ = false;
  memory b_mem_;           // B as the matmul reads it
  uint64_t b_values_ = 0;  // the weight_values b_mem_ was copied at (0: not kept)
};

}  // namespace

void bf16_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc, bool keep_b) {
  using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, float, int64_t, int64_t, float, int64_t, const float*>;
  static std::map<Key, std::unique_ptr<Bf16Gemm>> cache;
  static std::mutex mutex;  // ops run one at a time; the lock only guards the cache
  // Speech batches change their lengths, and with them LAS's GEMM shapes, from step to step: past
  // this many shapes the cache starts again, so that its memory stays bounded (a step uses a few
  // dozen shapes; a miss costs one primitive creation and, for a kept weight, one copy).
  constexpr size_t kMaxShapes = 256;
  Bf16Gemm* gemm;
  {
    std::lock_guard<std::mutex> lock(mutex);
    const Key key{trans_a, trans_b, m, n, k, alpha, lda, ldb, beta, ldc, keep_b ? b : nullptr};
    if (cache.size() >= kMaxShapes && cache.find(key) == cache.end()) cache.clear();
    auto& slot = cache[key];
    if (!slot) slot = std::make_unique<Bf16Gemm>(trans_a, trans_b, m, n, k, alpha, lda, ldb, beta, ldc);
    gemm = slot.get();
  }
  gemm->run(a, b, c, keep_b);
}

void bf16_weights_changed() { ++weight_values; }

}  // namespace trainer::models::cpu
