// For tests that run several sync methods with one set of settings (a density for the sparse
// methods, a rank for powersgd, a period for local_sgd): each key is set where the settings' method
// has it in its table ([sync.<method>]), and left out elsewhere, as the config would ignore it.
#pragma once

#include <string>

#include "comm/sync/registry.h"

namespace trainer::testing {

template <class T>
void set_if_own(comm::SyncSettings& settings, const std::string& name, T value) {
  if (comm::method_key(comm::sync_method(settings.method), name)) settings.set(name, value);
}

}  // namespace trainer::testing
