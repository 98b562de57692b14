#include "trainer/config_sync.h"

#include "trainer/config_schema.h"

namespace trainer {

comm::SyncOptions sync_options(const Config& c) {
  comm::SyncOptions o(c.sync);
  o.seed = static_cast<uint64_t>(c.experiment.seed);
  return o;
}

comm::SyncRecipe sync_recipe(const Config& c, int64_t total_steps) {
  return comm::SyncRecipe{c.sync, c.data.dataset == "an4", c.optim.name, c.optim.momentum, total_steps};
}

std::vector<std::string> method_default_lines(const Config& c) {
  const comm::SyncMethod& method = comm::sync_method(c.sync.method);
  std::vector<std::string> lines;
  if (!method.defaults) return lines;
  for (const comm::MethodDefault& d : method.defaults(sync_recipe(c)))
    if (c.sync.keys.at(d.key) == d.value)
      lines.push_back(d.key + " = " + config_schema::toml_literal(d.value) + ": " + d.why);
  return lines;
}

}  // namespace trainer
