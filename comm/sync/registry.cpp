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

// The union of the methods' keys (sync_method_keys), rebuilt when a method is registered.
struct KeyUnion {
  std::vector<OptionKey> keys;
  std::vector<std::vector<std::string>> declared_by;  // per key, the methods' names
};

KeyUnion build_key_union() {
  KeyUnion u;
  std::vector<std::vector<std::pair<std::string, std::string>>> docs;  // per key: (method, doc)
  for (const SyncMethod& m : table()) {
    for (const OptionKey& k : m.keys) {
      size_t i = 0;
      while (i < u.keys.size() && u.keys[i].path != k.path) ++i;
      if (i == u.keys.size()) {
        u.keys.push_back(k);
        u.declared_by.emplace_back();
        docs.emplace_back();
      } else {
        const OptionKey& first = u.keys[i];
        if (first.type != k.type || !(first.allowed == k.allowed) || first.default_value != k.default_value ||
            first.refused_for_others != k.refused_for_others)
          throw std::logic_error("sync methods " + u.declared_by[i].front() + " and " + m.name + " declare " + k.path +
                                 " with another type, range or default");
      }
      u.declared_by[i].push_back(m.name);
      docs[i].push_back({m.name, k.doc});
    }
  }
  // Each distinct text once, after the names of the methods that share it.
  for (size_t i = 0; i < u.keys.size(); ++i) {
    std::vector<std::pair<std::vector<std::string>, std::string>> texts;
    for (const auto& declared : docs[i]) {  // (method, doc)
      auto same =
          std::find_if(texts.begin(), texts.end(), [&](const auto& t) { return t.second == declared.second; });
      if (same == texts.end()) texts.push_back({{declared.first}, declared.second});
      else same->first.push_back(declared.first);
    }
    std::string doc;
    for (const auto& [methods, text] : texts) {
      std::string names;
      for (const std::string& name : methods) names += (names.empty() ? "" : ", ") + name;
      doc += (doc.empty() ? "" : " ") + names + ": " + text;
    }
    u.keys[i].doc = doc;
  }
  return u;
}

int& version() {
  static int v = 0;
  return v;
}

KeyUnion& key_union() {
  static KeyUnion u = build_key_union();
  return u;
}

}  // namespace

const std::vector<OptionKey>& sync_method_keys() { return key_union().keys; }

const OptionKey* find_sync_method_key(const std::string& path) {
  for (const OptionKey& k : key_union().keys)
    if (k.path == path) return &k;
  return nullptr;
}

std::string sync_methods_declaring(const std::string& path) {
  const KeyUnion& u = key_union();
  for (size_t i = 0; i < u.keys.size(); ++i)
    if (u.keys[i].path == path) return and_list(u.declared_by[i]);
  return {};
}

bool declares(const SyncMethod& method, const std::string& path) {
  return std::any_of(method.keys.begin(), method.keys.end(), [&](const OptionKey& k) { return k.path == path; });
}

const OptionKey* refused_key(const SyncMethod& method, const MethodValues& values) {
  for (const OptionKey& key : key_union().keys)
    if (key.refused_for_others && !declares(method, key.path) && values.at(key.path) != key.default_value)
      return &key;
  return nullptr;
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

bool takes_device_buffers(const SyncMethod& method, const SyncOptions& options) {
  return method.can.device_buffers && !(method.needs_host_buffers && method.needs_host_buffers(options));
}

bool method_owns_momentum(const SyncMethod& method, const SyncOptions& options) {
  return method.owns_momentum && method.owns_momentum(options);
}

bool method_owns_clipping(const SyncMethod& method, const SyncOptions& options) {
  return method.owns_clipping && method.owns_clipping(options);
}

models::Backend& SyncContext::host_backend(const std::string& method) const {
  if (!backend.is_host())
    throw std::logic_error("sync method '" + method + "' keeps its state in host memory and was given the " +
                           backend.name() + " backend (make_gradient_sync stages such methods on a device)");
  return backend;
}

}  // namespace trainer::comm
