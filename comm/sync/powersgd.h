#pragma once

#include <vector>

#include "comm/sync/error_feedback_sync.h"
#include "comm/wire_format.h"
#include "models/backend.h"

namespace trainer::comm {

// PowerSGD (Vogels, Karimireddy & Jaggi, NeurIPS 2019), with the semantics of PyTorch's DDP
// powerSGD_hook (use_error_feedback and warm_start on). Each parameter tensor is viewed as a matrix
// M of shape[0] x (the rest), n x m (a 1-D tensor as n x 1); with r' = min(n, m, rank) it is
// compressed when (n + m) r' * min_compression_rate < n m. The others (biases and batch norm at any
// rate >= 1, tensors where rank-r' factors would not pay) form one dense buffer. One compressed step
// on every rank:
//   1. acc = grad + e per compressed matrix (ErrorFeedback::Step::materialize: e is
//      ErrorFeedbackSync's residual, laid out like the gradient, acc formed in place)
//   2. P = acc Q (n x r'), Q the previous step's averaged Q (warm start), orthonormalized first
//   3. one ALLREDUCE_P (sum) of every P
//   4. orthonormalize each P's columns (low_rank.h: Gram-Schmidt; reorthogonalized for r' > 2)
//   5. Q = acc^T P (m x r')
//   6. one ALLREDUCE_Q of every Q followed by the dense buffer; both divided by P (the world size)
//   7. grads = P Q^T (the same on every rank), reported as sent_approximately: e = acc - P Q^T;
//      dense tensors get their average (never formed nor reported: their residual stays 0)
// Q starts, at the first compressed step, from seeded_uniform(seed, tensor index): the same on
// every rank without communication. Matrices of equal (n, m, r') are laid out back to back in the
// P and Q buffers (fixed strides); acc and the output sit where the gradient has them, so a
// device backend batches each group's products with per-matrix pointers (through Backend::gemm,
// one call per matrix, on the CPU today).
// Volume per rank and step: 4 (sum (n + m) r' + dense elements) bytes, each of the two allreduces
// sending its buffer once (ring traffic 2(P-1)/P of that).
// A 16-bit `wire` (comm/wire_format.h) sends both allreduces as bf16 or fp16, 2 bytes per element.
// Unlike PyTorch's fp16_compress_wrapper around the hook, which runs the whole hook (products
// included) on an fp16 bucket, the products and Gram-Schmidt stay fp32 here: only what crosses the
// wire is rounded. fp16 divides by the world size before its casts (P's scale does not matter: it
// is orthonormalized next; Q and the dense part then need no division afterwards); bf16 and fp32
// divide Q and the dense part after the sum.
// Deviations from the hook: dense tensors keep no residual (the hook keeps acc - mean(acc) for
// them, whose average over ranks is zero, so the outputs agree); a rank-deficient P gets zero
// columns instead of a division by zero (low_rank.h); QR is Gram-Schmidt twice (same Q up to
// column signs, which P Q^T does not see); Q's first values come from our seeded generator.
// State (saved, per rank; format 2): Q, the seed, whether compression has started, the compressed
// step count; then the residual (ErrorFeedbackSync). Format 1 (the residual of the compressed
// matrices only, inside this state) is refused with the version in the message.
class PowerSgd final : public ErrorFeedbackSync {
 public:
  PowerSgd(Communicator& comm, const std::vector<models::ParamView>& views, int64_t n, int64_t rank,
           double min_compression_rate, uint64_t seed, models::Backend& backend, WireDType wire = WireDType::kF32);
  std::string name() const override { return "powersgd"; }
  std::string describe() const override;

  // One compressed tensor, and where its pieces live in the flat buffers.
  struct Matrix {
    int64_t view = 0;              // index into the model's views (the Q seed's stream)
    int64_t offset = 0;            // into the flat gradient
    int64_t rows = 0, cols = 0, rank = 0;
    int64_t p_offset = 0, q_offset = 0;  // into p_, q_
    int64_t e_offset = 0;                // into residual(): the gradient's layout, so equal to offset
  };
  // Consecutive matrices of one shape: strides rows*rank (P), cols*rank (Q).
  struct Range {
    int64_t offset = 0, count = 0;
  };
  const std::vector<Matrix>& matrices() const { return matrices_; }
  // Floats sent per step: sum (n + m) r' over compressed matrices plus the dense elements.
  int64_t floats_per_step() const { return p_floats_ + q_floats_ + dense_floats_; }
  int64_t dense_floats() const { return dense_floats_; }
  // This rank's residual (empty before the first compressed step), laid out like the gradient
  // (zeros on the dense tensors).
  const std::vector<float>& residual() const { return error_feedback().values(); }

 private:
  SyncStats compress(SyncBuffers& b, int64_t step, ErrorFeedback::Step& ef) override;
  void save_state(std::ostream& out) const override;
  void load_state(std::istream& in) override;
  void start();  // first compressed step: zero residuals, seeded orthonormal Q

  Communicator& comm_;
  models::Backend& backend_;
  int64_t n_, rank_;
  uint64_t seed_;
  // Sorted by shape, so each run of equal shapes has equal strides in P and Q.
  std::vector<Matrix> matrices_;
  std::vector<Range> dense_;       // the uncompressed tensors, adjacent ones merged
  int64_t p_floats_ = 0, q_floats_ = 0, dense_floats_ = 0;
  int64_t compressed_floats_ = 0;  // elements of the compressed matrices
  bool started_ = false;
  int64_t steps_ = 0;              // compressed steps done
  std::vector<float> p_;           // all P
  std::vector<float> q_;           // all Q, then the dense elements (one ALLREDUCE_Q)
  WireDType wire_;
  std::vector<uint16_t> wire_scratch_;  // the 16-bit copy of P, then of Q (grow-only)
};

}  // namespace trainer::comm
