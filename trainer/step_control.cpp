#include "trainer/step_control.h"

#include <climits>
#include <cmath>

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
                          const models::ParameterStore& params) {
  const int world = comm.size();
  // Item 0 is the loss, item 1 + t the gradient of tensor t; the key is largest for the lowest
  // item on the lowest rank, so MAX yields the first item anywhere.
  int item = -1;
  if (!std::isfinite(loss)) item = 0;
  else if (const int t = first_nonfinite_gradient(backend, params); t >= 0) item = 1 + t;
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

}  // namespace trainer::app
