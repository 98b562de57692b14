#include "trainer/start_notes.h"

#include "comm/sync/registry.h"
#include "trainer/config_sync.h"

namespace trainer::app {

std::vector<std::string> start_notes(const Config& config, int64_t total_steps) {
  // Each method's own, from its table entry (comm/sync/registry.h).
  const comm::SyncMethod& method = comm::sync_method(config.sync.method);
  if (!method.start_notes) return {};
  return method.start_notes(sync_recipe(config, total_steps));
}

}  // namespace trainer::app
