#pragma once

#include "comm/sync/wrappers/error_feedback_sync.h"
#include "comm/sync/methods/sparse/select.h"
#include "comm/sync/methods/sparse/sparse_passes.h"

namespace trainer::comm {

// TopkA, the baseline sparse allreduce of the Ok-Top-k paper: every rank selects exactly k entries
// of acc = grad + residual (the exactly-k rule of select.h: largest magnitudes, ties by lower
// index), allgathers their indices and then their values (two ALLGATHER_TOPK calls of k words), and
// sums all P lists locally in rank order; grads = sum / P on every rank. Everything selected is
// contributed, so the residual keeps acc minus the selected entries.
// Per rank and step: sends 2k words (its block of each allgather) and receives 2k(P-1) words,
// the method's volume 2k(P-1) in docs/architecture.md section 4 (what a ring allgather forwards).
class TopkA final : public ErrorFeedbackSync {
 public:
  // `backend`: where the gradient and the residual live (sparse_passes.h); `comm` moves host memory.
  TopkA(Communicator& comm, int64_t n, double density, models::Backend& backend);
  std::string name() const override { return "topka"; }
  std::string describe() const override;

  int64_t k() const { return k_; }
  WireVolume wire_volume() const override;

 private:
  SyncStats compress(SyncBuffers& b, int64_t step, ErrorFeedback::Step& ef) override;
  void save_state(std::ostream& out) const override;
  void load_state(std::istream& in) override;
  // sync.<method>.adaptive: k from sync.<method>.adaptive_density or sync.<method>.density (one group: the whole gradient).
  void adapt(const std::vector<uint8_t>& low, bool fresh) override;

  Communicator& comm_;
  int64_t n_, k_;
  int64_t steps_ = 0;  // compressed steps done
  std::unique_ptr<SparsePasses> passes_;
  SparseList local_, merged_, tmp_;
  std::vector<int32_t> all_index_;  // P blocks of k
  std::vector<float> all_value_;
  std::vector<ListRef> lists_;
};

}  // namespace trainer::comm
