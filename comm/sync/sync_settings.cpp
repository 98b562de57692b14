#include "comm/sync/sync_settings.h"

#include <stdexcept>

#include "comm/sync/registry.h"

namespace trainer::comm {
namespace {

const OptionKey& key_named(const std::string& path) {
  if (const OptionKey* k = find_sync_method_key(path)) return *k;
  throw std::invalid_argument("no sync method has a key " + path + " (a method's keys are sync.<method>.<name>)");
}

}  // namespace

const Value& MethodValues::at(const std::string& path) const {
  const auto it = values_.find(path);
  return it != values_.end() ? it->second : key_named(path).default_value;
}

Value& MethodValues::slot(const std::string& path) {
  const auto it = values_.find(path);
  if (it != values_.end()) return it->second;
  return values_.emplace(path, key_named(path).default_value).first->second;
}

void MethodValues::set(const std::string& path, Value value) {
  const OptionKey& key = key_named(path);
  if (key.type == Type::kFloat && std::holds_alternative<int64_t>(value))
    value = static_cast<double>(std::get<int64_t>(value));
  if (value.index() != key.default_value.index())
    throw std::invalid_argument(path + " cannot take a value of another type");
  values_[path] = std::move(value);
}

void MethodValues::throw_wrong_type(const std::string& path) {
  throw std::invalid_argument(path + " was read as another type than its own");
}

}  // namespace trainer::comm
