#pragma once

#include "comm/sync/wrappers/compressor_options.h"
#include "comm/sync/wrappers/error_feedback_sync.h"
#include "comm/sync/methods/sparse/select.h"
#include "comm/sync/methods/sparse/sparse_passes.h"

namespace trainer::comm {

// sync.method = "oktopk"'s keys: the sparse methods' (compressor_options.h) and its schedule's.
struct OkTopkOptions : SparseOptions {
  int64_t local_threshold_every = 32;
  int64_t global_threshold_every = 32;
  int64_t region_every = 64;
  int64_t max_in_flight = 4;
  bool balance = true;

  template <class Keys>
  static void declare(Keys& k) {
    SparseOptions::declare(k);
    k.key("local_threshold_every", &OkTopkOptions::local_threshold_every,
          "recompute the local threshold exactly (k-th largest magnitude) every N compressed steps; in between it "
          "is reused and nudged by the selected count.",
          at_least(1));
    k.key("global_threshold_every", &OkTopkOptions::global_threshold_every,
          "recompute the global threshold exactly every N compressed steps; reused and nudged in between.",
          at_least(1));
    k.key("region_every", &OkTopkOptions::region_every,
          "recompute the region bounds (balanced by selected counts) every N compressed steps.", at_least(1));
    k.key("max_in_flight", &OkTopkOptions::max_in_flight,
          "peers with split-and-reduce messages in flight at once.", closed(1, 1 << 20));
    k.key("balance", &OkTopkOptions::balance,
          "even out the globally selected entries across processes before the final allgatherv.");
  }
};

// Ok-Top-k (Li & Hoefler, PPoPP 2022, "Near-Optimal Sparse Allreduce"), docs/architecture.md section 4. With
// k = ceil(density * n), one compressed step on every rank:
//   1. local selection: acc = grad + residual (into the residual, in the selection pass); keep
//      |acc| >= t_local. t_local is the exact k-th largest |acc| every local_threshold_every steps
//      and the previous step's, nudged by its count (select.h's nudge_threshold), in between; on
//      such a reuse step, while more than 3k/2 entries pass, t is raised by 3% (at most 5 times,
//      as the reference implementation does; counted over the collected entries, no extra pass).
//   2. regions: [0, n) is cut into P contiguous regions holding about the same number of selected
//      entries; recomputed every region_every steps (and at the first compressed step): each rank
//      proposes the P - 1 indices that cut its own sorted selection into P equal parts, one
//      ALLREDUCE_REGION sums the proposals, the bounds are their floor average.
//   3. split and reduce: the counts per region go out by ALLTOALL_COUNTS; then rank r sends the
//      (region-local int32 index, float value) pairs of region j to rank j: ISEND_INDEX and
//      ISEND_VALUE to dst = (r + i) mod P, IRECV_INDEX and IRECV_VALUE from src = (r - i) mod P,
//      for i = 1 .. P-1, in batches of max_in_flight peers; empty messages are not sent. Rank j
//      sums what arrived (and its own part) in rank order into its region.
//   4. global selection: in its region each rank keeps |v| >= t_global. t_global is the exact k-th
//      largest |v| over all regions every global_threshold_every steps, found by a distributed
//      radix select on the float bits: four ALLREDUCE_THRESHOLD calls, each summing a 256-bin
//      histogram (1 KB) of the next 8 bits of the magnitudes still in play; in between it is the
//      previous step's, nudged by the previous global count. The counts at t and at t raised by
//      3% up to 5 times go out in one ALLGATHER_COUNTS (6 words per rank); every rank takes the
//      lowest candidate that lets at most 3k/2 entries through in total (the local guard's rule,
//      which the reference has for the local threshold only), so a reused threshold cannot let the
//      final allgatherv grow far past k.
//   5. balance and allgatherv: ALLGATHER_COUNTS (step 4) told every rank every region's count
//      C_j; with balance on, the selection (in global index order) is redistributed
//      so rank j holds C/P (+1) entries: the moves are point-to-point messages with the same tags
//      as step 3 (ISEND_INDEX/ISEND_VALUE/IRECV_INDEX/IRECV_VALUE, on their own channels), usually
//      a few small pieces between neighbours. ALLGATHERV_FINAL then gathers every block of
//      (global int32 index, float value) and every rank writes grads = value / P at those indices
//      (zeros elsewhere), bitwise the same on all ranks.
//   6. residual: acc, except the entries this rank selected locally AND that were selected
//      globally, which are zeroed (what this rank contributed to the output); found in the pass
//      that writes the output (flags of local_ AND the output, reported as sent_flags) and applied,
//      as error_feedback.h defers clears, by the next selection pass.
// Selection rules (select.h): |x| >= t keeps ties, zeros are never selected; when fewer than k
// nonzero sums exist, all are kept. With both thresholds exact every step the output is exactly
// the k largest |sums| of the locally selected entries (sums in rank order), divided by P.
// Volume per rank and step: about 2k(P-1)/P words in step 3, at most that again to balance, and
// 2k/P words of its own allgatherv block (receiving 2k(P-1)/P): within the 6k(P-1)/P bound.
// State (saved): both thresholds, the region bounds and the step counter; the residual is
// ErrorFeedbackSync's (step 1 forms acc with its fused source, step 6 reports the clears). On
// another number of ranks (merge_state): t_local the mean of the saved ranks', t_global and the
// counter kept, and the bounds recomputed at the next compressed step (a flag not saved: that step
// comes before the next checkpoint can be written).
// sync.oktopk.adaptive (accordion.h): the whole gradient is one group; a switch of density changes k, and
// the step after it takes both thresholds exactly and recomputes the regions.
class OkTopk final : public ErrorFeedbackSync {
 public:
  // `backend`: where the gradient and the residual live (sparse_passes.h); `comm` moves host memory.
  OkTopk(Communicator& comm, int64_t n, const OkTopkOptions& options, models::Backend& backend);
  std::string name() const override { return "oktopk"; }
  std::string describe() const override;

