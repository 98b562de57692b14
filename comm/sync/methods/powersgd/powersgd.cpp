#include "comm/sync/methods/powersgd/powersgd.h"

#include <algorithm>
#include <istream>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "comm/sync/methods/powersgd/low_rank.h"
#include "models/device_memory.h"
#include "comm/sync/registry.h"
#include "comm/sync/sync_state.h"

namespace trainer::comm {

SyncMethod powersgd_method() {
  SyncMethod m;
  m.name = "powersgd";
  m.doc = "rank-r factors P Q^T of each weight matrix, PyTorch's powerSGD_hook";
  m.can.compresses = true;
  m.can.device_buffers = true;
  m.can.layer_wise = true;
  declare_options<PowerSgdOptions>(m);
  // Accordion's detector and the 16-bit wire casts are host loops.
  m.needs_host_buffers = [](const SyncSettings& o) {
    return options_of<PowerSgdOptions>(o).adaptive || o.wire() != WireDType::kF32;
  };
  m.check = [](const SyncOptions& o) {
    const auto p = options_of<PowerSgdOptions>(o);
    std::vector<SyncOptionProblem> problems;
    if (p.adaptive && p.adaptive_rank <= p.rank)
      problems.push_back({{"adaptive_rank", "rank"},
                          "adaptive_rank = " + std::to_string(p.adaptive_rank) + " must be above rank = " +
                              std::to_string(p.rank) +
                              " (adaptive: the rank of critical regimes, the lower compression)"});
    return problems;
  };
  m.defaults = [](const SyncOptions& o) -> std::vector<MethodDefault> {
    if (!options_of<PowerSgdOptions>(o).adaptive) return {};
    return {{"rank", int64_t{1},
             "powersgd's rank outside critical regimes under adaptive (Accordion's pair: rank 1 and "
             "adaptive_rank 4 measured within 0.3 points of fixed rank 4 at 61% of its bytes)"},
            {"adaptive_rank", int64_t{4}, "powersgd's rank in critical regimes under adaptive"}};
  };
  // At rank 8 (the default) PowerSGD held accuracy on speech after a short warmup too (17.5% against
  // dense's 16.8% on the LAS quickstart), so the compressors' note is for lower ranks.
  m.start_notes = [](const SyncOptions& o) {
    return options_of<PowerSgdOptions>(o).rank >= 8 && o.recipe.speech ? std::vector<std::string>{}
                                                                            : short_warmup_notes(o);
  };
  m.make = [](const SyncOptions& o, const SyncContext& c) -> std::unique_ptr<GradientSync> {
    if (!c.views) throw std::invalid_argument("sync.method 'powersgd' needs the model's tensor shapes");
    const auto p = options_of<PowerSgdOptions>(o);
    auto powersgd = std::make_unique<PowerSgd>(c.comm, *c.views, c.n, p.rank, p.min_compression_rate, o.recipe.seed,
                                               c.backend, o.wire(), o.bucket_mb,
                                               DenseBuckets{o.first_bucket_mb, o.overlap, c.views}, c.kept);
    powersgd->set_keep_residual(p.error_feedback);
    if (p.adaptive) {
      // Per compressed tensor, as the paper decides per layer (accordion.h); the set of compressed
      // tensors is the one sync.powersgd.rank gives, only their rank changes.
      std::vector<AccordionGroup> groups;
      for (const PowerSgd::Matrix* m : powersgd->in_model_order()) groups.push_back({m->offset, m->rows * m->cols});
      powersgd->enable_adaptive(c.comm, std::move(groups), adaptive_options(o), static_cast<double>(p.rank),
                                static_cast<double>(p.adaptive_rank));
    }
    return powersgd;
  };
  return m;
}

namespace {

// The dense method's bucket plan, of whole tensors; bucket_mb <= 0: one bucket.
std::vector<GradientBucket> plan_buckets(int64_t n, const std::vector<models::ParamView>& views, double bucket_mb,
                                         double first_bucket_mb) {
  const int64_t whole = std::max<int64_t>(1, n);
  return plan_gradient_buckets(n, &views, bucket_mb > 0 ? bucket_elements(bucket_mb) : whole,
                               bucket_mb > 0 ? bucket_elements(first_bucket_mb) : whole, /*cut_large_tensors=*/false);
}

}  // namespace

PowerSgd::PowerSgd(Communicator& comm, const std::vector<models::ParamView>& views, int64_t n, int64_t rank,
                   double min_compression_rate, uint64_t seed, models::Backend& backend, WireDType wire,
                   double bucket_mb, const DenseBuckets& buckets, const std::vector<bool>& keep_dense)
    : ErrorFeedbackSync(n, &backend),
      comm_(comm),
      backend_(backend),
      n_(n),
      rank_(rank),
      seed_(seed),
      p_(backend),
      q_(backend),
      q_next_(backend),
      wire_(wire),
      requested_overlap_(buckets.overlap && backend.is_host()),
      overlap_(requested_overlap_ && comm.size() > 1),
      reducer_(comm, plan_buckets(n, views, bucket_mb, buckets.first_bucket_mb),
               [this](size_t bucket, float* grads) { exchange(bucket, grads); }, &views) {
  if (rank < 1) throw std::invalid_argument("powersgd: rank must be at least 1");
  if (!keep_dense.empty() && keep_dense.size() != views.size())
    throw std::invalid_argument("powersgd: one keep_dense flag per tensor expected");
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
    const bool kept = !keep_dense.empty() && keep_dense[v];
    if (!kept && static_cast<double>(rows + cols) * r * min_compression_rate < static_cast<double>(rows) * cols)
      matrices_.push_back({static_cast<int64_t>(v), view.offset, rows, cols, r});
    else
      dense_floats_ += numel;
  }
  if (covered != n) throw std::invalid_argument("powersgd: the model's tensors do not tile its gradient");
  lay_out(reducer_.plan());
}

