// The [sync] section of an experiment: the gradient-sync stage's own keys (which method, the dense
// warmup around it, the dense buckets, overlap, the dense wire format) and the values of the keys the
// methods declare themselves in their own tables ([sync.<method>]: registry.h, option_keys.h), held
// by path. The config reads and writes it; make_gradient_sync builds from it; each method reads its
// own options struct from it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <type_traits>

#include "comm/sync/option_keys.h"
#include "comm/wire_format.h"

namespace trainer::comm {

// The values of the methods' keys. A key not set holds the default its method declares.
class MethodValues {
 public:
  // The value of a key some method of the table declares; std::invalid_argument for any other.
  const Value& at(const std::string& path) const;
  // The same, to assign through (the config's loader); created with the default when unset.
  Value& slot(const std::string& path);
  // Sets a key: numbers convert to the key's type (an integer for a float key, never the reverse);
  // std::invalid_argument naming the key for an unknown key or a value of another type.
  void set(const std::string& path, Value value);
  // A key's value as T (the key's own type); std::invalid_argument for another.
  template <class T>
  T get(const std::string& path) const {
    const Value& v = at(path);
    if (const T* x = std::get_if<T>(&v)) return *x;
    throw_wrong_type(path);
  }

 private:
  [[noreturn]] static void throw_wrong_type(const std::string& path);
  std::map<std::string, Value> values_;
};

struct SyncSettings {
  std::string method = "dense";
  int64_t dense_warmup_steps = 0;
  double bucket_mb = 8.0;         // dense allreduce bucket size (DDP's is 25; config_schema.h says why 8)
  double first_bucket_mb = 1.0;   // the first bucket backward fills (DDP's first bucket is 1 MB too)
  bool overlap = true;            // dense buckets go out during backward (gradient_buckets.h)
  // The format dense gradient buckets (dense, every method's dense warmup) and PowerSGD's P and Q
  // factors travel in (comm/wire_format.h): wire_dtype_names().
  std::string wire_dtype = "fp32";
  MethodValues keys;  // every method's own keys, by path (sync.oktopk.density, sync.powersgd.rank, ...)

  WireDType wire() const { return parse_wire_dtype(wire_dtype); }
  // The path of the key `name` in this method's table: key_path("density") is "sync.oktopk.density"
  // under sync.method = "oktopk".
  std::string key_path(const std::string& name) const { return method_key_path(method, name); }
  static std::string method_key_path(const std::string& method, const std::string& name) {
    return "sync." + method + "." + name;
  }
  // Shorthands for the method's own keys, by name: settings.set("density", 0.01) and
  // settings.get<int64_t>("rank") under the method set before (std::invalid_argument when it has no
  // such key).
  template <class T>
  void set(const std::string& name, T value) {
    if constexpr (std::is_same_v<T, bool>) keys.set(key_path(name), Value(value));
    else if constexpr (std::is_integral_v<T>) keys.set(key_path(name), Value(static_cast<int64_t>(value)));
    else if constexpr (std::is_floating_point_v<T>) keys.set(key_path(name), Value(static_cast<double>(value)));
    else keys.set(key_path(name), Value(std::string(value)));
  }
  template <class T>
  T get(const std::string& name) const {
    return keys.get<T>(key_path(name));
  }
};

// The options struct of a method (option_keys.h), read from the settings' method's table.
template <class O>
O options_of(const SyncSettings& s) {
  static const OptionBinding<O> binding;  // the keys by name
  return binding.read([&s](const std::string& name) -> const Value& { return s.keys.at(s.key_path(name)); });
}

}  // namespace trainer::comm
