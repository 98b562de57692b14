#include "comm/sync/sparseloco.h"

#include <algorithm>
#include <cstring>
#include <istream>
#include <sstream>
#include <stdexcept>

#include "comm/sync/dense.h"
#include "comm/sync/rank_mean.h"
#include "comm/sync/registry.h"
#include "comm/sync/sync_state.h"

namespace trainer::comm {

// Everything save() writes, in its order; load(), load_resharded() and save() share it.
struct SparseLoco::State {
  int64_t period = 0, fragments = 0, delay = 0, value_bits = 0, n = 0;
  double density = 0;
  int64_t inner_steps = 0;
  std::vector<float> outer, accumulator;  // empty before the first step
  int32_t in_flight = -1;
  int32_t in_flight_ranks = 0;
  std::vector<uint8_t> gathered;  // the in-flight fragment's payloads

  void write(std::ostream& out) const {
    write_sync_header(out, "sparseloco", 1);
    for (int64_t v : {period, fragments, delay, value_bits, n}) write_pod(out, v);
    write_pod(out, density);
    write_pod(out, inner_steps);
    write_pod(out, static_cast<uint8_t>(!outer.empty()));
    write_floats(out, outer);
    write_floats(out, accumulator);
    write_pod(out, in_flight);
    write_pod(out, in_flight_ranks);
    write_pod(out, static_cast<int64_t>(gathered.size()));
    out.write(reinterpret_cast<const char*>(gathered.data()), static_cast<std::streamsize>(gathered.size()));
  }
  // Reads a state and checks it against the run's options (`o`, `n_now`); throws std::runtime_error
  // naming the key or what is damaged.
  static State read(std::istream& in, const SparseLocoOptions& o, int64_t n_now) {
    read_sync_header(in, "sparseloco", 1);
    State s;
    for (int64_t* v : {&s.period, &s.fragments, &s.delay, &s.value_bits, &s.n}) *v = read_pod<int64_t>(in);
    s.density = read_pod<double>(in);
    if (!in) throw std::runtime_error("sparseloco state: truncated");
    auto check = [](const char* key, auto saved, auto now) {
      if (saved != now) {
        std::ostringstream line;
        line << "sparseloco state was saved with " << key << " = " << saved << ", this run has " << now
             << " (the schedule, the chunks and the payloads in flight depend on it)";
        throw std::runtime_error(line.str());
      }
    };
    check("period", s.period, o.period);
    check("fragments", s.fragments, o.fragments);
    check("sync_delay", s.delay, o.sync_delay);
    check("value_bits", s.value_bits, o.value_bits);
    check("density", s.density, o.density);
    if (s.n != n_now)
      throw std::runtime_error("sparseloco state holds " + std::to_string(s.n) + " parameters, the model has " +
                               std::to_string(n_now));
    s.inner_steps = read_pod<int64_t>(in);
    const bool started = read_pod<uint8_t>(in) != 0;
    s.outer.resize(started ? static_cast<size_t>(s.n) : 0);
    s.accumulator.resize(s.outer.size());
    read_floats(in, s.outer);
    read_floats(in, s.accumulator);
    s.in_flight = read_pod<int32_t>(in);
    s.in_flight_ranks = read_pod<int32_t>(in);
    const auto bytes = read_pod<int64_t>(in);
    if (!in || s.inner_steps < 0 || s.in_flight < -1 || s.in_flight >= s.fragments || bytes < 0 ||
        bytes > (int64_t{1} << 40) || (s.in_flight >= 0) != (s.in_flight_ranks > 0))
      throw std::runtime_error("sparseloco state: truncated or damaged");
    s.gathered.resize(static_cast<size_t>(bytes));
    in.read(reinterpret_cast<char*>(s.gathered.data()), bytes);
    if (!in) throw std::runtime_error("sparseloco state: truncated payloads in flight");
    return s;
  }

