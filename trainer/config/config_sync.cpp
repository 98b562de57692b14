#include "trainer/config/config_sync.h"

#include "optim/schedule.h"
#include "trainer/config/config_schema.h"

namespace trainer {

comm::SyncOptions sync_options(const Config& c, int64_t steps_per_epoch, int64_t total_steps) {
  comm::SyncRecipe r;
  r.optimizer = c.optim.name;
  r.momentum = c.optim.momentum;
  r.nesterov = c.optim.nesterov;
  r.grad_clip_norm = c.optim.grad_clip_norm;
  r.coupled_weight_decay = c.optim.name != "adamw" && !c.optim.decoupled_weight_decay ? c.optim.weight_decay : 0.0;
  r.seed = static_cast<uint64_t>(c.experiment.seed);
  r.speech = c.data.dataset == "an4";
  r.steps_per_epoch = steps_per_epoch;
  r.total_steps = total_steps;
  // sync.<method>.adaptive treats the interval after a learning-rate drop as critical (comm/sync/wrappers/accordion.h).
  if (optim::schedule_kind_from_name(c.optim.schedule) == optim::ScheduleKind::kMultiStep && c.optim.gamma < 1)
    for (int64_t m : c.optim.milestones) r.lr_decay_steps.push_back(m * steps_per_epoch);
  return comm::SyncOptions(c.sync, std::move(r));
}

bool sync_owns_momentum(const Config& c) { return comm::method_owns_momentum(comm::sync_method(c.sync.method), c.sync); }

double trainer_clip_norm(const Config& c) {
  return comm::method_owns_clipping(comm::sync_method(c.sync.method), c.sync) ? 0.0 : c.optim.grad_clip_norm;
}

std::vector<std::string> method_default_lines(const comm::SyncOptions& o) {
  const comm::SyncMethod& method = comm::sync_method(o.method);
  std::vector<std::string> lines;
  if (!method.defaults) return lines;
  for (const comm::MethodDefault& d : method.defaults(o))
    if (o.keys.at(o.key_path(d.key)) == d.value)
      lines.push_back(o.key_path(d.key) + " = " + config_schema::toml_literal(d.value) + ": " + d.why);
  return lines;
}

}  // namespace trainer
