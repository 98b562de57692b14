#pragma once

#include <vector>

#include "comm/sync/methods/dense/bucket_reducer.h"
#include "comm/sync/wrappers/compressor_options.h"
#include "comm/sync/methods/dense/dense.h"
#include "comm/sync/wrappers/error_feedback_sync.h"
#include "comm/wire_format.h"
#include "models/backend.h"
#include "models/device_buffer.h"

namespace trainer::comm {

// sync.method = "powersgd"'s keys: the compressors' (compressor_options.h) and the factors' rank.
struct PowerSgdOptions : CompressorOptions {
  int64_t rank = 8;
  double min_compression_rate = 2.0;
  int64_t adaptive_rank = 4;  // under adaptive: the rank of critical regimes

  template <class Keys>
  static void declare(Keys& k) {
    k.key("rank", &PowerSgdOptions::rank,
          "rank r of the factors P (n x r) and Q (m x r) of each n x m matrix (capped at min(n, m)). The "
          "default, 8, is the one measured to hold accuracy: on the CIFAR ResNet-20 recipe at P = 4 (3 seeds) 0.2 "
          "points below dense (97.93 against 98.17%, 4.6x fewer bytes per step after the warmup), where rank 2 "
          "lost 5 points; on the LAS quickstart 0.7 CER points from dense against rank 2's 9.6 (BENCHMARKS.md). "
          "Under adaptive 1, paired with adaptive_rank 4.",
          closed(1, 1024));
    k.key("min_compression_rate", &PowerSgdOptions::min_compression_rate,
          "a tensor (viewed as shape[0] x the rest) is compressed when (n + m) r times this is below n m; the "
          "others (and 1-D tensors) are averaged densely in the same allreduce.",
          closed(0, 1e6));
    CompressorOptions::declare(k);
    k.key("adaptive_rank", &PowerSgdOptions::adaptive_rank,
          "under adaptive, the rank of critical regimes (above rank). The paper paired rank 4 with rank "
          "1 (VGG-19, SENet) and rank 2 with rank 1 (ResNet-18); 4 over rank 1 is the pair measured here.",
          closed(1, 1024));
  }
};

// PowerSGD (Vogels, Karimireddy & Jaggi, NeurIPS 2019), with the semantics of PyTorch's DDP
// powerSGD_hook (use_error_feedback and warm_start on), which runs per gradient bucket. Each
// parameter tensor is viewed as a matrix M of shape[0] x (the rest), n x m (a 1-D tensor as n x 1);
// with r' = min(n, m, rank) it is compressed when (n + m) r' * min_compression_rate < n m and it is
// not one the user kept dense (sync.powersgd.keep_dense, keep_dense.h). The others (biases and batch norm at
// any rate >= 1, tensors where rank-r' factors would not pay, the kept ones) are sent dense. The
// tensors are grouped into the dense method's buckets (gradient_buckets.h: backward order,
// sync.bucket_mb, the first sync.first_bucket_mb; a tensor is never cut), and each bucket is
// exchanged on its own, as soon as backward has written it when sync.overlap is on (BucketReducer):
//   1. acc = grad + e per compressed matrix, formed in the gradient buffer (e: ErrorFeedbackSync's
//      residual, laid out like the gradient, only read here)
//   2. P = acc Q (n x r'), Q the previous step's averaged Q (warm start), orthonormalized first
//   3. one ALLREDUCE_P (sum) of the bucket's P
//   4. orthonormalize each P's columns (low_rank.h: Gram-Schmidt; reorthogonalized for r' > 2)
//   5. Q = acc^T P (m x r')
//   6. one ALLREDUCE_Q of the bucket's Q followed by its dense tensors; both divided by P (the
//      world size)
// and once the step's verdict has come (no stop request, every gradient finite), for every bucket:
//   7. grads = P Q^T (the same on every rank), reported as sent_approximately: e = acc - P Q^T;
//      dense tensors get their average (never formed nor reported: their residual stays 0); the
//      new Q becomes the warm start.
// Steps 1-6 leave the residual and the warm-start Q as they were (the new Q is written beside the
// old one), so a step skipped after its buckets went out, for a NaN or a stop request, leaves no
// trace, with overlap or without; both paths run the same arithmetic in the same order, so they
// give the same bits. One bucket (bucket_mb <= 0) is the whole-gradient PowerSGD of the paper.
// Q starts, at the first compressed step, from seeded_uniform(seed, tensor index): the same on
// every rank without communication. Within a bucket, matrices of equal (n, m, r') are laid out back
// to back in the P and Q buffers (fixed strides); acc and the output sit where the gradient has
// them, so a device backend batches each group's products with per-matrix pointers (through
// Backend::gemm, one call per matrix today). On a GPU run the factors and the residual live on the
// device and every step above is a backend op (gemm, add, copy, subtract, orthonormalize_columns,
// batched per bucket) or a device allreduce; with sync.powersgd.adaptive (a host detector) it runs on host
// copies instead (registry.h: needs_host_buffers).
// Volume per rank and step: 4 (sum (n + m) r' + dense elements) bytes, each bucket's two
// allreduces sending its share once (ring traffic 2(P-1)/P of that).
// A 16-bit `wire` (comm/wire_format.h) sends both allreduces as bf16 or fp16, 2 bytes per element.
// Unlike PyTorch's fp16_compress_wrapper around the hook, which runs the whole hook (products
// included) on an fp16 bucket, the products and Gram-Schmidt stay fp32 here: only what crosses the
// wire is rounded. fp16 divides by the world size before its casts (P's scale does not matter: it
// is orthonormalized next; Q and the dense part then need no division afterwards); bf16 and fp32
// divide Q and the dense part after the sum.
// Deviations from the hook: dense tensors keep no residual (the hook keeps acc - mean(acc) for
// them, whose average over ranks is zero, so the outputs agree); a rank-deficient P gets zero
// columns instead of a division by zero (low_rank.h); QR is Gram-Schmidt twice (same Q up to
// column signs, which P Q^T does not see); Q's first values come from our seeded generator; the
// hook allreduces a bucket's dense tensors on their own, before P, where we append them to Q's
// allreduce (one message fewer per bucket).
// State (saved, per rank; format 3): the seed, whether compression has started, the compressed
// step count, then each compressed tensor's Q in model order (independent of the buckets); then
// the residual (ErrorFeedbackSync).
// sync.powersgd.adaptive (accordion.h): each compressed tensor is judged on its own and runs at
// sync.powersgd.adaptive_rank in critical regimes, sync.powersgd.rank elsewhere (the tensors compressed are those
// sync.powersgd.rank gives); at a switch its Q restarts from the seed at the new rank, its residual stays.
// The detector's state, saved first, gives each tensor's rank, and so the saved Q's sizes. Formats 1 and 2 (before buckets, whose sums differ) are refused
// with the version in the message.
class PowerSgd final : public ErrorFeedbackSync {
 public:
  // bucket_mb <= 0: the whole gradient is one bucket. `buckets`: the first bucket's size and
  // whether buckets go out during backward (the views are `views`). `keep_dense`: empty, or per view
  // whether it is sent dense whatever its shape (match_keep_dense).
  PowerSgd(Communicator& comm, const std::vector<models::ParamView>& views, int64_t n, int64_t rank,
           double min_compression_rate, uint64_t seed, models::Backend& backend, WireDType wire = WireDType::kF32,
           double bucket_mb = 0, const DenseBuckets& buckets = {}, const std::vector<bool>& keep_dense = {});
  std::string name() const override { return "powersgd"; }
  std::string describe() const override;
  std::string overlap_plan() const override;
  bool begin_step(SyncBuffers& b, int64_t step) override;
  void gradients_ready(int64_t from) override;
  int finish_early_sends() override;