 private:
  static void write_floats(std::ostream& out, const std::vector<float>& v) {
    out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  }
  static void read_floats(std::istream& in, std::vector<float>& v) {
    in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  }
};

namespace {

SparseLocoOptions sparseloco_options(const SyncOptions& o) { return options_of<SparseLocoOptions>(o); }

double mb(double bytes) { return bytes / 1e6; }

}  // namespace

std::vector<SyncOptionProblem> sparseloco_problems(const SparseLocoOptions& o) {
  std::vector<SyncOptionProblem> found;
  const std::string schedule = fragment_schedule_problem(o.period, o.fragments, o.sync_delay);
  if (!schedule.empty()) found.push_back({{"period", "fragments", "sync_delay"}, schedule});
  if (o.value_bits != 2 && o.value_bits != 4 && o.value_bits != 8 && o.value_bits != 32)
    found.push_back(
        {{"value_bits"}, "value_bits = " + std::to_string(o.value_bits) + " must be 2, 4, 8 or 32"});
  if (!(o.density > 0 && o.density <= 1))
    found.push_back({{"density"}, "density must be in (0, 1]"});
  if (!(o.error_decay >= 0 && o.error_decay <= 1))
    found.push_back({{"error_decay"}, "error_decay must be in [0, 1]"});
  if (!(o.outer_lr > 0)) found.push_back({{"outer_lr"}, "outer_lr must be > 0"});
  return found;
}

SyncMethod sparseloco_method() {
  SyncMethod m;
  m.name = "sparseloco";
  m.doc =
      "SparseLoCo: DiLoCo's local steps, with each rank's pseudo-gradient added to a decaying error-feedback "
      "accumulator, sent as chunk-wise top-k in 2 bits per value (an allgather), and the decoded mean stepping "
      "the shared parameters by plain SGD";
  m.can.keeps_parameters_equal = false;
  m.can.device_buffers = true;  // the element-wise steps on the backend, the codec on a host copy
  declare_options<SparseLocoOptions>(m);
  m.check = [](const SyncOptions& o) { return sparseloco_problems(sparseloco_options(o)); };
  m.concurrent_calls = [](const SyncOptions& o) { return sparseloco_options(o).sync_delay > 0 && o.overlap; };
  m.make = [](const SyncOptions& o, const SyncContext& c) -> std::unique_ptr<GradientSync> {
    return std::make_unique<SparseLoco>(c.comm, c.backend, c.n, c.views, sparseloco_options(o),
                                        bucket_elements(o.bucket_mb), o.overlap);
  };
  return m;
}

SparseLoco::SparseLoco(Communicator& comm, models::Backend& backend, int64_t n,
                       const std::vector<models::ParamView>* views, const SparseLocoOptions& o,
                       int64_t bucket_elements, bool overlap)
    : comm_(comm),
      backend_(backend),
      n_(n),
      options_(o),
      bucket_elements_(bucket_elements),
      fragments_(plan_fragments(n, views, o.fragments)),
      schedule_(o.period, o.fragments, o.sync_delay),
      outer_(backend),
      accumulator_(backend),
      update_(backend),
      transfer_(std::make_unique<OuterTransfer>(comm, backend, OuterDType::kF32, bucket_elements,
                                                overlap && o.sync_delay > 0)) {
  for (const SyncOptionProblem& problem : sparseloco_problems(o)) throw std::invalid_argument(problem.message);
  int64_t largest = 0, largest_payload = 0;
  for (const Fragment& f : fragments_) {
    codecs_.emplace_back(plan_chunks(f, views, o.density), static_cast<int>(o.value_bits));
    largest = std::max(largest, f.size());
    largest_payload = std::max(largest_payload, codecs_.back().payload_bytes());
  }
  update_.resize(largest);
  host_.resize(static_cast<size_t>(largest));
  payload_.resize(static_cast<size_t>(largest_payload));
  gathered_.resize(static_cast<size_t>(largest_payload * comm.size()));
}

std::string SparseLoco::overlap_plan() const {
  if (options_.sync_delay > 0)
    return "none during backward; each sparseloco fragment's allgather runs on a communication thread during the " +
           std::to_string(options_.sync_delay) + " step(s) after its send";
  return "none (sparseloco syncs parameters after the optimizer step, so it starts after backward)";
}

std::string SparseLoco::describe() const {
  const int p = comm_.size();
  const int64_t H = options_.period;
  double payloads = 0, largest = 0;
  int64_t kept = 0, chunks = 0;
  for (const ChunkCodec& c : codecs_) {
    payloads += static_cast<double>(c.payload_bytes());
    largest = std::max(largest, static_cast<double>(c.payload_bytes()));
    kept += c.kept();
    chunks += static_cast<int64_t>(c.chunks().size());
  }
  const double sent_per_round = payloads * (p - 1);  // the allgather's ring: each payload to P - 1 ranks
  const double diloco_per_round = 2.0 * (p - 1) / p * 4.0 * static_cast<double>(n_);
  std::ostringstream out;
  out << "sparseloco: " << H << " inner steps per fragment sync round; e = " << options_.error_decay
      << " e + (theta_outer - theta_local), top " << options_.density * 100 << "% of each of " << chunks
      << " chunks (" << kept << " entries) in " << options_.value_bits << "-bit values with a scale per chunk, "
      << "allgathered (ALLGATHER_SPARSELOCO); theta_outer -= " << options_.outer_lr << " x their decoded mean"
      << "\n  " << options_.fragments << " fragment(s), one synced every " << H / options_.fragments
      << " step(s); one payload " << mb(payloads) << " MB per round (largest fragment's " << mb(largest)
      << " MB) against " << mb(4.0 * static_cast<double>(n_)) << " MB of fp32 (" << 4.0 * static_cast<double>(n_) / payloads
      << "x); sent per rank at P = " << p << ": " << mb(sent_per_round / static_cast<double>(H))
      << " MB per step on average (diloco's fp32 ring allreduce: " << mb(diloco_per_round / static_cast<double>(H))
      << ")"
      << "\n  sync delay " << options_.sync_delay << " step(s)"
      << (options_.sync_delay > 0 && transfer_->overlapped() ? ", the allgather runs on a communication thread" : "")
      << "; batch-norm statistics averaged every " << H << " steps (ALLREDUCE_BN_STATS); extra memory "
      << mb(8.0 * static_cast<double>(n_)) << " MB (theta_outer, the error-feedback accumulator)";
  return out.str();
}

SyncStats SparseLoco::reduce(SyncBuffers& b, int64_t step) {
  comm_.log().set_step(step, Phase::kCompressed);
  // theta_outer starts as rank 0's parameters (diloco.cpp says why the broadcast), e at zero.
  if (outer_.empty()) {
    outer_.resize(n_);
    backend_.copy(n_, b.params, outer_.data());
    comm_.broadcast(outer_.data(), n_, DType::kF32, 0, "BROADCAST_OUTER");
    accumulator_.resize(n_);
    backend_.fill(n_, 0.f, accumulator_.data());
  }
  transfer_->prepare();  // collective the first time (a resumed run's first step too)
  return {Phase::kCompressed, 0.0};
}

void SparseLoco::after_step(SyncBuffers& b, int64_t step) {
  ++inner_steps_;
  const int start = schedule_.starts_after(inner_steps_);
  if (start >= 0) start_sync(b, start, step);
  const int finish = schedule_.finishes_after(inner_steps_);
  if (finish >= 0) finish_sync(b, finish);
}

void SparseLoco::start_sync(const SyncBuffers& b, int f, int64_t step) {
  if (in_flight_ >= 0) throw std::logic_error("sparseloco: a fragment is still in flight");
  const Fragment& fr = fragments_[static_cast<size_t>(f)];
  const ChunkCodec& codec = codecs_[static_cast<size_t>(f)];
  // e = beta e + (theta_outer - theta_local), each op rounded once (the backend's loops: no fused
  // multiply-add, as scripts/make_sparseloco_fixtures.py computes it).
  float* e = accumulator_.data() + fr.begin;
  float* delta = update_.data();
  backend_.subtract(fr.size(), outer_.data() + fr.begin, b.params + fr.begin, delta);
  backend_.scale(fr.size(), static_cast<float>(options_.error_decay), e);
  backend_.add(fr.size(), e, delta, e);
  // The codec on the host: e out, encoded, e -= what was sent, e back.
  models::copy_to_host(backend_, e, fr.size(), host_.data());
  codec.encode(host_.data(), payload_.data(), fr.begin);
  codec.decode_add(payload_.data(), -1.f, host_.data(), fr.begin);
  models::copy_to_device(backend_, host_.data(), fr.size(), e);
  const int64_t bytes = codec.payload_bytes();
  uint8_t* gathered = gathered_.data();
  const uint8_t* payload = payload_.data();
  transfer_->start_exchange(
      [=](Communicator& c) { c.allgather(payload, bytes, gathered, DType::kU8, "ALLGATHER_SPARSELOCO"); },
      "sparseloco: the outer allgather", step, Phase::kCompressed);
  in_flight_ = f;
  in_flight_ranks_ = comm_.size();
}

void SparseLoco::finish_sync(SyncBuffers& b, int f) {
  if (in_flight_ != f) throw std::logic_error("sparseloco: the fragment to finish was not sent");
  transfer_->wait();
  const Fragment& fr = fragments_[static_cast<size_t>(f)];
  const ChunkCodec& codec = codecs_[static_cast<size_t>(f)];
  // The sum over ranks in rank order, on the host in a buffer of the fragment's size.
  std::fill(host_.begin(), host_.begin() + fr.size(), 0.f);
  for (int r = 0; r < in_flight_ranks_; ++r)
    codec.decode_add(gathered_.data() + static_cast<size_t>(r) * static_cast<size_t>(codec.payload_bytes()), 1.f,
                     host_.data(), fr.begin);
  float* sum = update_.data();
  models::copy_to_device(backend_, host_.data(), fr.size(), sum);
  float* outer = outer_.data() + fr.begin;
  backend_.scale(fr.size(), static_cast<float>(options_.outer_lr / in_flight_ranks_), sum);
  backend_.subtract(fr.size(), outer, sum, outer);
  backend_.copy(fr.size(), outer, b.params + fr.begin);
  in_flight_ = -1;
  in_flight_ranks_ = 0;
  if (f + 1 == static_cast<int>(fragments_.size()) && b.n_state > 0)
    allreduce_average(comm_, backend_, b.state, b.n_state, bucket_elements_, "ALLREDUCE_BN_STATS");
}

SparseLoco::State SparseLoco::state() const {
  transfer_->wait();  // a fragment in flight is saved with its payloads gathered
  State s;
  s.period = options_.period;
  s.fragments = options_.fragments;
  s.delay = options_.sync_delay;
  s.value_bits = options_.value_bits;
  s.n = n_;
  s.density = options_.density;
  s.inner_steps = inner_steps_;
  s.outer = models::host_copy(outer_);
  s.accumulator = models::host_copy(accumulator_);
  s.in_flight = in_flight_;
  s.in_flight_ranks = in_flight_ranks_;
  if (in_flight_ >= 0)
    s.gathered.assign(gathered_.begin(),
                      gathered_.begin() + in_flight_ranks_ * codecs_[static_cast<size_t>(in_flight_)].payload_bytes());
  return s;
}

void SparseLoco::adopt(State&& s) {
  if (s.in_flight >= 0 &&
      static_cast<int64_t>(s.gathered.size()) != s.in_flight_ranks * codecs_[static_cast<size_t>(s.in_flight)].payload_bytes())
    throw std::runtime_error("sparseloco state: the payloads in flight have the wrong size");
  inner_steps_ = s.inner_steps;
  outer_.resize(static_cast<int64_t>(s.outer.size()));
  models::copy_to_device(backend_, s.outer.data(), outer_.size(), outer_.data());
  accumulator_.resize(static_cast<int64_t>(s.accumulator.size()));
  models::copy_to_device(backend_, s.accumulator.data(), accumulator_.size(), accumulator_.data());
  in_flight_ = s.in_flight;
  in_flight_ranks_ = s.in_flight_ranks;
  if (gathered_.size() < s.gathered.size()) gathered_.resize(s.gathered.size());
  std::copy(s.gathered.begin(), s.gathered.end(), gathered_.begin());
}

void SparseLoco::save(std::ostream& out) const { state().write(out); }

void SparseLoco::load(std::istream& in) {
  transfer_->wait();  // it writes gathered_, which the loaded state replaces
  adopt(State::read(in, options_, n_));
}

std::string SparseLoco::load_resharded(const std::vector<std::string>& states) {
  if (states.empty()) throw std::runtime_error("sparseloco: no saved state to resume from");
  transfer_->wait();
  std::vector<State> saved;
  for (const std::string& bytes : states) {
    std::istringstream in(bytes);
    saved.push_back(State::read(in, options_, n_));
  }
  State& first = saved.front();
  // Everything but the accumulator is the same on every rank; the accumulator becomes their mean.
  RankMean mean(first.accumulator.empty() ? 0 : n_);
  for (size_t r = 0; r < saved.size(); ++r) {
    const State& s = saved[r];
    if (s.inner_steps != first.inner_steps || s.outer != first.outer || s.in_flight != first.in_flight ||
        s.in_flight_ranks != first.in_flight_ranks || s.gathered != first.gathered ||
        s.accumulator.size() != first.accumulator.size())
      throw std::runtime_error("sparseloco state of saved rank " + std::to_string(r) +
                               " differs from rank 0's in theta_outer, the schedule or the payloads in flight");
    if (!s.accumulator.empty()) mean.add(s.accumulator.data());
  }
  if (!first.accumulator.empty()) first.accumulator = mean.mean();
  adopt(std::move(first));
  return "sparseloco state: theta_outer kept, each rank's error-feedback accumulator the mean of the " +
         std::to_string(states.size()) + " saved ranks'";
}

}  // namespace trainer::comm