void PowerSgd::lay_out(const std::vector<GradientBucket>& plan) {
  std::vector<Matrix> compressed = std::move(matrices_);  // in model order
  matrices_.clear();
  int64_t q_at = 0;
  for (const GradientBucket& span : plan) {
    Bucket bucket;
    bucket.first_matrix = matrices_.size();
    // The bucket's matrices, equal shapes next to each other (in order of first appearance), so a
    // shape group is strided.
    std::vector<std::pair<int64_t, Matrix>> keyed;
    for (const Matrix& x : compressed) {
      if (x.offset < span.begin || x.offset >= span.end) continue;
      int64_t key = x.view;
      for (const auto& [k, y] : keyed)
        if (y.rows == x.rows && y.cols == x.cols && y.rank == x.rank) key = std::min(key, k);
      keyed.push_back({key, x});
    }
    std::stable_sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    bucket.p_offset = p_floats_;
    bucket.q_offset = q_at;
    for (auto& [key, m] : keyed) {
      m.p_offset = p_floats_;
      m.q_offset = q_at;
      m.e_offset = m.offset;
      p_floats_ += m.rows * m.rank;
      q_at += m.cols * m.rank;
      q_floats_ += m.cols * m.rank;
      compressed_floats_ += m.rows * m.cols;
      matrices_.push_back(m);
    }
    bucket.end_matrix = matrices_.size();
    bucket.p_count = p_floats_ - bucket.p_offset;
    bucket.q_count = q_at - bucket.q_offset;
    // The rest of the bucket is sent dense: the gaps between its matrices, in gradient order.
    std::vector<Range> taken;
    for (size_t i = bucket.first_matrix; i < bucket.end_matrix; ++i)
      taken.push_back({matrices_[i].offset, matrices_[i].rows * matrices_[i].cols});
    std::sort(taken.begin(), taken.end(), [](const Range& a, const Range& b) { return a.offset < b.offset; });
    int64_t at = span.begin;
    for (const Range& t : taken) {
      if (t.offset > at) bucket.dense.push_back({at, t.offset - at});
      at = t.offset + t.count;
    }
    if (span.end > at) bucket.dense.push_back({at, span.end - at});
    for (const Range& r : bucket.dense) bucket.dense_count += r.count;
    q_at += bucket.dense_count;
    buckets_.push_back(std::move(bucket));
  }
}

