#pragma once

#include "comm/sync/wrappers/error_feedback_sync.h"
#include "comm/sync/methods/sparse/select.h"
#include "comm/sync/methods/sparse/sparse_passes.h"

namespace trainer::comm {

// gTop-k (Shi et al. 2019), a baseline of the Ok-Top-k paper: a tree of log2(P) rounds. Every rank
// selects exactly k entries of acc = grad + residual (exactly-k rule of select.h). In round
// d = 1, 2, 4, ... the rank r with r % 2d == d sends its current k entries to r - d and drops out;
// r - d adds them to its own (union of indices, receiver's value + sender's value where both have
// one) and keeps exactly k again (largest magnitudes, ties by lower index). After the last round
// rank 0 holds the global k entries and broadcasts them; grads = value / P at those indices on
// every rank.
//
// Error feedback, exactly: an entry dropped by a reselection on the way up loses the values summed
// into it, even when the same index comes back from another subtree. So every entry carries a
// bitmask of the ranks whose values are in its sum (one word per entry up to P = 32, one more per
// further 32 ranks), and a rank clears from its residual only the entries whose final mask has its
// bit: what really reached the output. (The reference implementation clears every local entry
// whose index is in the final set, which drops those values; the masks cost k words per message.)
//
// Comm log tags: SENDRECV_GTOPK (the round messages, one per pair and round: k indices, k value
// bits, k mask words; the send and the receive are separate records with the peer set) and
// BROADCAST_GTOPK (the final message from rank 0). Per rank and step: one message of (2 + W)k words
// sent in the rounds (rank 0 none) plus the broadcast, W = ceil(P / 32).
// P must be a power of two; construction throws std::invalid_argument otherwise.
class GTopk final : public ErrorFeedbackSync {
 public:
  // `backend`: where the gradient and the residual live (sparse_passes.h); `comm` moves host memory.
  GTopk(Communicator& comm, int64_t n, double density, models::Backend& backend);
  std::string name() const override { return "gtopk"; }
  std::string describe() const override;

  int64_t k() const { return k_; }
  WireVolume wire_volume() const override;

 private:
  SyncStats compress(SyncBuffers& b, int64_t step, ErrorFeedback::Step& ef) override;
  void save_state(std::ostream& out) const override;
  void load_state(std::istream& in) override;
  // sync.<method>.adaptive: k from sync.<method>.adaptive_density or sync.<method>.density (one group: the whole gradient).
  void adapt(const std::vector<uint8_t>& low, bool fresh) override;
  void pack(int32_t* message) const;
  void merge_received(const int32_t* message);

  Communicator& comm_;
  int64_t n_, k_;
  int words_;  // mask words per entry
  int64_t steps_ = 0;
  SparseList local_, current_, merged_;
  std::vector<uint32_t> mask_, merged_mask_;  // words_ per entry of current_ / merged_
  SelectScratch scratch_;
  std::unique_ptr<SparsePasses> passes_;
  std::vector<ListRef> runs_;
  std::vector<int32_t> contributed_;
  std::vector<int32_t> message_;  // k indices, k value bits, k * words_ mask words
};

}  // namespace trainer::comm
