#include "comm/sync/methods/sparse/oktopk.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <istream>
#include <sstream>
#include <stdexcept>

#include "comm/sync/wrappers/keep_dense.h"
#include "comm/sync/sync_state.h"

namespace trainer::comm {

SyncMethod oktopk_method() {
  SyncMethod m = sparse_method("oktopk", "Ok-Top-k sparse allreduce",
                               [](const SyncOptions& o, Communicator& comm, int64_t count, models::Backend& backend) {
                                 return std::make_unique<OkTopk>(comm, count, options_of<OkTopkOptions>(o), backend);
                               });
  m.can.fixed_gather_total = true;
  declare_options<OkTopkOptions>(m);
  return m;
}
namespace {

// Point-to-point channels: split and reduce, and the balance moves, each index and value.
constexpr int kIndexChannel = 1, kValueChannel = 2, kBalanceIndexChannel = 3, kBalanceValueChannel = 4;
// Raises of 3% the guards may apply in one step (local and global), as the reference's guard.
constexpr int kGuardSteps = 5;

uint32_t magnitude_bits(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits & 0x7fffffffu;  // |v|: for non-negative floats, bit order is numeric order
}

float from_bits(uint32_t bits) {
  float v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

}  // namespace

OkTopk::OkTopk(Communicator& comm, int64_t n, const OkTopkOptions& o, models::Backend& backend)
    : ErrorFeedbackSync(n, &backend),
      comm_(comm),
      n_(n),
      k_(top_k_count(o.density, n)),
      p_(comm.size()),
      rank_(comm.rank()),
      local_every_(o.local_threshold_every),
      global_every_(o.global_threshold_every),
      region_every_(o.region_every),
      max_in_flight_(o.max_in_flight),
      balance_(o.balance),
      bounds_(comm.size() + 1),
      passes_(make_sparse_passes(backend, n)) {
  if (local_every_ < 1 || global_every_ < 1 || region_every_ < 1 || max_in_flight_ < 1)
    throw std::invalid_argument(
        "oktopk: local_threshold_every, global_threshold_every, region_every and max_in_flight must be >= 1");
  if (n >= (int64_t{1} << 31)) throw std::invalid_argument("oktopk: int32 indices need n < 2^31");
  for (int j = 0; j <= p_; ++j) bounds_[j] = n_ * j / p_;
}

std::string OkTopk::describe() const {
  std::ostringstream out;
  const double words = 4 / 1e6;  // MB per word
  out << "oktopk: k = " << k_ << " of " << n_ << " entries; local threshold exact every " << local_every_
      << " step(s), global every " << global_every_ << ", regions every " << region_every_ << "\n"
      << "  ALLREDUCE_REGION (P-1 words), ALLTOALL_COUNTS, ISEND/IRECV_INDEX and _VALUE to P-1 peers ("
      << max_in_flight_ << " in flight), ALLREDUCE_THRESHOLD (4 x 256 words, exact global steps), "
      << "ALLGATHER_COUNTS (6 words), " << (balance_ ? "balance moves, " : "") << "ALLGATHERV_FINAL\n"
      << "  per rank about " << 2.0 * k_ * (p_ - 1) / p_ * words << " MB split and reduce + " << 2.0 * k_ / p_ * words
      << " MB allgatherv block sent (bound 6k(P-1)/P words = " << 6.0 * k_ * (p_ - 1) / p_ * words
      << " MB at P = " << p_ << "); error feedback";
  out << adaptive_note("density") << dgc_note();
  return out.str();
}

void OkTopk::repartition() {
  if (p_ == 1) return;
  proposal_.resize(p_ - 1);
  const int64_t c = local_.size();
  for (int j = 1; j < p_; ++j) proposal_[j - 1] = c > 0 ? local_.index()[c * j / p_] : n_ * j / p_;
  comm_.allreduce(proposal_.data(), p_ - 1, DType::kI64, ReduceOp::kSum, "ALLREDUCE_REGION");
  bounds_[0] = 0;
  bounds_[p_] = n_;
  for (int j = 1; j < p_; ++j) bounds_[j] = std::clamp(proposal_[j - 1] / p_, bounds_[j - 1], n_);
}

void OkTopk::split_and_reduce() {
  const int64_t c = local_.size();
  const int32_t* index = local_.index();
  region_begin_.resize(p_ + 1);
  send_counts_.resize(p_);
  recv_counts_.resize(p_);
  recv_offsets_.resize(p_);
  send_index_.resize(c);
  for (int j = 0; j <= p_; ++j) region_begin_[j] = j == p_ ? c : std::lower_bound(index, index + c, bounds_[j]) - index;
  for (int j = 0; j < p_; ++j) {
    send_counts_[j] = static_cast<int32_t>(region_begin_[j + 1] - region_begin_[j]);
    const auto base = static_cast<int32_t>(bounds_[j]);
    for (int64_t q = region_begin_[j]; q < region_begin_[j + 1]; ++q) send_index_[q] = index[q] - base;
  }
  comm_.alltoall(send_counts_.data(), 1, recv_counts_.data(), DType::kI32, "ALLTOALL_COUNTS");
  int64_t total = 0;
  for (int s = 0; s < p_; ++s) {
    recv_offsets_[s] = total;
    if (s != rank_) total += recv_counts_[s];
  }
  recv_index_.resize(total);
  recv_value_.resize(total);
  // Rotated order, a bounded number of peers at a time: every rank sends to a different peer in
  // each round, so no rank is the target of all others at once.
  for (int64_t first = 1; first < p_; first += max_in_flight_) {
    requests_.clear();
    const int64_t last = std::min<int64_t>(p_, first + max_in_flight_);
    for (int64_t i = first; i < last; ++i) {
      const int src = static_cast<int>((rank_ - i + p_) % p_);
      if (recv_counts_[src] > 0) {
        requests_.push_back(comm_.irecv(recv_index_.data() + recv_offsets_[src], recv_counts_[src], DType::kI32, src,
                                        kIndexChannel, "IRECV_INDEX"));
        requests_.push_back(comm_.irecv(recv_value_.data() + recv_offsets_[src], recv_counts_[src], DType::kF32, src,
                                        kValueChannel, "IRECV_VALUE"));
      }
    }
    for (int64_t i = first; i < last; ++i) {
      const int dst = static_cast<int>((rank_ + i) % p_);
      if (send_counts_[dst] > 0) {
        requests_.push_back(comm_.isend(send_index_.data() + region_begin_[dst], send_counts_[dst], DType::kI32, dst,
                                        kIndexChannel, "ISEND_INDEX"));
        requests_.push_back(comm_.isend(local_.value() + region_begin_[dst], send_counts_[dst], DType::kF32, dst,
                                        kValueChannel, "ISEND_VALUE"));
      }
    }
    comm_.wait_all(requests_);
  }
  // Sum in rank order, this rank's own part in its place, so the floats do not depend on arrival.
  lists_.clear();
  for (int s = 0; s < p_; ++s) {
    if (s == rank_)
      lists_.push_back({send_index_.data() + region_begin_[s], local_.value() + region_begin_[s], send_counts_[s]});
    else
      lists_.push_back({recv_index_.data() + recv_offsets_[s], recv_value_.data() + recv_offsets_[s], recv_counts_[s]});
  }
  merge_sum_all(lists_, reduced_, merge_tmp_);
}

float OkTopk::exact_global_threshold() {
  // Radix select over the bits of |v| across all regions: the digit of the k-th largest is found
  // 8 bits at a time from one summed histogram per round; zeros never count (never selected).
  keys_.clear();
  for (int64_t q = 0; q < reduced_.size(); ++q) {
    const uint32_t key = magnitude_bits(reduced_.value()[q]);
    if (key != 0) keys_.push_back(key);
  }
  histogram_.resize(256);
  uint32_t prefix = 0;
  int64_t remaining = k_;
  for (int shift = 24; shift >= 0; shift -= 8) {
    std::fill(histogram_.begin(), histogram_.end(), 0);
    for (uint32_t key : keys_) ++histogram_[(key >> shift) & 255];
    comm_.allreduce(histogram_.data(), 256, DType::kI32, ReduceOp::kSum, "ALLREDUCE_THRESHOLD");
    if (shift == 24) {
      int64_t total = 0;
      for (int32_t h : histogram_) total += h;
      if (total <= k_) return 0.f;  // k or fewer nonzero sums: all of them
    }
    int digit = 255;
    for (; digit > 0 && histogram_[digit] < remaining; --digit) remaining -= histogram_[digit];
    prefix |= static_cast<uint32_t>(digit) << shift;
    // Only keys with this digit stay in play for the lower bits.
    size_t kept = 0;
    for (uint32_t key : keys_)
      if (((key >> shift) & 255) == static_cast<uint32_t>(digit)) keys_[kept++] = key;
    keys_.resize(kept);
  }
  return from_bits(prefix);
}

void OkTopk::select_global(bool exact) {
  if (exact) t_global_ = exact_global_threshold();
  // Counts at t and at t raised by 3% up to 5 times, for every rank in one ALLGATHER_COUNTS: all
  // ranks then take the same lowest candidate that lets at most 3k/2 entries through in total (or
  // the highest), the reference's reuse-step guard applied to the global threshold. On an exact
  // step the first candidate passes about k.
  float candidates[kGuardSteps + 1];
  candidates[0] = std::max(t_global_, min_threshold());
  for (int j = 1; j <= kGuardSteps; ++j) candidates[j] = candidates[j - 1] * 1.03f;
  int32_t mine[kGuardSteps + 1] = {};
  for (int64_t q = 0; q < reduced_.size(); ++q) {
    const float a = std::fabs(reduced_.value()[q]);
    for (int j = 0; j <= kGuardSteps; ++j) mine[j] += a >= candidates[j];
  }
  all_counts_.resize(static_cast<size_t>(p_) * (kGuardSteps + 1));
  comm_.allgather(mine, kGuardSteps + 1, all_counts_.data(), DType::kI32, "ALLGATHER_COUNTS");
  int chosen = 0;
  int64_t total = 0;
  for (; chosen <= kGuardSteps; ++chosen) {
    total = 0;
    for (int r = 0; r < p_; ++r) total += all_counts_[r * (kGuardSteps + 1) + chosen];
    if (2 * total <= 3 * k_ || chosen == kGuardSteps) break;
  }
  const float t = candidates[chosen];
  counts_.resize(p_);
  for (int r = 0; r < p_; ++r) counts_[r] = all_counts_[r * (kGuardSteps + 1) + chosen];
  global_total_ = total;
  if (chosen > 0) t_global_ = t;
  t_global_ = nudge_threshold(t_global_, total, k_);

  const auto base = static_cast<int32_t>(bounds_[rank_]);
  global_.resize(reduced_.size());
  int64_t kept = 0;
  for (int64_t q = 0; q < reduced_.size(); ++q) {
    const float v = reduced_.value()[q];
    global_.index()[kept] = reduced_.index()[q] + base;
    global_.value()[kept] = v;
    kept += std::fabs(v) >= t;
  }
  global_.resize(kept);
}

void OkTopk::gather_output() {
  const int64_t mine = global_.size();
  int64_t total = 0, offset = 0;  // offset: where this rank's entries start in the global order
  for (int r = 0; r < p_; ++r) {
    if (r == rank_) offset = total;
    total += counts_[r];
  }
  blocks_.resize(p_);
  block_offsets_.resize(p_);
  gather_counts_.resize(p_);
  for (int r = 0; r < p_; ++r) {
    blocks_[r] = balance_ ? total / p_ + (r < total % p_) : counts_[r];
    block_offsets_[r] = r == 0 ? 0 : block_offsets_[r - 1] + blocks_[r - 1];
    gather_counts_[r] = 2 * blocks_[r];
  }
  final_.resize(2 * total);
  const int64_t my_block = blocks_[rank_], my_start = block_offsets_[rank_];
  int32_t* block_index = final_.data() + 2 * my_start;
  float* block_value = reinterpret_cast<float*>(block_index + my_block);
  if (!balance_) {
    std::memcpy(block_index, global_.index(), mine * sizeof(int32_t));
    std::memcpy(block_value, global_.value(), mine * sizeof(float));
  } else {
    // This rank holds global positions [offset, offset + mine) and must end up with
    // [my_start, my_start + my_block): send every overlap with another rank's target range, receive
    // every other rank's overlap with this rank's target, copy its own.
    requests_.clear();
    int64_t from = 0;
    for (int r = 0; r < p_; ++r) {
      const int64_t their_start = from;
      from += counts_[r];
      const int64_t lo = std::max(their_start, my_start), hi = std::min(their_start + counts_[r], my_start + my_block);
      if (r == rank_ || hi <= lo) continue;
      requests_.push_back(
          comm_.irecv(block_index + (lo - my_start), hi - lo, DType::kI32, r, kBalanceIndexChannel, "IRECV_INDEX"));
      requests_.push_back(
          comm_.irecv(block_value + (lo - my_start), hi - lo, DType::kF32, r, kBalanceValueChannel, "IRECV_VALUE"));
    }
    for (int r = 0; r < p_; ++r) {
      const int64_t lo = std::max(offset, block_offsets_[r]),
                    hi = std::min(offset + mine, block_offsets_[r] + blocks_[r]);
      if (hi <= lo) continue;
      const int32_t* index = global_.index() + (lo - offset);
      const float* value = global_.value() + (lo - offset);
      if (r == rank_) {
        std::memcpy(block_index + (lo - my_start), index, (hi - lo) * sizeof(int32_t));
        std::memcpy(block_value + (lo - my_start), value, (hi - lo) * sizeof(float));
        continue;
      }
      requests_.push_back(comm_.isend(index, hi - lo, DType::kI32, r, kBalanceIndexChannel, "ISEND_INDEX"));
      requests_.push_back(comm_.isend(value, hi - lo, DType::kF32, r, kBalanceValueChannel, "ISEND_VALUE"));
    }
    comm_.wait_all(requests_);
  }
  comm_.allgatherv(block_index, 2 * my_block, final_.data(), gather_counts_, DType::kI32, "ALLGATHERV_FINAL");

  // Output and residual in one pass: the blocks are the output in global index order; the
  // entries of local_ among them are what this rank contributed, cleared from the residual.
  lists_.clear();
  for (int r = 0; r < p_; ++r) {
    const int64_t count = blocks_[r];
    const int32_t* index = final_.data() + 2 * block_offsets_[r];
    if (count > 0) lists_.push_back({index, reinterpret_cast<const float*>(index + count), count});
  }
  contributed_ = passes_->write_output(lists_, static_cast<float>(p_), &local_);
}

void OkTopk::reuse_local_threshold() {
  passes_->select_at_least(std::max(t_local_, min_threshold()), local_);
  // The reference's guard on reuse steps: while more than 3k/2 entries pass, raise t by 3% (at
  // most 5 times). Raising only drops collected entries, so this costs no pass over the gradient.
  for (int loop = 0; loop < kGuardSteps && 2 * local_.size() > 3 * k_; ++loop) {
    t_local_ *= 1.03f;
    keep_at_least(local_, t_local_);
  }
}

SyncStats OkTopk::compress(SyncBuffers& b, int64_t step, ErrorFeedback::Step& ef) {
  comm_.log().set_step(step, Phase::kCompressed);
  // 1. Local selection, acc = grad + residual formed in the same pass.
  const bool exact = exact_due_;
  exact_due_ = false;
  passes_->begin(b.grads, ef);
  const bool fresh_local = iteration_ % local_every_ == 0 || exact;
  const bool fresh_global = iteration_ % global_every_ == 0 || exact;
  if (fresh_local)
    t_local_ = passes_->select_top_k(k_, /*exactly_k=*/false, local_);
  else
    reuse_local_threshold();
  t_local_ = nudge_threshold(t_local_, local_.size(), k_);
  // 2-3. Regions, split and reduce.
  if (iteration_ % region_every_ == 0 || repartition_due_ || exact) repartition();
  repartition_due_ = false;
  split_and_reduce();
  // 4. Global selection in this rank's region.
  select_global(fresh_global);
  // 5-6. Balance, allgatherv, output and residual.
  gather_output();
  ++iteration_;
  SyncStats stats{Phase::kCompressed, static_cast<double>(contributed_) / n_};
  stats.fresh_estimate = fresh_local || fresh_global ? 1 : 0;
  stats.selected_local = local_count();
  stats.selected_global = global_count();
  return stats;
}

void OkTopk::adapt(const std::vector<uint8_t>& low, bool fresh) {
  k_ = top_k_count(adaptive_setting(low.at(0) != 0), n_);
  // The reused thresholds and the regions were for the old k: exact ones at the next step.
  if (fresh) exact_due_ = true;
}

void OkTopk::save_state(std::ostream& out) const {
  write_sync_header(out, "oktopk", 1);
  write_pod(out, n_);
  write_pod(out, static_cast<int64_t>(p_));
  write_pod(out, iteration_);
  write_pod(out, t_local_);
  write_pod(out, t_global_);
  out.write(reinterpret_cast<const char*>(bounds_.data()),
            static_cast<std::streamsize>(bounds_.size() * sizeof(int64_t)));
}

namespace {

// One saved Ok-Top-k state as written by save_state, read without judging it against this run.
struct SavedOkTopk {
  int64_t n = 0, p = 0, iteration = 0;
  float t_local = 0, t_global = 0;
  std::vector<int64_t> bounds;
};

SavedOkTopk read_saved(std::istream& in) {
  read_sync_header(in, "oktopk", 1);
  SavedOkTopk s;
  s.n = read_pod<int64_t>(in);
  s.p = read_pod<int64_t>(in);
  if (!in || s.p < 1 || s.p > (int64_t{1} << 24)) throw std::runtime_error("oktopk state: truncated");
  s.iteration = read_pod<int64_t>(in);
  s.t_local = read_pod<float>(in);
  s.t_global = read_pod<float>(in);
  s.bounds.resize(s.p + 1);
  in.read(reinterpret_cast<char*>(s.bounds.data()), static_cast<std::streamsize>(s.bounds.size() * sizeof(int64_t)));
  if (!in) throw std::runtime_error("oktopk state: truncated");
  if (s.bounds[0] != 0 || s.bounds[s.p] != s.n || !std::is_sorted(s.bounds.begin(), s.bounds.end()))
    throw std::runtime_error("oktopk state: region bounds are not a partition of the gradient");
  return s;
}

}  // namespace

void OkTopk::load_state(std::istream& in) {
  SavedOkTopk s = read_saved(in);
  if (s.n != n_)
    throw std::runtime_error("oktopk state is for " + std::to_string(s.n) + " gradient entries, this model has " +
                             std::to_string(n_));
  if (s.p != p_)
    throw std::runtime_error("oktopk state was saved by a run of " + std::to_string(s.p) + " processes, this run has " +
                             std::to_string(p_));
  iteration_ = s.iteration;
  t_local_ = s.t_local;
  t_global_ = s.t_global;
  bounds_ = std::move(s.bounds);
  repartition_due_ = false;
}

std::string OkTopk::merge_state(const std::vector<std::istream*>& saved) {
  // Every rank steps the same counter and agrees on t_global (it is chosen from the global counts)
  // and on the bounds; t_local is a rank's own, nudged by its own count.
  double t_local_sum = 0;
  SavedOkTopk first;
  for (size_t r = 0; r < saved.size(); ++r) {
    SavedOkTopk s = read_saved(*saved[r]);
    if (s.n != n_)
      throw std::runtime_error("oktopk state is for " + std::to_string(s.n) + " gradient entries, this model has " +
                               std::to_string(n_));
    if (s.p != static_cast<int64_t>(saved.size()) || (r > 0 && s.iteration != first.iteration))
      throw std::runtime_error("oktopk state of saved rank " + std::to_string(r) + " (of " + std::to_string(s.p) +
                               " processes, step " + std::to_string(s.iteration) + ") does not match rank 0's");
    t_local_sum += s.t_local;
    if (r == 0) first = std::move(s);
  }
  iteration_ = first.iteration;
  t_local_ = static_cast<float>(t_local_sum / static_cast<double>(saved.size()));
  t_global_ = first.t_global;
  // The P' regions are even until the next compressed step recomputes them from the selections.
  for (int j = 0; j <= p_; ++j) bounds_[j] = n_ * j / p_;
  repartition_due_ = true;
  return "local threshold: the mean of the saved ranks'; global threshold kept; region bounds recomputed at "
         "the next compressed step";
}

WireVolume OkTopk::wire_volume() const {
  const int p = comm_.size();
  // An upper bound: split-and-reduce and the final allgatherv together (oktopk.h).
  return {6.0 * static_cast<double>(k_) * (p - 1) / p, "6k(P-1)/P"};
}

}  // namespace trainer::comm
