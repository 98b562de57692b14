#include "optim/optimizer.h"

#include <stdexcept>

#include "optim/adam.h"
#include "optim/sgd.h"

namespace trainer::optim {

const std::vector<std::string>& optimizer_names() {
  static const std::vector<std::string> names = {"sgd", "adam", "adamw"};
  return names;
}

std::unique_ptr<Optimizer> make_optimizer(models::Backend& backend, const OptimizerOptions& o, int64_t n) {
  if (o.name == "sgd")
    return std::make_unique<Sgd>(backend, n,
                                 SgdOptions{o.momentum, o.nesterov, o.weight_decay, o.decoupled_weight_decay});
  if (o.name == "adam" || o.name == "adamw") {
    if (o.nesterov) throw std::invalid_argument(o.name + ": nesterov applies to sgd only");
    AdamOptions a;
    a.beta1 = o.beta1;
    a.beta2 = o.beta2;
    a.eps = o.eps;
    a.weight_decay = o.weight_decay;
    a.decoupled_weight_decay = o.name == "adamw" || o.decoupled_weight_decay;
    return std::make_unique<Adam>(backend, n, a);
  }
  std::string list;
  for (const auto& name : optimizer_names()) list += (list.empty() ? "" : ", ") + name;
  throw std::invalid_argument("unknown optimizer '" + o.name + "' (expected one of " + list + ")");
}

}  // namespace trainer::optim
