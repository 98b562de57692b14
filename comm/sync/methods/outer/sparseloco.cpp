#include "comm/sync/methods/outer/sparseloco.h"

#include <algorithm>
#include <cstring>
#include <istream>
#include <sstream>
#include <stdexcept>

#include "comm/sync/methods/dense/dense.h"
#include "comm/sync/codecs/rank_mean.h"
#include "comm/sync/registry.h"
#include "comm/sync/sync_state.h"

namespace trainer::comm {

// What save() writes beside the shared parts (outer_loop.h), for load() and load_resharded().
struct SparseLoco::State {
  SavedOuter outer;                 // the inner steps and theta_outer
  std::vector<float> accumulator;   // empty before the first step
  int32_t in_flight = -1;
  int32_t in_flight_ranks = 0;
  std::vector<uint8_t> gathered;    // the in-flight fragment's payloads
};

namespace {

SparseLocoOptions sparseloco_options(const SyncSettings& o) { return options_of<SparseLocoOptions>(o); }

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
  m.concurrent_calls = [](const SyncSettings& o) { return sparseloco_options(o).sync_delay > 0 && o.overlap; };
  m.make = [](const SyncOptions& o, const SyncContext& c) -> std::unique_ptr<GradientSync> {
    return std::make_unique<SparseLoco>(c.comm, c.backend, c.n, c.views, sparseloco_options(o),
                                        bucket_elements(o.bucket_mb), o.overlap);
  };
  return m;
}

SparseLoco::SparseLoco(Communicator& comm, models::Backend& backend, int64_t n,
                       const std::vector<models::ParamView>* views, const SparseLocoOptions& o,
                       int64_t bucket_elements, bool overlap)
    : OuterLoop(comm, backend, n, views, o, bucket_elements, OuterDType::kF32, overlap),
      options_(o),
      accumulator_(backend),
      update_(backend) {
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
      << (options_.sync_delay > 0 && overlapped() ? ", the allgather runs on a communication thread" : "")
      << "; batch-norm statistics averaged every " << H << " steps (ALLREDUCE_BN_STATS); extra memory "
      << mb(8.0 * static_cast<double>(n_)) << " MB (theta_outer, the error-feedback accumulator)";
  return out.str();
}

void SparseLoco::start_outer() {
  accumulator_.resize(n_);
  backend_.fill(n_, 0.f, accumulator_.data());
}

void SparseLoco::send(const SyncBuffers& b, const Fragment& fr, int f, int64_t step) {
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
  transfer().start_exchange(
      [=](Communicator& c) { c.allgather(payload, bytes, gathered, DType::kU8, "ALLGATHER_SPARSELOCO"); },
      "sparseloco: the outer allgather", step, Phase::kCompressed);
  in_flight_ranks_ = comm_.size();
}

void SparseLoco::apply(SyncBuffers& b, const Fragment& fr, int f) {
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
  in_flight_ranks_ = 0;
}

// The format: the header, the schedule's keys, value_bits and n, density, the inner steps and
// theta_outer, the accumulator, the fragment in flight and its payload count, the payloads.
void SparseLoco::save(std::ostream& out) const {
  transfer().wait();  // a fragment in flight is saved with its payloads gathered
  write_sync_header(out, "sparseloco", 1);
  write_schedule(out);
  write_pod(out, options_.value_bits);
  write_pod(out, n_);
  write_pod(out, options_.density);
  write_outer(out);
  const std::vector<float> accumulator = models::host_copy(accumulator_);
  out.write(reinterpret_cast<const char*>(accumulator.data()),
            static_cast<std::streamsize>(accumulator.size() * sizeof(float)));
  write_pod(out, static_cast<int32_t>(in_flight_));
  write_pod(out, static_cast<int32_t>(in_flight_ranks_));
  const int64_t bytes = in_flight_ >= 0 ? in_flight_ranks_ * codecs_[static_cast<size_t>(in_flight_)].payload_bytes() : 0;
  write_pod(out, bytes);
  out.write(reinterpret_cast<const char*>(gathered_.data()), static_cast<std::streamsize>(bytes));
}

// Reads a state and checks it against this run's options; throws std::runtime_error naming the key
// or what is damaged.
SparseLoco::State SparseLoco::read_state(std::istream& in) const {
  read_sync_header(in, "sparseloco", 1);
  const std::string depends = "the schedule, the chunks and the payloads in flight";
  read_schedule(in, depends);
  const auto value_bits = read_pod<int64_t>(in);
  const auto n = read_pod<int64_t>(in);
  const auto density = read_pod<double>(in);
  if (!in) throw std::runtime_error("sparseloco state: truncated");
  auto check = [&](const char* key, auto saved, auto now) {
    if (saved != now) {
      std::ostringstream line;
      line << "sparseloco state was saved with " << key << " = " << saved << ", this run has " << now << " ("
           << depends << " depend on it)";
      throw std::runtime_error(line.str());
    }
  };
  check("value_bits", value_bits, options_.value_bits);
  check("density", density, options_.density);
  if (n != n_)
    throw std::runtime_error("sparseloco state holds " + std::to_string(n) + " parameters, the model has " +
                             std::to_string(n_));
  State s;
  s.outer = read_outer(in);
  s.accumulator.resize(s.outer.outer.size());
  in.read(reinterpret_cast<char*>(s.accumulator.data()),
          static_cast<std::streamsize>(s.accumulator.size() * sizeof(float)));
  s.in_flight = read_pod<int32_t>(in);
  s.in_flight_ranks = read_pod<int32_t>(in);
  const auto bytes = read_pod<int64_t>(in);
  if (!in || s.in_flight < -1 || s.in_flight >= options_.fragments || bytes < 0 || bytes > (int64_t{1} << 40) ||
      (s.in_flight >= 0) != (s.in_flight_ranks > 0))
    throw std::runtime_error("sparseloco state: truncated or damaged");
  s.gathered.resize(static_cast<size_t>(bytes));
  in.read(reinterpret_cast<char*>(s.gathered.data()), bytes);
  if (!in) throw std::runtime_error("sparseloco state: truncated payloads in flight");
  if (s.in_flight >= 0 &&
      bytes != s.in_flight_ranks * codecs_[static_cast<size_t>(s.in_flight)].payload_bytes())
    throw std::runtime_error("sparseloco state: the payloads in flight have the wrong size");
  return s;
}

void SparseLoco::adopt(State&& s) {
  adopt_outer(s.outer);
  accumulator_.resize(static_cast<int64_t>(s.accumulator.size()));
  models::copy_to_device(backend_, s.accumulator.data(), accumulator_.size(), accumulator_.data());
  in_flight_ = s.in_flight;
  in_flight_ranks_ = s.in_flight_ranks;
  if (gathered_.size() < s.gathered.size()) gathered_.resize(s.gathered.size());
  std::copy(s.gathered.begin(), s.gathered.end(), gathered_.begin());
}

void SparseLoco::load(std::istream& in) {
  transfer().wait();  // it writes gathered_, which the loaded state replaces
  adopt(read_state(in));
}

std::string SparseLoco::load_resharded(const std::vector<std::string>& states) {
  if (states.empty()) throw std::runtime_error("sparseloco: no saved state to resume from");
  transfer().wait();
  std::vector<State> saved;
  for (const std::string& bytes : states) {
    std::istringstream in(bytes);
    saved.push_back(read_state(in));
  }
  State& first = saved.front();
  // Everything but the accumulator is the same on every rank; the accumulator becomes their mean.
  RankMean mean(first.accumulator.empty() ? 0 : n_);
  for (size_t r = 0; r < saved.size(); ++r) {
    const State& s = saved[r];
    if (s.outer.inner_steps != first.outer.inner_steps || s.outer.outer != first.outer.outer ||
        s.in_flight != first.in_flight || s.in_flight_ranks != first.in_flight_ranks || s.gathered != first.gathered ||
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
