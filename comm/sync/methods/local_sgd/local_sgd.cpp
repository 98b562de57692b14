#include "comm/sync/methods/local_sgd/local_sgd.h"

#include <algorithm>
#include <istream>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "comm/sync/methods/dense/dense.h"
#include "comm/sync/registry.h"
#include "comm/sync/sync_state.h"

namespace trainer::comm {

SyncMethod local_sgd_method() {
  SyncMethod m;
  m.name = "local_sgd";
  m.doc = "local steps, parameters averaged every sync.local_sgd.period steps";
  m.can.device_buffers = true;
  m.can.keeps_parameters_equal = false;
  declare_options<LocalSgdOptions>(m);
  m.make = [](const SyncOptions& o, const SyncContext& c) -> std::unique_ptr<GradientSync> {
    return std::make_unique<LocalSgd>(c.comm, c.n, o.bucket_mb, options_of<LocalSgdOptions>(o).period, c.backend);
  };
  return m;
}

LocalSgd::LocalSgd(Communicator& comm, int64_t n, double bucket_mb, int64_t period, models::Backend& backend)
    : comm_(comm),
      n_(n),
      bucket_elements_(bucket_elements(bucket_mb)),
      period_(period),
      backend_(backend) {
  if (period < 1) throw std::invalid_argument("local_sgd: period must be >= 1");
}

std::string LocalSgd::describe() const {
  std::ostringstream out;
  out << "local_sgd: local optimizer steps; parameters (as the change since the last averaging) and batch-norm "
         "statistics averaged "
         "(ALLREDUCE_PARAMS) after every "
      << period_ << " step(s): " << n_ * 4 / 1e6 << " MB per averaging, " << n_ * 4 / 1e6 / period_
      << " MB per step on average";
  return out.str();
}

SyncStats LocalSgd::reduce(SyncBuffers& b, int64_t step) {
  comm_.log().set_step(step, Phase::kCompressed);
  // The first anchor: rank 0's parameters of the first step. Every rank holds the same ones in a
  // trainer run (one seed, or the dense warmup's result); the broadcast makes the invariant the
  // averaging rests on (one anchor on every rank) hold whatever the caller did, at 4n bytes once.
  if (anchor_.empty() && comm_.size() > 1) {
    anchor_ = models::DeviceBuffer(backend_, n_);
    change_ = models::DeviceBuffer(backend_, n_);
    backend_.copy(n_, b.params, anchor_.data());
    comm_.broadcast(anchor_.data(), n_, DType::kF32, 0, "BROADCAST_ANCHOR");
  }
  return {Phase::kCompressed, 0.0};
}

void LocalSgd::after_step(SyncBuffers& b, int64_t step) {
  if ((step + 1) % period_ != 0 || comm_.size() == 1) return;
  // change = anchor - theta (as -theta + anchor: one rounding, the same as the subtraction)
  float* change = change_.data();
  backend_.copy(n_, b.params, change);
  backend_.scale(n_, -1.f, change);
  backend_.add(n_, anchor_.data(), change, change);
  allreduce_average(comm_, backend_, change, n_, bucket_elements_, "ALLREDUCE_PARAMS");
  // theta = anchor - mean(change), the next anchor
  backend_.scale(n_, -1.f, change);
  backend_.add(n_, anchor_.data(), change, b.params);
  backend_.copy(n_, b.params, anchor_.data());
  if (b.n_state > 0) allreduce_average(comm_, backend_, b.state, b.n_state, bucket_elements_, "ALLREDUCE_PARAMS");
}

// Version 2 added the anchor (version 1 states, from before it, cannot resume mid-period exactly).
void LocalSgd::save(std::ostream& out) const {
  write_sync_header(out, "local_sgd", 2);
  write_pod(out, period_);
  write_pod(out, static_cast<uint8_t>(!anchor_.empty()));
  if (anchor_.empty()) return;
  const std::vector<float> host = models::host_copy(anchor_, n_);
  out.write(reinterpret_cast<const char*>(host.data()), static_cast<std::streamsize>(n_ * sizeof(float)));
}

void LocalSgd::load(std::istream& in) {
  read_sync_header(in, "local_sgd", 2);
  const auto period = read_pod<int64_t>(in);
  const auto has_anchor = read_pod<uint8_t>(in);
  if (!in) throw std::runtime_error("local_sgd state: truncated");
  if (period != period_)
    throw std::runtime_error("local_sgd state was saved with period = " + std::to_string(period) +
                             ", this run has " + std::to_string(period_));
  std::vector<float> host(has_anchor ? static_cast<size_t>(n_) : 0);
  in.read(reinterpret_cast<char*>(host.data()), static_cast<std::streamsize>(host.size() * sizeof(float)));
  if (!in) throw std::runtime_error("local_sgd state: truncated anchor");
  if (!has_anchor) {
    anchor_ = models::DeviceBuffer();
    return;
  }
  anchor_ = models::DeviceBuffer(backend_, n_);
  change_ = models::DeviceBuffer(backend_, n_);
  models::copy_to_device(backend_, host.data(), n_, anchor_.data());
}

}  // namespace trainer::comm
