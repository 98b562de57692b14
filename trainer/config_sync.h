// The [sync] section as the gradient-sync stage takes it (comm::SyncOptions), and the config's
// checks that ask the method table (comm/sync/registry.h): whether the method runs on the
// configured device, and the rules between its own keys.
#pragma once

#include "comm/sync/gradient_sync.h"
#include "trainer/config.h"

namespace trainer {

// The [sync] section, the run's seed (PowerSGD's first Q) and the parsed wire formats. The run's
// length, the backend and the schedule are the experiment's to fill in (trainer/experiment.cpp).
comm::SyncOptions sync_options(const Config& config);

}  // namespace trainer
