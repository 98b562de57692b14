#include "comm/sync/methods/outer/outer_loop.h"

#include <stdexcept>

#include "comm/sync/methods/dense/dense.h"
#include "comm/sync/sync_state.h"

namespace trainer::comm {

OuterLoop::OuterLoop(Communicator& comm, models::Backend& backend, int64_t n,
                     const std::vector<models::ParamView>* views, const OuterScheduleOptions& schedule,
                     int64_t bucket_elements, OuterDType wire, bool overlap)
    : comm_(comm),
      backend_(backend),
      n_(n),
      schedule_options_(schedule),
      bucket_elements_(bucket_elements),
      fragments_(plan_fragments(n, views, schedule.fragments)),
      outer_(backend),
      schedule_(schedule.period, schedule.fragments, schedule.sync_delay),
      transfer_(std::make_unique<OuterTransfer>(comm, backend, wire, bucket_elements,
                                                overlap && schedule.sync_delay > 0)) {}

SyncStats OuterLoop::reduce(SyncBuffers& b, int64_t step) {
  comm_.log().set_step(step, Phase::kCompressed);
  // theta_outer starts as rank 0's parameters of the first step. Every rank holds the same ones in
  // a trainer run (one seed, or the dense warmup's result); the broadcast makes the invariant the
  // family rests on (one theta_outer on every rank) hold whatever the caller did, at 4n bytes once.
  if (outer_.empty()) {
    outer_.resize(n_);
    backend_.copy(n_, b.params, outer_.data());
    comm_.broadcast(outer_.data(), n_, DType::kF32, 0, "BROADCAST_OUTER");
    start_outer();
  }
  transfer_->prepare();  // collective the first time (a resumed run's first step too)
  return {Phase::kCompressed, 0.0};
}

void OuterLoop::after_step(SyncBuffers& b, int64_t step) {
  ++inner_steps_;
  const int start = schedule_.starts_after(inner_steps_);
  if (start >= 0) {
    if (in_flight_ >= 0) throw std::logic_error(name() + ": a fragment is still in flight");
    send(b, fragments_[static_cast<size_t>(start)], start, step);
    in_flight_ = start;
  }
  const int finish = schedule_.finishes_after(inner_steps_);
  if (finish >= 0) {
    if (in_flight_ != finish) throw std::logic_error(name() + ": the fragment to finish was not sent");
    transfer_->wait();
    apply(b, fragments_[static_cast<size_t>(finish)], finish);
    in_flight_ = -1;
    if (finish + 1 == static_cast<int>(fragments_.size()) && b.n_state > 0)
      allreduce_average(comm_, backend_, b.state, b.n_state, bucket_elements_, "ALLREDUCE_BN_STATS");
  }
}

std::string OuterLoop::overlap_plan() const {
  if (schedule_options_.sync_delay > 0)
    return "none during backward; each " + name() + " fragment's " + exchange() +
           " runs on a communication thread during the " + std::to_string(schedule_options_.sync_delay) +
           " step(s) after its send";
  return "none (" + name() + " syncs parameters after the optimizer step, so it starts after backward)";
}

void OuterLoop::write_schedule(std::ostream& out) const {
  write_pod(out, schedule_options_.period);
  write_pod(out, schedule_options_.fragments);
  write_pod(out, schedule_options_.sync_delay);
}

void OuterLoop::read_schedule(std::istream& in, const std::string& depends) const {
  const auto period = read_pod<int64_t>(in);
  const auto fragments = read_pod<int64_t>(in);
  const auto delay = read_pod<int64_t>(in);
  if (!in) throw std::runtime_error(name() + " state: truncated");
  const auto check = [&](const char* key, int64_t saved, int64_t now) {
    if (saved != now)
      throw std::runtime_error(name() + " state was saved with " + key + " = " + std::to_string(saved) +
                               ", this run has " + std::to_string(now) + " (" + depends + " depend on it)");
  };
  check("period", period, schedule_options_.period);
  check("fragments", fragments, schedule_options_.fragments);
  check("sync_delay", delay, schedule_options_.sync_delay);
}

void OuterLoop::write_outer(std::ostream& out) const {
  write_pod(out, inner_steps_);
  write_pod(out, static_cast<uint8_t>(!outer_.empty()));
  const std::vector<float> host = models::host_copy(outer_);  // checkpoints are the same files on any device
  out.write(reinterpret_cast<const char*>(host.data()), static_cast<std::streamsize>(host.size() * sizeof(float)));
}

OuterLoop::SavedOuter OuterLoop::read_outer(std::istream& in) const {
  SavedOuter s;
  s.inner_steps = read_pod<int64_t>(in);
  const bool started = read_pod<uint8_t>(in) != 0;
  s.outer.resize(started ? static_cast<size_t>(n_) : 0);
  in.read(reinterpret_cast<char*>(s.outer.data()), static_cast<std::streamsize>(s.outer.size() * sizeof(float)));
  if (!in || s.inner_steps < 0) throw std::runtime_error(name() + " state: truncated");
  return s;
}

void OuterLoop::adopt_outer(const SavedOuter& saved) {
  inner_steps_ = saved.inner_steps;
  outer_.resize(static_cast<int64_t>(saved.outer.size()));
  models::copy_to_device(backend_, saved.outer.data(), outer_.size(), outer_.data());
}

}  // namespace trainer::comm
