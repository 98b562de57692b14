// The [sync] section as the gradient-sync stage and the method table (comm/sync/registry.h) see it:
// the options make_gradient_sync builds from, the recipe a method's defaults and start notes depend
// on, and the lines that say which of those defaults a config holds.
#pragma once

#include <string>
#include <vector>

#include "comm/sync/gradient_sync.h"
#include "comm/sync/registry.h"
#include "trainer/config/config.h"

namespace trainer {

// The [sync] settings and the run's seed (PowerSGD's first Q). The run's length, the backend and the
// schedule are the experiment's to fill in (trainer/experiment.cpp).
comm::SyncOptions sync_options(const Config& config);

// Whether the method owns SGD's momentum with these settings (its spec's owns_momentum: sync.<method>.dgc):
// the optimizer is then built without momentum.
bool sync_owns_momentum(const Config& config);
// optim.grad_clip_norm as the trainer applies it after the sync: 0 when the method clips itself
// (its spec's owns_clipping: DGC's local clipping).
double trainer_clip_norm(const Config& config);

// What the method's defaults and start notes see of the run; total_steps 0 when not known yet.
comm::SyncRecipe sync_recipe(const Config& config, int64_t total_steps = 0);

// For --dry-run and the start: one line per default of the method (its spec's defaults) whose value
// the config holds, e.g. "sync.<method>.period = 8: diloco's H (...)". Empty when there is none.
std::vector<std::string> method_default_lines(const Config& config);

}  // namespace trainer
