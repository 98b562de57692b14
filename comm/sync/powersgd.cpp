#include "comm/sync/powersgd.h"

#include <algorithm>
#include <istream>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "comm/sync/low_rank.h"
#include "comm/sync/sync_state.h"

namespace trainer::comm {

namespace {

void scale(int64_t count, float s, float* y) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) y[i] *= s;
}

}  // namespace

PowerSgd::PowerSgd(Communicator& comm, const std::vector<models::ParamView>& views, int64_t n, int64_t rank,
                   double min_compression_rate, uint64_t seed, models::Backend& backend, WireDType wire)
    : ErrorFeedbackSync(n), comm_(comm), backend_(backend), n_(n), rank_(rank), seed_(seed), wire_(wire) {
  if (rank < 1) throw std::invalid_argument("powersgd: sync.rank must be at least 1");
  int64_t covered = 0;
  for (size_t v = 0; v < views.size(); ++v) {
    const models::ParamView& view = views[v];
    const int64_t numel = view.numel();
    if (view.offset != covered) throw std::invalid_argument("powersgd: the model's tensors do not tile its gradient");
    covered += numel;
    if (numel == 0) continue;
    // The hook's view: shape[0] x the rest (a 1-D tensor is n x 1, which never pays at rates >= 1).
    const int64_t rows = view.shape.empty() ? 1 : view.shape[0], cols = numel / rows;
    const int64_t r = std::min({rows, cols, rank});
    // The hook's test, in doubles (exact for every size a model has).
    if (static_cast<double>(rows + cols) * r * min_compression_rate < static_cast<double>(rows) * cols) {
      matrices_.push_back({static_cast<int64_t>(v), view.offset, rows, cols, r});
      continue;
    }
    if (!dense_.empty() && dense_.back().offset + dense_.back().count == view.offset)
      dense_.back().count += numel;
    else
      dense_.push_back({view.offset, numel});
    dense_floats_ += numel;
  }
  if (covered != n) throw std::invalid_argument("powersgd: the model's tensors do not tile its gradient");
  // Same shapes next to each other (in order of first appearance), so a group is strided.
  std::vector<std::pair<int64_t, Matrix>> keyed;
  for (const Matrix& x : matrices_) {
    int64_t key = x.view;
    for (const auto& [k, y] : keyed)
      if (y.rows == x.rows && y.cols == x.cols && y.rank == x.rank) key = std::min(key, k);
    keyed.push_back({key, x});
  }
  std::stable_sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 0; i < keyed.size(); ++i) matrices_[i] = keyed[i].second;
  for (size_t i = 0; i < matrices_.size(); ++i) {
    Matrix& m = matrices_[i];
    m.p_offset = p_floats_;
    m.q_offset = q_floats_;
    m.e_offset = m.offset;
    p_floats_ += m.rows * m.rank;
    q_floats_ += m.cols * m.rank;
    compressed_floats_ += m.rows * m.cols;
  }
}

std::string PowerSgd::describe() const {
  const int p = comm_.size();
  size_t shape_groups = 0;
  for (size_t i = 0; i < matrices_.size(); ++i) {
    const Matrix& m = matrices_[i];
    const Matrix* prev = i ? &matrices_[i - 1] : nullptr;
    shape_groups += !(prev && prev->rows == m.rows && prev->cols == m.cols && prev->rank == m.rank);
  }
  const int64_t bytes = wire_bytes(wire_);
  std::ostringstream out;
  out << "powersgd: rank " << rank_ << "; " << matrices_.size() << " tensors compressed as rank-r factors ("
      << compressed_floats_ << " elements -> sum (n + m) r = " << p_floats_ + q_floats_ << " floats, " << shape_groups
      << " shape groups), " << dense_floats_ << " elements of the others sent dense; per step ALLREDUCE_P of "
      << p_floats_ << " floats and ALLREDUCE_Q of " << q_floats_ << " + " << dense_floats_ << " floats, on the wire as "
      << wire_dtype_name(wire_) << " (" << bytes << " bytes each): " << floats_per_step() * bytes / 1e6
      << " MB per rank (dense fp32: " << n_ * 4 / 1e6 << " MB, "
      << static_cast<double>(n_ * 4) / std::max<int64_t>(1, floats_per_step() * bytes) << "x less); ring traffic per rank "
      << 2.0 * (p - 1) / p * floats_per_step() * bytes / 1e6 << " MB at P = " << p << "; error feedback";
  return out.str();
}

void PowerSgd::start() {
  p_.assign(p_floats_, 0.f);
  q_.assign(q_floats_ + dense_floats_, 0.f);
  for (const Matrix& m : matrices_) {
    float* q = q_.data() + m.q_offset;
    seeded_uniform(seed_, static_cast<uint64_t>(m.view), m.cols * m.rank, q);
  }
  started_ = true;
}