  int64_t k() const { return k_; }
  WireVolume wire_volume() const override;
  float local_threshold() const { return t_local_; }
  float global_threshold() const { return t_global_; }
  const std::vector<int64_t>& region_bounds() const { return bounds_; }
  // The last step's local selection on this rank and global selection over all ranks.
  int64_t local_count() const { return local_.size(); }
  int64_t global_count() const { return global_total_; }

 private:
  SyncStats compress(SyncBuffers& b, int64_t step, ErrorFeedback::Step& ef) override;
  void save_state(std::ostream& out) const override;
  void load_state(std::istream& in) override;
  // sync.oktopk.adaptive: k from sync.oktopk.adaptive_density or sync.oktopk.density (one group: the whole gradient).
  void adapt(const std::vector<uint8_t>& low, bool fresh) override;
  std::string merge_state(const std::vector<std::istream*>& saved) override;
  void reuse_local_threshold();
  void repartition();
  void split_and_reduce();
  float exact_global_threshold();
  void select_global(bool exact);
  void gather_output();

  Communicator& comm_;
  int64_t n_, k_;
  int p_, rank_;
  int64_t local_every_, global_every_, region_every_, max_in_flight_;
  bool balance_;

  // State.
  int64_t iteration_ = 0;  // compressed steps done
  float t_local_ = 0.f, t_global_ = 0.f;
  std::vector<int64_t> bounds_;  // P + 1 region starts; bounds_[P] = n
  bool repartition_due_ = false;  // after an elastic resume: the bounds are not from this run's selections
  // sync.oktopk.adaptive switched k since the last step: both thresholds exact and the regions recomputed
  // at the next (not saved: the detector's state says so, accordion.h)
  bool exact_due_ = false;

  // Per-step buffers, reused (they only grow).
  std::unique_ptr<SparsePasses> passes_;
  std::vector<int64_t> proposal_;      // region bounds this rank proposes
  SparseList local_;                   // this rank's selection: global indices, sorted
  std::vector<int64_t> region_begin_;  // P + 1 positions in local_ where each region starts
  std::vector<int32_t> send_index_;    // local_'s indices made region-local
  std::vector<int32_t> send_counts_, recv_counts_;
  std::vector<int64_t> recv_offsets_;
  std::vector<int32_t> recv_index_;
  std::vector<float> recv_value_;
  std::vector<ListRef> lists_;
  SparseList reduced_, merge_tmp_;  // this rank's region sums (region-local indices)
  SparseList global_;               // this rank's global selection (global indices)
  std::vector<uint32_t> keys_;      // magnitudes' bits in the radix select
  std::vector<int32_t> histogram_;
  std::vector<int32_t> all_counts_;  // per rank: counts at the guard's candidate thresholds
  std::vector<int32_t> counts_;      // global selection per rank
  std::vector<int64_t> blocks_, block_offsets_, gather_counts_;
  std::vector<int32_t> final_;  // per rank: [indices][value bits]
  std::vector<Request> requests_;
  int64_t contributed_ = 0;
  int64_t global_total_ = 0;
};

}  // namespace trainer::comm
