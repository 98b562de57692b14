// The [sync] section as the gradient-sync stage and the method table (comm/sync/registry.h) see it:
// the one value a method is built from (its keys and the recipe around it), and the lines that say
// which of the method's defaults a config holds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/sync/gradient_sync.h"
#include "comm/sync/registry.h"
#include "trainer/config/config.h"

namespace trainer {

// The [sync] settings and the recipe around them (comm::SyncRecipe: the optimizer, the seed, the
// task, and the run's length once the data is read; 0 before, as at the config's load and
// --dry-run). Each role builds it once: the config's load (the method's defaults and rules), --dry-run,
// a worker's experiment (trainer/experiment.h: Experiment::sync_options) and a server. The backend
// is the experiment's to fill in.
comm::SyncOptions sync_options(const Config& config, int64_t steps_per_epoch = 0, int64_t total_steps = 0);

// Whether the method owns SGD's momentum with these settings (its spec's owns_momentum: sync.<method>.dgc):
// the optimizer is then built without momentum.
bool sync_owns_momentum(const Config& config);
// optim.grad_clip_norm as the trainer applies it after the sync: 0 when the method clips itself
// (its spec's owns_clipping: DGC's local clipping).
double trainer_clip_norm(const Config& config);

// For --dry-run and the start: one line per default of the method (its spec's defaults) whose value
// the options hold, e.g. "sync.<method>.period = 8: diloco's H (...)". Empty when there is none.
std::vector<std::string> method_default_lines(const comm::SyncOptions& options);

}  // namespace trainer
