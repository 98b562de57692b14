// Notes a run prints once at its start when its configuration is one that measurements in this
// project found costly in accuracy, so that a user who switches a config to it hears of it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/sync/gradient_sync.h"
#include "trainer/config/config.h"

namespace trainer::app {

// Each note is one line beginning "note: "; none when nothing applies.
// `sync`: what the method is built from (trainer/config/config_sync.h), with the run's length
// where it is known.
std::vector<std::string> start_notes(const Config& config, const comm::SyncOptions& sync);

}  // namespace trainer::app