  // One compressed tensor, and where its pieces live in the flat buffers.
  struct Matrix {
    int64_t view = 0;              // index into the model's views (the Q seed's stream)
    int64_t offset = 0;            // into the flat gradient
    int64_t rows = 0, cols = 0, rank = 0;
    int64_t p_offset = 0, q_offset = 0;  // into p_, q_
    int64_t e_offset = 0;                // into residual(): the gradient's layout, so equal to offset
  };
  // Elements [offset, offset + count) of the flat gradient.
  struct Range {
    int64_t offset = 0, count = 0;
  };
  // One bucket's share of the buffers: its matrices are matrices()[first_matrix, end_matrix),
  // sorted by shape; its P is p_[p_offset, + p_count); its Q is q_[q_offset, + q_count), followed
  // there by its dense tensors' elements (dense_count), so that one allreduce sends both.
  struct Bucket {
    size_t first_matrix = 0, end_matrix = 0;
    int64_t p_offset = 0, p_count = 0;
    int64_t q_offset = 0, q_count = 0, dense_count = 0;
    std::vector<Range> dense;  // adjacent tensors merged
  };
  const std::vector<Bucket>& buckets() const { return buckets_; }
  const std::vector<Matrix>& matrices() const { return matrices_; }
  // Floats sent per step: sum (n + m) r' over compressed matrices plus the dense elements.
  int64_t floats_per_step() const { return p_floats_ + q_floats_ + dense_floats_; }
  WireVolume wire_volume() const override {
    return {static_cast<double>(floats_per_step()), "sum(n+m)r + dense"};
  }
  int64_t dense_floats() const { return dense_floats_; }
  // This rank's residual (empty before the first compressed step), laid out like the gradient
  // (zeros on the dense tensors).
  const std::vector<float>& residual() const { return error_feedback().values(); }
  std::vector<const Matrix*> in_model_order() const;      // the saved order of the Q factors

