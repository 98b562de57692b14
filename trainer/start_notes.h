// Notes a run prints once at its start when its configuration is one that measurements in this
// project found costly in accuracy, so that a user who switches a config to it hears of it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/config/config.h"

namespace trainer::app {

// Each note is one line beginning "note: "; none when nothing applies.
std::vector<std::string> start_notes(const Config& config, int64_t total_steps);

}  // namespace trainer::app