void PowerSgd::adapt(const std::vector<uint8_t>& low, bool) {
  const std::vector<const Matrix*> order = in_model_order();
  if (low.size() != order.size()) throw std::logic_error("powersgd: one adaptive setting per compressed tensor expected");
  std::vector<Matrix> model;
  std::vector<int64_t> old_rank;
  std::vector<std::vector<float>> old_q;  // the warm starts, before the layout moves them
  const std::vector<float> q_before = started_ ? q_on_host() : std::vector<float>();
  for (size_t g = 0; g < order.size(); ++g) {
    Matrix m = *order[g];
    old_rank.push_back(m.rank);
    if (started_) old_q.emplace_back(q_before.begin() + m.q_offset, q_before.begin() + m.q_offset + m.cols * m.rank);
    m.rank = std::min({m.rows, m.cols, static_cast<int64_t>(adaptive_setting(low[g] != 0))});
    model.push_back(m);
  }
  buckets_.clear();
  p_floats_ = q_floats_ = compressed_floats_ = 0;
  matrices_ = std::move(model);
  lay_out(reducer_.plan());
  if (!started_) return;  // prepare() seeds every Q at its rank
  // A tensor whose rank changed starts again from its seeded Q at the new rank, as a run at that
  // rank starts (the paper's code builds a new reducer); its residual (full size) is kept.
  std::vector<float> q(q_floats_ + dense_floats_, 0.f);
  const std::vector<const Matrix*> now = in_model_order();
  for (size_t g = 0; g < now.size(); ++g) {
    const Matrix& m = *now[g];
    if (m.rank == old_rank[g])
      std::copy(old_q[g].begin(), old_q[g].end(), q.begin() + m.q_offset);
    else
      seeded_uniform(seed_, static_cast<uint64_t>(m.view), m.cols * m.rank, q.data() + m.q_offset);
  }
  set_q(q);
  p_.resize(p_floats_);
  backend_.fill(p_floats_, 0.f, p_.data());
}

std::vector<float> PowerSgd::q_on_host() const {
  return models::host_copy(q_);
}

void PowerSgd::set_q(const std::vector<float>& q) {
  q_.resize(static_cast<int64_t>(q.size()));
  models::copy_to_device(backend_, q.data(), q_.size(), q_.data());
}

void PowerSgd::orthonormalize(float* base, size_t first, size_t end, bool p_factors) {
  batch_.clear();
  for (size_t i = first; i < end; ++i) {
    const Matrix& m = matrices_[i];
    batch_.push_back(p_factors ? models::TallMatrix{base + m.p_offset, m.rows, m.rank}
                               : models::TallMatrix{base + m.q_offset, m.cols, m.rank});
  }
  backend_.orthonormalize_columns(batch_);
}

std::string PowerSgd::overlap_plan() const {
  if (!requested_overlap_) return "off (host buffers only)";
  return "powersgd's buckets (their P, Q and uncompressed tensors) are exchanged during backward, each once its "
         "gradients are final";
}

std::string PowerSgd::describe() const {
  const int p = comm_.size();
  size_t shape_groups = 0;
  for (const Bucket& bucket : buckets_)
    for (size_t i = bucket.first_matrix; i < bucket.end_matrix; ++i) {
      const Matrix& m = matrices_[i];
      const Matrix* prev = i > bucket.first_matrix ? &matrices_[i - 1] : nullptr;
      shape_groups += !(prev && prev->rows == m.rows && prev->cols == m.cols && prev->rank == m.rank);
    }
  const int64_t bytes = wire_bytes(wire_);
  std::ostringstream out;
  out << "powersgd: rank " << rank_;
  if (accordion())  // sync.powersgd.adaptive: the sizes below are those of the settings in use now
    out << " (adaptive: now " << accordion()->low_fraction() << " of the compressed entries at rank "
        << adaptive_setting(true) << ")";
  out << "; " << matrices_.size() << " tensors compressed as rank-r factors ("
      << compressed_floats_ << " elements -> sum (n + m) r = " << p_floats_ + q_floats_ << " floats, " << shape_groups
      << " shape groups), " << dense_floats_ << " elements of the others sent dense; per step and bucket ("
      << buckets_.size() << " bucket(s) in backward order"
      << (overlap_ || (comm_.size() == 1 && requested_overlap_) ? ", exchanged during backward (sync.overlap)"
                                                                 : ", exchanged after backward")
      << ") one ALLREDUCE_P and one ALLREDUCE_Q, in all " << p_floats_ << " and " << q_floats_ << " + "
      << dense_floats_ << " floats, on the wire as " << wire_dtype_name(wire_) << " (" << bytes
      << " bytes each): " << floats_per_step() * bytes / 1e6 << " MB per rank (dense fp32: " << n_ * 4 / 1e6
      << " MB, " << static_cast<double>(n_ * 4) / std::max<int64_t>(1, floats_per_step() * bytes)
      << "x less); ring traffic per rank " << 2.0 * (p - 1) / p * floats_per_step() * bytes / 1e6 << " MB at P = " << p
      << "; error feedback" << adaptive_note("rank");
  return out.str();
}

