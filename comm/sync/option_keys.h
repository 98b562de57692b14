// The vocabulary a configuration key is written in (value types, ranges, choices), and the way a sync
// method declares its own keys: an options struct with one declare() that binds each field to its
// key's name, documentation and range, once. Each method's keys form its own table, [sync.<method>]
// (`[sync.local_sgd] period = 4` is the key sync.local_sgd.period): two methods that read one struct
// (the sparse methods' SparseOptions) or a key of the same name (density) share nothing but the
// text, so each has its own default. The config (trainer/config/config_schema.h) visits every method's
// table through the method table (registry.h); a method reads its struct back with options_of<O>().
//
//   struct LocalSgdOptions {
//     int64_t period = 4;  // the key's default
//     template <class Keys>
//     static void declare(Keys& k) {
//       k.key("period", &LocalSgdOptions::period, "average parameters every N steps.", at_least(1));
//     }
//   };
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace trainer::comm {

// An interval of allowed numbers; for arrays it applies to every element.
struct Range {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false;
  bool hi_open = false;
  bool contains(double x) const {  // false for NaN
    return (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
  }
};
inline Range closed(double lo, double hi) { return {lo, hi, false, false}; }       // [lo, hi]
inline Range closed_open(double lo, double hi) { return {lo, hi, false, true}; }   // [lo, hi)
inline Range open_closed(double lo, double hi) { return {lo, hi, true, false}; }   // (lo, hi]
inline Range at_least(double lo) { return {lo, std::numeric_limits<double>::infinity(), false, true}; }

// What a key accepts beyond its type: a numeric range or a closed list of names (or nothing).
struct Allowed {
  Allowed() = default;
  Allowed(Range r) : range(r) {}
  Allowed(std::vector<std::string> names) : choices(std::move(names)) {}
  std::optional<Range> range;
  std::vector<std::string> choices;
};
inline bool operator==(const Range& a, const Range& b) {
  return a.lo == b.lo && a.hi == b.hi && a.lo_open == b.lo_open && a.hi_open == b.hi_open;
}
inline bool operator==(const Allowed& a, const Allowed& b) { return a.range == b.range && a.choices == b.choices; }

// The value types keys can have, in one variant so that key tables can hold defaults.
using Value = std::variant<std::string, bool, int64_t, double, std::vector<int64_t>, std::vector<double>>;
enum class Type { kString, kBool, kInt, kFloat, kIntArray, kFloatArray };  // same order as Value

template <class T>
constexpr Type type_of() {
  using U = std::remove_const_t<T>;
  if constexpr (std::is_same_v<U, std::string>) return Type::kString;
  else if constexpr (std::is_same_v<U, bool>) return Type::kBool;
  else if constexpr (std::is_same_v<U, int64_t>) return Type::kInt;
  else if constexpr (std::is_same_v<U, double>) return Type::kFloat;
  else if constexpr (std::is_same_v<U, std::vector<int64_t>>) return Type::kIntArray;
  else {
    static_assert(std::is_same_v<U, std::vector<double>>, "unsupported config value type");
    return Type::kFloatArray;
  }
}

// One key a method declares: its path ("sync.oktopk.density"; the struct's name for it, "density",
// under the method's table), its type, what it means, what it accepts, its default.
struct OptionKey {
  std::string path;
  Type type;
  std::string doc;
  Allowed allowed;
  Value default_value;
  // The flat spelling of older configs ([sync] density = 0.01, read as the method's own key) is
  // ignored under a method without the key, except this one's, which is then an error: it would
  // silently do nothing (sync.<method>.adaptive = true under dense).
  bool refused_for_others = false;
};

// The keys of an options struct O, from O::declare(): their table (each name after `prefix`, the
// method's table: "sync.oktopk."), and O read back from values.
template <class O>
class OptionBinding {
 public:
  explicit OptionBinding(std::string prefix = "") : prefix_(std::move(prefix)) { O::declare(*this); }

  // `field` may be a member of a base of O (the options a family of methods shares).
  template <class C, class T>
  OptionKey& key(const char* name, T C::*field, std::string doc, Allowed allowed = {}) {
    static_assert(std::is_base_of_v<C, O>, "a key must bind a field of the options struct");
    const O defaults{};
    keys_.push_back({prefix_ + name, type_of<T>(), std::move(doc), std::move(allowed), Value(defaults.*field)});
    setters_.push_back([field](O& o, const Value& v) { o.*field = std::get<T>(v); });
    return keys_.back();
  }

  const std::vector<OptionKey>& keys() const { return keys_; }

  // O with each key's value from `value_of(path)` (a Value of the key's type).
  O read(const std::function<const Value&(const std::string&)>& value_of) const {
    O o{};
    for (size_t i = 0; i < keys_.size(); ++i) setters_[i](o, value_of(keys_[i].path));
    return o;
  }

 private:
  std::string prefix_;
  std::vector<OptionKey> keys_;
  std::vector<std::function<void(O&, const Value&)>> setters_;
};

// Methods without keys of their own.
struct NoOptions {
  template <class Keys>
  static void declare(Keys&) {}
};

}  // namespace trainer::comm
