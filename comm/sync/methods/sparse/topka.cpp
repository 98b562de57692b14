#include "comm/sync/methods/sparse/topka.h"

#include <istream>
#include <sstream>
#include <stdexcept>

#include "comm/sync/wrappers/compressor_options.h"
#include "comm/sync/wrappers/keep_dense.h"
#include "comm/sync/sync_state.h"

namespace trainer::comm {

SyncMethod topka_method() {
  return sparse_method("topka", "local top-k, allgather",
                       [](const SyncOptions& o, Communicator& comm, int64_t count, models::Backend& backend) {
                         return std::make_unique<TopkA>(comm, count, options_of<SparseOptions>(o).density, backend);
                       });
}

TopkA::TopkA(Communicator& comm, int64_t n, double density, models::Backend& backend)
    : ErrorFeedbackSync(n, &backend),
      comm_(comm),
      n_(n),
      k_(top_k_count(density, n)),
      passes_(make_sparse_passes(backend, n)) {}

std::string TopkA::describe() const {
  const int p = comm_.size();
  std::ostringstream out;
  out << "topka: exact local top-k (k = " << k_ << " of " << n_ << "), 2 ALLGATHER_TOPK of k words (indices, "
      << "values), local sum; per rank " << 2 * k_ * 4 / 1e6 << " MB sent, " << 2.0 * k_ * (p - 1) * 4 / 1e6
      << " MB received at P = " << p << "; error feedback";
  out << adaptive_note("density") << dgc_note();
  return out.str();
}

SyncStats TopkA::compress(SyncBuffers& b, int64_t step, ErrorFeedback::Step& ef) {
  comm_.log().set_step(step, Phase::kCompressed);
  const int p = comm_.size();
  passes_->begin(b.grads, ef);
  passes_->select_top_k(k_, /*exactly_k=*/true, local_);
  all_index_.resize(p * k_);
  all_value_.resize(p * k_);
  comm_.allgather(local_.index(), k_, all_index_.data(), DType::kI32, "ALLGATHER_TOPK");
  comm_.allgather(local_.value(), k_, all_value_.data(), DType::kF32, "ALLGATHER_TOPK");
  lists_.clear();
  for (int r = 0; r < p; ++r) lists_.push_back({all_index_.data() + r * k_, all_value_.data() + r * k_, k_});
  merge_sum_all(lists_, merged_, tmp_);
  lists_.assign(1, {merged_.index(), merged_.value(), merged_.size()});
  passes_->write_output(lists_, static_cast<float>(p), nullptr);
  passes_->sent(local_.index(), local_.size());
  ++steps_;
  return {Phase::kCompressed, static_cast<double>(k_) / n_};
}

void TopkA::adapt(const std::vector<uint8_t>& low, bool ) {
  k_ = top_k_count(adaptive_setting(low.at(0) != 0), n_);
}

void TopkA::save_state(std::ostream& out) const {
  write_sync_header(out, "topka", 1);
  write_pod(out, steps_);
}

void TopkA::load_state(std::istream& in) {
  read_sync_header(in, "topka", 1);
  const auto steps = read_pod<int64_t>(in);
  if (!in) throw std::runtime_error("topka state: truncated");
  steps_ = steps;
}

WireVolume TopkA::wire_volume() const {
  const int p = comm_.size();
  return {2.0 * static_cast<double>(k_) * (p - 1), "2k(P-1)"};
}

}  // namespace trainer::comm
