// The key table derived from visit_config(), and the text forms of values and ranges.
#include "trainer/config/config_schema.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <stdexcept>

namespace trainer::config_schema {

const char* sync_method_doc() {
  // Rebuilt when a method is registered (a test's or an extension's), as the key table below.
  static int built_for = -1;
  static std::string doc;
  if (built_for == comm::sync_table_version()) return doc.c_str();
  built_for = comm::sync_table_version();
  doc = [] {
    std::string text = "Gradient-sync method: ";
    const auto& methods = comm::sync_methods();
    for (size_t i = 0; i < methods.size(); ++i) text += (i ? "; " : "") + methods[i].name + " (" + methods[i].doc + ")";
    return text + ". The compressing methods (" + comm::sync_methods_that(&comm::SyncCapabilities::compresses) +
           ") keep what they do not send in an error-feedback residual: the sparse ones send about the density of "
           "the entries, powersgd (n + m) r per n x m matrix. Each method's own keys are its table, [sync.<method>].";
  }();
  return doc.c_str();
}

std::string method_section_doc(const comm::SyncMethod& m) {
  return "The keys of sync.method = \"" + m.name + "\", its own table: no other method reads them, and a table of "
         "a method other than sync.method's is ignored (with a line saying so). Older configs' flat spelling, [sync] with the key "
         "itself (density = 0.01), is read as the key of sync.method's table, with a note, until the next release.";
}

bool method_section_applies(const std::string& section, const std::string& method) {
  return section.rfind("sync.", 0) != 0 || section == "sync." + method;
}

namespace {

// Records what visit_config() says about each key, reading defaults from a default Config. It also
// checks the list itself (each path once, inside the section just declared), so a slip in
// visit_config() fails the first test that loads a config rather than producing odd behaviour.
struct TableBuilder {
  std::vector<KeyInfo> keys;
  std::vector<SectionInfo> sections;
  std::set<std::string> seen;

  void section(const char* name, const char* doc) {
    if (!seen.insert(name).second) throw std::logic_error(std::string("config section twice: ") + name);
    sections.push_back({name, doc});
  }
  template <class T>
  void key(const char* path, const T& value, const char* doc, const Allowed& allowed = {}) {
    const std::string p = path;
    if (sections.empty() || p.rfind(sections.back().name + ".", 0) != 0)
      throw std::logic_error("config key " + p + " is not inside the section declared before it");
    if (!seen.insert(p).second) throw std::logic_error("config key listed twice: " + p);
    if (!allowed.choices.empty() && type_of<T>() != Type::kString)
      throw std::logic_error("config key " + p + ": choices need a string key");
    if (allowed.range && (type_of<T>() == Type::kString || type_of<T>() == Type::kBool))
      throw std::logic_error("config key " + p + ": a range needs a numeric key");
    keys.push_back({p, sections.back().name, type_of<T>(), doc, allowed, Value(value)});
  }
};

// Built again when a sync method is registered after it was first built (the methods' keys are
// config keys: comm/sync/registry.h).
const TableBuilder& table() {
  static int built_for = -1;
  static TableBuilder t;
  if (built_for != comm::sync_table_version()) {
    TableBuilder b;
    const Config defaults;
    visit_config(defaults, b);
    t = std::move(b);
    built_for = comm::sync_table_version();
  }
  return t;
}

// Shortest text that reads back as the same double: plain decimals for everyday magnitudes
// (0.0005, 10, 0.9900990099009901), an exponent for very small or large ones (1e-07). Uses
// to_chars, which, unlike printf, does not depend on the C locale.
std::string shortest(double x) {
  char buf[64];
  std::to_chars_result res{};
  int digits = 0;  // significant digits after the first
  for (; digits <= 16; ++digits) {
    res = std::to_chars(buf, buf + sizeof(buf), x, std::chars_format::scientific, digits);
    double back = 0;
    std::from_chars(buf, res.ptr, back);
    if (back == x) break;
  }
  const std::string sci(buf, res.ptr);
  const int exponent = std::atoi(sci.c_str() + sci.find('e') + 1);
  if (exponent < -5 || exponent > 15) return sci;
  res = std::to_chars(buf, buf + sizeof(buf), x, std::chars_format::fixed, std::max(0, digits - exponent));
  return std::string(buf, res.ptr);
}

std::string format_double(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  std::string s = shortest(x);
  // TOML reads "1" as an integer; a float must have a fraction or an exponent.
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\t': out += "\\t"; break;
      case '\n': out += "\\n"; break;
      case '\f': out += "\\f"; break;
      case '\r': out += "\\r"; break;
      default:
        if (ch < 0x20 || ch == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04X", ch);
          out += buf;
        } else {
          out += static_cast<char>(ch);  // UTF-8 passes through: TOML files are UTF-8
        }
    }
  }
  return out + "\"";
}

template <class T>
std::string array_literal(const std::vector<T>& xs) {
  std::string out = "[";
  for (size_t i = 0; i < xs.size(); ++i) {
    if (i) out += ", ";
    out += toml_literal(Value(xs[i]));
  }
  return out + "]";
}

std::string bound(double x) {
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  if (x == std::floor(x) && std::fabs(x) < 1e15) return std::to_string(static_cast<int64_t>(x));
  return shortest(x);
}

}  // namespace

const std::vector<KeyInfo>& keys() { return table().keys; }
const std::vector<SectionInfo>& sections() { return table().sections; }

const KeyInfo* find_key(const std::string& path) {
  for (const KeyInfo& k : keys())
    if (k.path == path) return &k;
  return nullptr;
}

std::string toml_literal(const Value& v) {
  switch (static_cast<Type>(v.index())) {
    case Type::kString: return quote(std::get<std::string>(v));
    case Type::kBool: return std::get<bool>(v) ? "true" : "false";
    case Type::kInt: return std::to_string(std::get<int64_t>(v));
    case Type::kFloat: return format_double(std::get<double>(v));
    case Type::kIntArray: return array_literal(std::get<std::vector<int64_t>>(v));
    case Type::kFloatArray: return array_literal(std::get<std::vector<double>>(v));
  }
  return {};
}

std::string type_name(Type t) {
  switch (t) {
    case Type::kString: return "string";
    case Type::kBool: return "boolean";
    case Type::kInt: return "integer";
    case Type::kFloat: return "float";
    case Type::kIntArray: return "array of integers";
    case Type::kFloatArray: return "array of floats";
  }
  return {};
}

std::string describe(const Range& r) {
  return std::string(r.lo_open || std::isinf(r.lo) ? "(" : "[") + bound(r.lo) + ", " + bound(r.hi) +
         (r.hi_open || std::isinf(r.hi) ? ")" : "]");
}

}  // namespace trainer::config_schema
