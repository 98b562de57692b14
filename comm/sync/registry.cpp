#include "comm/sync/registry.h"

#include <stdexcept>

namespace trainer::comm {

// The built-in methods' specs, each defined in its method's own file. A new method: its file, and
// one line here.
SyncMethod dense_method();
SyncMethod local_sgd_method();
SyncMethod diloco_method();
SyncMethod oktopk_method();
SyncMethod topka_method();
SyncMethod gaussiank_method();
SyncMethod gtopk_method();
SyncMethod powersgd_method();
SyncMethod async_ps_method();

namespace {

std::vector<SyncMethod>& table() {
  static std::vector<SyncMethod> methods{dense_method(),     local_sgd_method(), diloco_method(),
                                         oktopk_method(),    topka_method(),     gaussiank_method(),
                                         gtopk_method(),     powersgd_method(),  async_ps_method()};
  return methods;
}

}  // namespace

const std::vector<SyncMethod>& sync_methods() { return table(); }

std::vector<std::string> sync_method_names() {
  std::vector<std::string> names;
  for (const SyncMethod& m : table()) names.push_back(m.name);
  return names;
}

const SyncMethod* find_sync_method(const std::string& name) {
  for (const SyncMethod& m : table())
    if (m.name == name) return &m;
  return nullptr;
}

const SyncMethod& sync_method(const std::string& name) {
  if (const SyncMethod* m = find_sync_method(name)) return *m;
  std::string list;
  for (const SyncMethod& m : table()) list += (list.empty() ? "" : ", ") + m.name;
  throw std::invalid_argument("unknown sync.method '" + name + "' (available: " + list + ")");
}

void register_sync_method(SyncMethod method) {
  if (method.name.empty() || !method.make) throw std::invalid_argument("a sync method needs a name and a factory");
  if (find_sync_method(method.name))
    throw std::invalid_argument("sync.method '" + method.name + "' is registered already");
  table().push_back(std::move(method));
}

std::string sync_methods_that(bool SyncCapabilities::*capability) {
  std::vector<std::string> names;
  for (const SyncMethod& m : table())
    if (m.can.*capability) names.push_back(m.name);
  std::string list;
  for (size_t i = 0; i < names.size(); ++i)
    list += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
  return list;
}

bool takes_device_buffers(const SyncMethod& method, const SyncOptions& options) {
  return method.can.device_buffers && !(method.needs_host_buffers && method.needs_host_buffers(options));
}

models::Backend& SyncContext::host_backend(const std::string& method) const {
  if (!backend.is_host())
    throw std::logic_error("sync method '" + method + "' keeps its state in host memory and was given the " +
                           backend.name() + " backend (make_gradient_sync stages such methods on a device)");
  return backend;
}

}  // namespace trainer::comm
