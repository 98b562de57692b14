#include "trainer/start_notes.h"

#include "comm/sync/registry.h"

namespace trainer::app {

std::vector<std::string> start_notes(const Config& config, const comm::SyncOptions& sync) {
  // How the config was read (old spellings), then the method's own, from its table entry
  // (comm/sync/registry.h).
  std::vector<std::string> notes = config.notes;
  const comm::SyncMethod& method = comm::sync_method(config.sync.method);
  if (method.start_notes)
    for (std::string& note : method.start_notes(sync)) notes.push_back(std::move(note));
  return notes;
}

}  // namespace trainer::app