SyncStats PowerSgd::compress(SyncBuffers& b, int64_t step, ErrorFeedback::Step& ef) {
  comm_.log().set_step(step, Phase::kCompressed);
  if (!started_) start();
  float* grads = b.grads;
  float* p = p_.data();
  float* q = q_.data();
  // 1. acc = grad + e per compressed matrix, formed by error feedback in its residual (the
  // gradient's layout: e + offset). The empty first range gives the buffer's start and forms acc
  // even when no tensor is compressed.
  float* e = ef.materialize(0, 0);
  for (const Matrix& m : matrices_) ef.materialize(m.offset, m.rows * m.cols);
  // 2. P = acc Q, Q orthonormalized first (the hook does so with the warm-started Q too).
#pragma omp parallel for schedule(dynamic)
  for (size_t i = 0; i < matrices_.size(); ++i) {
    const Matrix& m = matrices_[i];
    orthonormalize_columns(q + m.q_offset, m.cols, m.rank);
  }
  for (const Matrix& m : matrices_)
    backend_.gemm(false, false, m.rows, m.rank, m.cols, 1.f, e + m.offset, m.cols, q + m.q_offset, m.rank, 0.f,
                  p + m.p_offset, m.rank);
  // 3. Every P in one allreduce (through the wire format; fp16 divided by the world size first).
  const float pre_scale = wire_pre_scale(wire_, comm_.size());
  if (p_floats_ > 0) allreduce_sum_through_wire(comm_, p, p_floats_, wire_, pre_scale, wire_scratch_, "ALLREDUCE_P");
  // 4. Orthonormal columns (the sum's scale does not matter).
#pragma omp parallel for schedule(dynamic)
  for (size_t i = 0; i < matrices_.size(); ++i) {
    const Matrix& m = matrices_[i];
    orthonormalize_columns(p + m.p_offset, m.rows, m.rank);
  }
  // 5. Q = acc^T P.
  for (const Matrix& m : matrices_)
    backend_.gemm(true, false, m.cols, m.rank, m.rows, 1.f, e + m.offset, m.cols, p + m.p_offset, m.rank, 0.f,
                  q + m.q_offset, m.rank);
  // 6. Every Q and the dense tensors in one allreduce, averaged.
  float* dense = q + q_floats_;
  for (const Range& r : dense_) {
    backend_.copy(r.count, grads + r.offset, dense);
    dense += r.count;
  }
  const int64_t total = q_floats_ + dense_floats_;
  if (total > 0) allreduce_sum_through_wire(comm_, q, total, wire_, pre_scale, wire_scratch_, "ALLREDUCE_Q");
  if (pre_scale == 1.f) scale(total, 1.f / static_cast<float>(comm_.size()), q);
  // 7. grads = P Q^T (the averaged approximation), e = acc - P Q^T; dense tensors get their average.
  for (const Matrix& m : matrices_)
    backend_.gemm(false, true, m.rows, m.cols, m.rank, 1.f, p + m.p_offset, m.rank, q + m.q_offset, m.rank, 0.f,
                  grads + m.offset, m.cols);
  for (const Matrix& m : matrices_) ef.sent_approximately(m.offset, grads + m.offset, m.rows * m.cols);
  dense = q + q_floats_;
  for (const Range& r : dense_) {
    backend_.copy(r.count, dense, grads + r.offset);
    dense += r.count;
  }
  ++steps_;
  return {Phase::kCompressed, static_cast<double>(floats_per_step()) / std::max<int64_t>(1, n_)};
}

void PowerSgd::save_state(std::ostream& out) const {
  write_sync_header(out, "powersgd", 2);
  write_pod(out, n_);
  write_pod(out, rank_);
  write_pod(out, static_cast<int64_t>(matrices_.size()));
  write_pod(out, compressed_floats_);
  write_pod(out, q_floats_);
  write_pod(out, seed_);
  write_pod(out, steps_);
  write_pod(out, static_cast<uint8_t>(started_));
  if (!started_) return;
  out.write(reinterpret_cast<const char*>(q_.data()), static_cast<std::streamsize>(q_floats_ * sizeof(float)));
}

void PowerSgd::load_state(std::istream& in) {
  read_sync_header(in, "powersgd", 2);
  const auto n = read_pod<int64_t>(in);
  const auto rank = read_pod<int64_t>(in);
  const auto matrices = read_pod<int64_t>(in);
  const auto compressed_floats = read_pod<int64_t>(in);
  const auto q_floats = read_pod<int64_t>(in);
  const auto seed = read_pod<uint64_t>(in);
  const auto steps = read_pod<int64_t>(in);
  const auto started = read_pod<uint8_t>(in);
  if (!in) throw std::runtime_error("powersgd state: truncated");
  if (n != n_)
    throw std::runtime_error("powersgd state is for " + std::to_string(n) + " gradient entries, this model has " +
                             std::to_string(n_));
  if (rank != rank_)
    throw std::runtime_error("powersgd state was saved with sync.rank = " + std::to_string(rank) + ", this run has " +
                             std::to_string(rank_));
  if (matrices != static_cast<int64_t>(matrices_.size()) || compressed_floats != compressed_floats_ || q_floats != q_floats_)
    throw std::runtime_error("powersgd state compresses other tensors (saved with another sync.min_compression_rate?)");
  if (started) {
    std::vector<float> q(q_floats_ + dense_floats_, 0.f);
    in.read(reinterpret_cast<char*>(q.data()), static_cast<std::streamsize>(q_floats_ * sizeof(float)));
    if (!in) throw std::runtime_error("powersgd state: truncated");
    q_ = std::move(q);
    p_.assign(p_floats_, 0.f);
  } else {
    q_.clear();
    p_.clear();
  }
  started_ = started != 0;
  seed_ = seed;
  steps_ = steps;
}

}  // namespace trainer::comm
