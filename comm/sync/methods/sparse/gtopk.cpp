#include "comm/sync/methods/sparse/gtopk.h"

#include <cstring>
#include <istream>
#include <sstream>
#include <stdexcept>

#include "comm/sync/wrappers/compressor_options.h"
#include "comm/sync/wrappers/keep_dense.h"
#include "comm/sync/sync_state.h"

namespace trainer::comm {

SyncMethod gtopk_method() {
  return sparse_method("gtopk", "tree of pairwise top-k merges, power-of-two process counts",
                       [](const SyncOptions& o, Communicator& comm, int64_t count, models::Backend& backend) {
                         return std::make_unique<GTopk>(comm, count, options_of<SparseOptions>(o).density, backend);
                       });
}

GTopk::GTopk(Communicator& comm, int64_t n, double density, models::Backend& backend)
    : ErrorFeedbackSync(n, &backend),
      comm_(comm),
      n_(n),
      k_(top_k_count(density, n)),
      words_((comm.size() + 31) / 32),
      passes_(make_sparse_passes(backend, n)) {
  const int p = comm.size();
  if (p < 1 || (p & (p - 1)) != 0)
    throw std::invalid_argument("sync.method 'gtopk' needs a power-of-two number of processes, this run has " +
                                std::to_string(p));
}

std::string GTopk::describe() const {
  const int p = comm_.size();
  int rounds = 0;
  while ((1 << rounds) < p) ++rounds;
  std::ostringstream out;
  out << "gtopk: exact local top-k (k = " << k_ << " of " << n_ << "), " << rounds
      << " round(s) of pairwise SENDRECV_GTOPK merge and reselect, BROADCAST_GTOPK of the final k; messages of "
      << (2 + words_) * k_ * 4 / 1e6 << " MB (index, value, contributor mask); error feedback";
  out << adaptive_note("density") << dgc_note();
  return out.str();
}

void GTopk::pack(int32_t* message) const {
  const int64_t k = current_.size();
  std::memcpy(message, current_.index(), k * sizeof(int32_t));
  std::memcpy(message + k, current_.value(), k * sizeof(float));
  std::memcpy(message + 2 * k, mask_.data(), k * words_ * sizeof(uint32_t));
}

// merged = current + received (receiver's value + sender's value where both have the index; masks
// OR-ed), then the exactly-k rule, and merged becomes current.
void GTopk::merge_received(const int32_t* message) {
  const int64_t k = current_.size();
  const int32_t* bi = message;
  const float* bv = reinterpret_cast<const float*>(message + k);
  const auto* bm = reinterpret_cast<const uint32_t*>(message + 2 * k);
  const int32_t* ai = current_.index();
  const float* av = current_.value();
  const uint32_t* am = mask_.data();
  merged_.resize(2 * k);
  merged_mask_.resize(2 * k * words_);
  int32_t* oi = merged_.index();
  float* ov = merged_.value();
  uint32_t* om = merged_mask_.data();
  const int w = words_;
  int64_t a = 0, b = 0, o = 0;
  while (a < k || b < k) {
    if (b == k || (a < k && ai[a] < bi[b])) {
      oi[o] = ai[a];
      ov[o] = av[a];
      for (int j = 0; j < w; ++j) om[o * w + j] = am[a * w + j];
      ++a;
    } else if (a == k || bi[b] < ai[a]) {
      oi[o] = bi[b];
      ov[o] = bv[b];
      for (int j = 0; j < w; ++j) om[o * w + j] = bm[b * w + j];
      ++b;
    } else {
      oi[o] = ai[a];
      ov[o] = av[a] + bv[b];
      for (int j = 0; j < w; ++j) om[o * w + j] = am[a * w + j] | bm[b * w + j];
      ++a, ++b;
    }
    ++o;
  }
  merged_.resize(o);
  keep_top_k(merged_, k, scratch_, merged_mask_.data(), w);
  std::swap(current_, merged_);
  std::swap(mask_, merged_mask_);
}

SyncStats GTopk::compress(SyncBuffers& b, int64_t step, ErrorFeedback::Step& ef) {
  comm_.log().set_step(step, Phase::kCompressed);
  const int p = comm_.size(), me = comm_.rank();
  passes_->begin(b.grads, ef);
  passes_->select_top_k(k_, /*exactly_k=*/true, local_);
  const int64_t k = local_.size();  // == k_
  const int64_t message_words = (2 + words_) * k;
  message_.resize(message_words);
  current_.resize(k);
  std::memcpy(current_.index(), local_.index(), k * sizeof(int32_t));
  std::memcpy(current_.value(), local_.value(), k * sizeof(float));
  mask_.assign(k * words_, 0u);
  for (int64_t j = 0; j < k; ++j) mask_[j * words_ + me / 32] = 1u << (me % 32);
  constexpr int kChannel = 5;
  for (int d = 1; d < p; d *= 2) {
    if (me % (2 * d) == d) {
      pack(message_.data());
      Request send = comm_.isend(message_.data(), message_words, DType::kI32, me - d, kChannel, "SENDRECV_GTOPK");
      comm_.wait(send);
      break;
    }
    Request recv = comm_.irecv(message_.data(), message_words, DType::kI32, me + d, kChannel, "SENDRECV_GTOPK");
    comm_.wait(recv);
    merge_received(message_.data());
  }
  if (me == 0) pack(message_.data());
  if (p > 1) comm_.broadcast(message_.data(), message_words, DType::kI32, 0, "BROADCAST_GTOPK");
  const int32_t* index = message_.data();
  const float* value = reinterpret_cast<const float*>(message_.data() + k);
  const auto* mask = reinterpret_cast<const uint32_t*>(message_.data() + 2 * k);
  runs_.assign(1, {index, value, k});
  passes_->write_output(runs_, static_cast<float>(p), nullptr);
  // Clear what reached the output: final entries whose mask holds this rank (all are in local_).
  contributed_.clear();
  for (int64_t j = 0; j < k; ++j)
    if (mask[j * words_ + me / 32] >> (me % 32) & 1u) contributed_.push_back(index[j]);
  passes_->sent(contributed_.data(), static_cast<int64_t>(contributed_.size()));
  const auto contributed = static_cast<int64_t>(contributed_.size());
  ++steps_;
  return {Phase::kCompressed, static_cast<double>(contributed) / n_};
}

void GTopk::adapt(const std::vector<uint8_t>& low, bool ) {
  k_ = top_k_count(adaptive_setting(low.at(0) != 0), n_);
}

void GTopk::save_state(std::ostream& out) const {
  write_sync_header(out, "gtopk", 1);
  write_pod(out, steps_);
}

void GTopk::load_state(std::istream& in) {
  read_sync_header(in, "gtopk", 1);
  const auto steps = read_pod<int64_t>(in);
  if (!in) throw std::runtime_error("gtopk state: truncated");
  steps_ = steps;
}

WireVolume GTopk::wire_volume() const {
  const int p = comm_.size();
  int rounds = 0;
  while ((1 << rounds) < p) ++rounds;
  return {2.0 * static_cast<double>(k_) * rounds, "2k log2 P"};
}

}  // namespace trainer::comm
