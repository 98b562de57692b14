#include "comm/sync/registry.h"

#include <algorithm>
#include <stdexcept>

#include "comm/sync/methods.h"

namespace trainer::comm {

// The built-in methods' specs, each defined in its method's own file (methods.h lists them).
#define TRAINER_DECLARE_SYNC_METHOD(name, options) SyncMethod name##_method();
TRAINER_SYNC_METHODS(TRAINER_DECLARE_SYNC_METHOD)
#undef TRAINER_DECLARE_SYNC_METHOD

namespace {

std::vector<SyncMethod>& table() {
#define TRAINER_SYNC_METHOD_SPEC(name, options) name##_method(),
  static std::vector<SyncMethod> methods{TRAINER_SYNC_METHODS(TRAINER_SYNC_METHOD_SPEC)};
#undef TRAINER_SYNC_METHOD_SPEC
  return methods;
}

std::string and_list(const std::vector<std::string>& names) {
  std::string list;
  for (size_t i = 0; i < names.size(); ++i)
    list += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
  return list;
}

// Every method's keys, one table after another, rebuilt when a method is registered.
std::vector<OptionKey> build_key_union() {
  std::vector<OptionKey> keys;
  for (const SyncMethod& m : table()) keys.insert(keys.end(), m.keys.begin(), m.keys.end());
  return keys;
}

int& version() {
  static int v = 0;
  return v;
}

std::vector<OptionKey>& key_union() {
  static std::vector<OptionKey> keys = build_key_union();
  return keys;
}

}  // namespace

const std::vector<OptionKey>& sync_method_keys() { return key_union(); }

const OptionKey* find_sync_method_key(const std::string& path) {
  for (const OptionKey& k : key_union())
    if (k.path == path) return &k;
  return nullptr;
}

const OptionKey* method_key(const SyncMethod& method, const std::string& name) {
  const std::string path = SyncSettings::method_key_path(method.name, name);
  for (const OptionKey& k : method.keys)
    if (k.path == path) return &k;
  return nullptr;
}

std::string sync_methods_with_key(const std::string& name) {
  std::vector<std::string> names;
  for (const SyncMethod& m : table())
    if (method_key(m, name)) names.push_back(m.name);
  return and_list(names);
}

int64_t server_ranks(const SyncSettings& settings) {
  const SyncMethod& m = sync_method(settings.method);
  return m.server_ranks ? m.server_ranks(settings) : 0;
}

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
  key_union() = build_key_union();
  ++version();
}

int sync_table_version() { return version(); }

std::string sync_methods_that(bool SyncCapabilities::*capability) {
  std::vector<std::string> names;
  for (const SyncMethod& m : table())
    if (m.can.*capability) names.push_back(m.name);
  return and_list(names);
}

bool takes_device_buffers(const SyncMethod& method, const SyncSettings& settings) {
  return method.can.device_buffers && !(method.needs_host_buffers && method.needs_host_buffers(settings));
}

bool method_owns_momentum(const SyncMethod& method, const SyncSettings& settings) {
  return method.owns_momentum && method.owns_momentum(settings);
}

bool method_owns_clipping(const SyncMethod& method, const SyncSettings& settings) {
  return method.owns_clipping && method.owns_clipping(settings);
}

models::Backend& SyncContext::host_backend(const std::string& method) const {
  if (!backend.is_host())
    throw std::logic_error("sync method '" + method + "' keeps its state in host memory and was given the " +
                           backend.name() + " backend (make_gradient_sync stages such methods on a device)");
  return backend;
}

}  // namespace trainer::comm
