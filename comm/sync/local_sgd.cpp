#include "comm/sync/local_sgd.h"

#include <algorithm>
#include <istream>
#include <sstream>
#include <stdexcept>

#include "comm/sync/dense.h"
#include "comm/sync/sync_state.h"

namespace trainer::comm {

LocalSgd::LocalSgd(Communicator& comm, int64_t n, double bucket_mb, int64_t period, models::Backend& backend)
    : comm_(comm),
      n_(n),
      bucket_elements_(bucket_elements(bucket_mb)),
      period_(period),
      backend_(backend) {
  if (period < 1) throw std::invalid_argument("local_sgd: sync.period must be >= 1");
}

std::string LocalSgd::describe() const {
  std::ostringstream out;
  out << "local_sgd: local optimizer steps; parameters and batch-norm statistics averaged "
         "(ALLREDUCE_PARAMS) after every "
      << period_ << " step(s): " << n_ * 4 / 1e6 << " MB per averaging, " << n_ * 4 / 1e6 / period_
      << " MB per step on average";
  return out.str();
}

SyncStats LocalSgd::reduce(SyncBuffers&, int64_t step) {
  comm_.log().set_step(step, Phase::kCompressed);
  return {Phase::kCompressed, 0.0};
}

void LocalSgd::after_step(SyncBuffers& b, int64_t step) {
  if ((step + 1) % period_ != 0 || comm_.size() == 1) return;
  allreduce_average(comm_, backend_, b.params, b.n, bucket_elements_, "ALLREDUCE_PARAMS");
  if (b.n_state > 0) allreduce_average(comm_, backend_, b.state, b.n_state, bucket_elements_, "ALLREDUCE_PARAMS");
}

void LocalSgd::save(std::ostream& out) const {
  write_sync_header(out, "local_sgd", 1);
  write_pod(out, period_);
}

void LocalSgd::load(std::istream& in) {
  read_sync_header(in, "local_sgd", 1);
  const auto period = read_pod<int64_t>(in);
  if (!in) throw std::runtime_error("local_sgd state: truncated");
  if (period != period_)
    throw std::runtime_error("local_sgd state was saved with sync.period = " + std::to_string(period) +
                             ", this run has " + std::to_string(period_));
}

}  // namespace trainer::comm