void PowerSgd::prepare() {
  if (!started_) {
    p_.resize(p_floats_);
    backend_.fill(p_floats_, 0.f, p_.data());
    std::vector<float> q(q_floats_ + dense_floats_, 0.f);
    for (const Matrix& m : matrices_) seeded_uniform(seed_, static_cast<uint64_t>(m.view), m.cols * m.rank, q.data() + m.q_offset);
    set_q(q);
    started_ = true;
  }
  q_next_.resize(q_.size());
  residual_ = error_feedback().data();  // zeros at the first step (PowerSGD defers no clears)
}

bool PowerSgd::begin_step(SyncBuffers& b, int64_t step) {
  if (!overlap_) return false;
  prepare();
  reducer_.begin(b.grads);
  early_step_ = step;
  return true;
}

void PowerSgd::gradients_ready(int64_t from) {
  if (early_step_ >= 0) reducer_.ready(from);
}

int PowerSgd::finish_early_sends() {
  if (early_step_ < 0) return -1;
  const int nonfinite = reducer_.finish();
  exchanged_step_ = early_step_;
  return nonfinite;
}

void PowerSgd::exchange(size_t index, float* grads) {
  const Bucket& bucket = buckets_[index];
  const auto first = matrices_.begin() + static_cast<std::ptrdiff_t>(bucket.first_matrix);
  const auto last = matrices_.begin() + static_cast<std::ptrdiff_t>(bucket.end_matrix);
  float* p = p_.data();
  float* q = q_next_.data();
  // 1. acc = grad + e in the gradient (the rounding of ErrorFeedback::Step::materialize).
  for (auto m = first; m != last; ++m)
    backend_.add(m->rows * m->cols, grads + m->offset, residual_ + m->offset, grads + m->offset);
  // 2. P = acc Q, the warm-start Q orthonormalized first (the hook does so too), in q_next_.
  backend_.copy(bucket.q_count, q_.data() + bucket.q_offset, q + bucket.q_offset);
  orthonormalize(q, bucket.first_matrix, bucket.end_matrix, /*p_factors=*/false);
  for (auto m = first; m != last; ++m)
    backend_.gemm(false, false, m->rows, m->rank, m->cols, 1.f, grads + m->offset, m->cols, q + m->q_offset, m->rank,
                  0.f, p + m->p_offset, m->rank);
  // 3. The bucket's P in one allreduce (through the wire format; fp16 divided by the world size first).
  const float pre_scale = wire_pre_scale(wire_, comm_.size());
  if (bucket.p_count > 0)
    allreduce_sum_through_wire(comm_, p + bucket.p_offset, bucket.p_count, wire_, pre_scale, wire_scratch_,
                               "ALLREDUCE_P");
  // 4. Orthonormal columns (the sum's scale does not matter).
  orthonormalize(p, bucket.first_matrix, bucket.end_matrix, /*p_factors=*/true);
  // 5. Q = acc^T P.
  for (auto m = first; m != last; ++m)
    backend_.gemm(true, false, m->cols, m->rank, m->rows, 1.f, grads + m->offset, m->cols, p + m->p_offset, m->rank,
                  0.f, q + m->q_offset, m->rank);
  // 6. The bucket's Q and its dense tensors in one allreduce, averaged.
  float* dense = q + bucket.q_offset + bucket.q_count;
  for (const Range& r : bucket.dense) {
    backend_.copy(r.count, grads + r.offset, dense);
    dense += r.count;
  }
  const int64_t total = bucket.q_count + bucket.dense_count;
  if (total > 0) {
    comm_.log().set_ready(reducer_.ready_us(index));  // part of the bucket, for the log's readers
    allreduce_sum_through_wire(comm_, q + bucket.q_offset, total, wire_, pre_scale, wire_scratch_, "ALLREDUCE_Q");
    if (pre_scale == 1.f) backend_.scale(total, 1.f / static_cast<float>(comm_.size()), q + bucket.q_offset);
  }
}

