#include "trainer/step/step_clock.h"

#include <climits>
#include <cmath>
#include <stdexcept>

#include <vector>

#include "optim/clip.h"

namespace trainer::app {

int first_nonfinite_gradient(models::Backend& backend, const models::ParameterStore& params) {
  if (std::isfinite(optim::global_norm(backend, params.grads(), params.size()))) return -1;
  // Rare: find the tensor on a host copy of the gradient.
  std::vector<float> grads(static_cast<size_t>(params.size()));
  models::copy_to_host(backend, params.grads(), params.size(), grads.data());
  const auto& views = params.views();
  for (size_t t = 0; t < views.size(); ++t) {
    const float* g = grads.data() + views[t].offset;
    const int64_t n = views[t].numel();
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(g[i])) return static_cast<int>(t);
  }
  return static_cast<int>(views.size());  // outside every view (padding): still not finite
}

StepVerdict agree_on_step(comm::Communicator& comm, int local_stop_signal, double loss, models::Backend& backend,
                          const models::ParameterStore& params, int sent_check) {
  const int world = comm.size();
  // Item 0 is the loss, item 1 + t the gradient of tensor t; the key is largest for the lowest
  // item on the lowest rank, so MAX yields the first item anywhere.
  int item = -1;
  if (!std::isfinite(loss)) item = 0;
  else if (const int t = sent_check == kNotSentYet ? first_nonfinite_gradient(backend, params) : sent_check; t >= 0)
    item = 1 + t;
  int32_t control[2] = {local_stop_signal, 0};
  if (item >= 0) control[1] = INT32_MAX - (item * world + comm.rank());
  comm.allreduce(control, 2, comm::DType::kI32, comm::ReduceOp::kMax, "ALLREDUCE_CONTROL");
  StepVerdict v;
  v.stop_signal = control[0];
  if (control[1] != 0) {
    const int key = INT32_MAX - control[1];
    v.nonfinite = true;
    v.rank = key % world;
    v.tensor = key / world - 1;
  }
  return v;
}

StepVerdict check_step_here(int rank, int local_stop_signal, double loss, models::Backend& backend,
                            const models::ParameterStore& params) {
  StepVerdict v;
  v.stop_signal = local_stop_signal;
  if (!std::isfinite(loss)) {
    v.nonfinite = true;
  } else if (const int t = first_nonfinite_gradient(backend, params); t >= 0) {
    v.nonfinite = true;
    v.tensor = t;
  }
  if (v.nonfinite) v.rank = rank;
  return v;
}

std::string nonfinite_item(int tensor, const models::ParameterStore& params) {
  if (tensor < 0) return "the loss";
  if (tensor >= static_cast<int>(params.views().size())) return "the gradient";
  return "the gradient of " + params.views()[tensor].name;
}

namespace {

class LockstepClock final : public StepClock {
 public:
  LockstepClock(comm::Communicator& comm, models::Backend& backend, const models::ParameterStore& params)
      : comm_(comm), backend_(backend), params_(params) {}
  StepVerdict verdict(int64_t, int local_stop_signal, double loss, int sent_check) override {
    return agree_on_step(comm_, local_stop_signal, loss, backend_, params_, sent_check);
  }
  StepPosition position(int64_t done, const comm::SyncStats&) const override { return {done, done}; }
  double job_samples(int64_t own_samples, int64_t) const override {
    return static_cast<double>(own_samples) * comm_.size();
  }

 private:
  comm::Communicator& comm_;
  models::Backend& backend_;
  const models::ParameterStore& params_;
};

class GrantedClock final : public StepClock {
 public:
  GrantedClock(int rank, int trainers, int64_t batch_size, models::Backend& backend,
               const models::ParameterStore& params)
      : rank_(rank), trainers_(trainers), batch_size_(batch_size), backend_(backend), params_(params) {}
  // async_ps sends nothing during backward (sent_check is kNotSentYet).
  StepVerdict verdict(int64_t step, int local_stop_signal, double loss, int) override {
    const StepVerdict v = check_step_here(rank_, local_stop_signal, loss, backend_, params_);
    if (v.nonfinite)
      throw std::runtime_error("non-finite value at step " + std::to_string(step) + ": " +
                               nonfinite_item(v.tensor, params_));
    if (v.stop_signal)
      throw std::runtime_error(
          "stopped by a signal: async_ps continues from the last periodic checkpoint (train.checkpoint_every)");
    return v;
  }
  StepPosition position(int64_t, const comm::SyncStats& stats) const override {
    return {stats.global_step, stats.round};
  }
  // The workers' pace differs, so the job's rate is the servers': global steps x W batches.
  double job_samples(int64_t, int64_t global_steps) const override {
    return static_cast<double>(global_steps) * trainers_ * static_cast<double>(batch_size_);
  }

 private:
  int rank_, trainers_;
  int64_t batch_size_;
  models::Backend& backend_;
  const models::ParameterStore& params_;
};

}  // namespace

std::unique_ptr<StepClock> make_lockstep_clock(comm::Communicator& comm, models::Backend& backend,
                                               const models::ParameterStore& params) {
  return std::make_unique<LockstepClock>(comm, backend, params);
}

std::unique_ptr<StepClock> make_granted_clock(int rank, int trainers, int64_t batch_size, models::Backend& backend,
                                              const models::ParameterStore& params) {
  return std::make_unique<GrantedClock>(rank, trainers, batch_size, backend, params);
}

}  // namespace trainer::app