 private:
  // sync.powersgd.adaptive: each compressed tensor at min(rows, cols, its setting's rank); the layout is
  // rebuilt and a tensor whose rank changed restarts from its seeded Q.
  void adapt(const std::vector<uint8_t>& low, bool fresh) override;
  SyncStats compress(SyncBuffers& b, int64_t step, ErrorFeedback::Step& ef) override;
  void save_state(std::ostream& out) const override;
  void load_state(std::istream& in) override;
  void lay_out(const std::vector<GradientBucket>& plan);  // matrices_ and buckets_ in bucket order
  void prepare();  // before a step's first bucket: the seeded Q at the first step, the residual
  void exchange(size_t bucket, float* grads);             // steps 1-6 of one bucket
  void commit(float* grads, ErrorFeedback::Step& ef);     // step 7 of every bucket
  void orthonormalize(float* base, size_t first, size_t end, bool p_factors);  // matrices [first, end)
  // q_ as host floats, and back (save, load, adapt; q_.size() floats).
  std::vector<float> q_on_host() const;
  void set_q(const std::vector<float>& q);

  Communicator& comm_;
  models::Backend& backend_;
  int64_t n_, rank_;
  uint64_t seed_;
  std::vector<Matrix> matrices_;  // by bucket, in each bucket by shape
  std::vector<Bucket> buckets_;
  int64_t p_floats_ = 0, q_floats_ = 0, dense_floats_ = 0;
  int64_t compressed_floats_ = 0;  // elements of the compressed matrices
  bool started_ = false;
  int64_t steps_ = 0;              // compressed steps done
  // In the backend's memory (a device's on a GPU run: the products, the orthonormalization and
  // error feedback are backend ops, and the allreduces move device memory).
  models::DeviceBuffer p_;         // all P
  models::DeviceBuffer q_;         // the warm start: every bucket's Q (and room for its dense part)
  models::DeviceBuffer q_next_;    // this step's Q and dense part, q_'s layout
  const float* residual_ = nullptr;  // this step's e (read only until the commit)
  WireDType wire_;
  bool requested_overlap_, overlap_;
  int64_t early_step_ = -1;        // the step whose buckets went out during backward
  int64_t exchanged_step_ = -1;    // the step whose buckets have all been exchanged
  // A 16-bit wire's copy of P or Q (grow-only); one bucket at a time, on one thread at a time.
  std::vector<uint16_t> wire_scratch_;
  std::vector<models::TallMatrix> batch_;  // one bucket's factors for orthonormalize_columns
  BucketReducer reducer_;          // last: its job reads the members above
};

}  // namespace trainer::comm