void PowerSgd::commit(float* grads, ErrorFeedback::Step& ef) {
  // 7. grads = P Q^T (the averaged approximation), e = acc - P Q^T; dense tensors get their average.
  ef.materialize(0, 0);  // forms acc (an empty range) even when no tensor is compressed
  const float* p = p_.data();
  const float* q = q_next_.data();
  for (const Matrix& m : matrices_) {
    const int64_t count = m.rows * m.cols;
    ef.adopt(m.offset, grads + m.offset, count);
    backend_.gemm(false, true, m.rows, m.cols, m.rank, 1.f, p + m.p_offset, m.rank, q + m.q_offset, m.rank, 0.f,
                  grads + m.offset, m.cols);
    ef.sent_approximately(m.offset, grads + m.offset, count);
  }
  for (const Bucket& bucket : buckets_) {
    const float* dense = q + bucket.q_offset + bucket.q_count;
    for (const Range& r : bucket.dense) {
      backend_.copy(r.count, dense, grads + r.offset);
      dense += r.count;
    }
  }
  std::swap(q_, q_next_);  // the new warm start
}

SyncStats PowerSgd::compress(SyncBuffers& b, int64_t step, ErrorFeedback::Step& ef) {
  comm_.log().set_step(step, Phase::kCompressed);
  if (exchanged_step_ != step) {
    prepare();
    reducer_.run_all(b.grads);
  }
  early_step_ = exchanged_step_ = -1;
  commit(b.grads, ef);
  ++steps_;
  return {Phase::kCompressed, static_cast<double>(floats_per_step()) / std::max<int64_t>(1, n_)};
}

std::vector<const PowerSgd::Matrix*> PowerSgd::in_model_order() const {
  std::vector<const Matrix*> order;
  for (const Matrix& m : matrices_) order.push_back(&m);
  std::sort(order.begin(), order.end(), [](const Matrix* a, const Matrix* b) { return a->view < b->view; });
  return order;
}

void PowerSgd::save_state(std::ostream& out) const {
  write_sync_header(out, "powersgd", 3);
  write_pod(out, n_);
  write_pod(out, rank_);
  write_pod(out, static_cast<int64_t>(matrices_.size()));
  write_pod(out, compressed_floats_);
  write_pod(out, q_floats_);
  write_pod(out, seed_);
  write_pod(out, steps_);
  write_pod(out, static_cast<uint8_t>(started_));
  if (!started_) return;
  const std::vector<float> q = q_on_host();
  for (const Matrix* m : in_model_order())
    out.write(reinterpret_cast<const char*>(q.data() + m->q_offset),
              static_cast<std::streamsize>(m->cols * m->rank * sizeof(float)));
}

void PowerSgd::load_state(std::istream& in) {
  read_sync_header(in, "powersgd", 3);
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
    throw std::runtime_error("powersgd state was saved with rank = " + std::to_string(rank) + ", this run has " +
                             std::to_string(rank_));
  if (matrices != static_cast<int64_t>(matrices_.size()) || compressed_floats != compressed_floats_ || q_floats != q_floats_)
    throw std::runtime_error("powersgd state compresses other tensors (saved with another min_compression_rate or keep_dense?)");
  if (started) {
    std::vector<float> q(q_floats_ + dense_floats_, 0.f);
    for (const Matrix* m : in_model_order())
      in.read(reinterpret_cast<char*>(q.data() + m->q_offset),
              static_cast<std::streamsize>(m->cols * m->rank * sizeof(float)));
    if (!in) throw std::runtime_error("powersgd state: truncated");
    set_q(q);
    p_.resize(p_floats_);
    backend_.fill(p_floats_, 0.f, p_.data());
  } else {
    q_.resize(0);
    p_.resize(0);
  }
  started_ = started != 0;
  seed_ = seed;
  steps_ = steps;
}

}  // namespace trainer::comm
