// The optimizer interface the training loop holds (docs/architecture.md section 2: Optimizer::step(params,
// grads, lr)), and the factory that builds one by name.
//
// Every optimizer works on one flat float32 parameter buffer and the gradient buffer of the same
// length, takes the learning rate per step (the schedule lives outside), and saves and loads its
// complete state as opaque bytes for checkpoints. Implementations: Sgd (optim/sgd.h) and Adam,
// which is also AdamW (optim/adam.h).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

namespace trainer::models {
class Backend;
struct StepControl;
}

namespace trainer::optim {

// Every optimizer runs its arithmetic through a models::Backend (fused update ops), so it works on
// the device where the parameters are; its state (momentum, moments) lives there too.
class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // One update of params[0, n) from grads[0, n) (device memory) with learning rate lr, of the
  // gradient times grad_scale (the clip's coefficient, optim/clip.h: applied in the update's own
  // pass, so a binding clip costs no pass of its own); grads is not modified.
  // The result does not depend on the OpenMP thread count.
  virtual void step(float* params, const float* grads, double lr, float grad_scale = 1.f) = 0;

  // A captured step (runtime.cuda_graph, models/step_capture.h), where the learning rate and the
  // update count are not known when the update is recorded: step_coefficients gives the per-step
  // floats of an update at `lr` after `count` earlier updates (exactly those step() would use), the
  // host writes them into the control block before each launch, and graph_step records an update
  // that reads them there (and does nothing when the control block says the step is skipped). It
  // does not count the update: the device does, and set_step_count takes the count back.
  virtual void step_coefficients(double lr, int64_t count, float out[4]) const = 0;
  virtual void graph_step(float* params, const float* grads, const models::StepControl* control) = 0;
  virtual void set_step_count(int64_t steps) = 0;

  // Binary state. load() throws std::runtime_error naming what does not match and leaves the
  // optimizer unchanged on error.
  virtual void save(std::ostream& out) const = 0;
  virtual void load(std::istream& in) = 0;

  // The state kept per parameter element, as host arrays of size() floats each (SGD: the momentum
  // buffer, none without momentum; Adam: exp_avg, exp_avg_sq), and its replacement with a step
  // count: for cutting and joining an async_ps server's optimizer by parameter ranges when the
  // servers are re-sharded (comm/sync/methods/async_ps/async_ps_state.h). set_element_state throws
  // std::invalid_argument (leaving the optimizer unchanged) when the count or a size differs.
  virtual std::vector<std::vector<float>> element_state() const = 0;
  virtual void set_element_state(const std::vector<std::vector<float>>& state, int64_t steps) = 0;

  // "sgd", "adam" or "adamw": the optim.name that builds this optimizer.
  virtual std::string name() const = 0;
  virtual int64_t size() const = 0;
  virtual int64_t step_count() const = 0;
};

// Everything the factory needs, from the [optim] section of the config. Options that do not apply
// to the chosen optimizer are ignored (momentum for adam), except nesterov, which only sgd accepts.
struct OptimizerOptions {
  std::string name = "sgd";  // one of optimizer_names()
  double momentum = 0.0;     // sgd
  bool nesterov = false;     // sgd
  double weight_decay = 0.0;
  bool decoupled_weight_decay = false;  // sgd: SGDW; adam: AdamW (adamw is always decoupled)
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adam, adamw
};

// The names make_optimizer() accepts, in the order of trainer::kOptimizers (a test checks).
const std::vector<std::string>& optimizer_names();

// n: elements in the flat parameter buffer, which lives on `backend` (the optimizer keeps its state
// there too). Throws std::invalid_argument for an unknown name or an option the optimizer rejects
// (naming it).
std::unique_ptr<Optimizer> make_optimizer(models::Backend& backend, const OptimizerOptions& options, int64_t n);

}  // namespace trainer::optim
