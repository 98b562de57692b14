#include "trainer/config/config_sync.h"

#include "trainer/config/config_schema.h"

namespace trainer {

comm::SyncOptions sync_options(const Config& c) {
  comm::SyncOptions o(c.sync);
  o.seed = static_cast<uint64_t>(c.experiment.seed);
  o.momentum = c.optim.momentum;
  o.nesterov = c.optim.nesterov;
  o.grad_clip_norm = c.optim.grad_clip_norm;
  o.optimizer = c.optim.name;
  o.coupled_weight_decay = c.optim.name != "adamw" && !c.optim.decoupled_weight_decay ? c.optim.weight_decay : 0.0;
  return o;
}

bool sync_owns_momentum(const Config& c) {
  return comm::method_owns_momentum(comm::sync_method(c.sync.method), sync_options(c));
}

double trainer_clip_norm(const Config& c) {
  return comm::method_owns_clipping(comm::sync_method(c.sync.method), sync_options(c)) ? 0.0 : c.optim.grad_clip_norm;
}

comm::SyncRecipe sync_recipe(const Config& c, int64_t total_steps) {
  return comm::SyncRecipe{c.sync, c.data.dataset == "an4", c.optim.name, c.optim.momentum, total_steps};
}

std::vector<std::string> method_default_lines(const Config& c) {
  const comm::SyncMethod& method = comm::sync_method(c.sync.method);
  std::vector<std::string> lines;
  if (!method.defaults) return lines;
  for (const comm::MethodDefault& d : method.defaults(sync_recipe(c)))
    if (c.sync.keys.at(c.sync.key_path(d.key)) == d.value)
      lines.push_back(c.sync.key_path(d.key) + " = " + config_schema::toml_literal(d.value) + ": " + d.why);
  return lines;
}

}  // namespace trainer
