// Loading: TOML text + --set overrides -> validated Config, with one-line errors that name the source
// and the key (and suggest the key that was probably meant).
//
// The steps: parse the file; walk its tables, mapping every leaf to a known key (anything else is
// an unknown key or section); let each --set replace its key's node; read every key through the
// Loader visitor, which checks type, range and choices; finally check the few rules that involve
// more than one key. Each value remembers where it came from, so an error can name the file or the
// exact --set argument.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <list>
#include <map>
#include <optional>
#include <sstream>
#include <tuple>
#include <toml++/toml.h>

#include "comm/sync/registry.h"
#include "trainer/config/config.h"
#include "trainer/config/config_schema.h"
#include "trainer/config/config_sync.h"

namespace trainer {

namespace {

using namespace config_schema;

// One line whatever the origin holds: a --set argument (or a quoted value) may contain newlines.
[[noreturn]] void fail(const std::string& origin, const std::string& message) {
  std::string line = origin + ": " + message;
  for (char& c : line)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  throw ConfigError(line);
}

// ---- suggestions -------------------------------------------------------------------------------

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// Edits between a and b, where swapping two neighbouring characters is one edit ("trian" -> "train"):
// the optimal-string-alignment variant of the Damerau-Levenshtein distance.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

constexpr size_t kFar = std::numeric_limits<size_t>::max();

// How far `typed` is from the valid name `valid`: the edit distance when it is small for the typed
// length, 2 when one is an abbreviation of the other ("optimizer" / "optim", "learning_rate" / "lr"
// by initials), kFar otherwise.
size_t name_cost(const std::string& typed_in, const std::string& valid_in) {
  const std::string typed = lower(typed_in), valid = lower(valid_in);
  size_t cost = kFar;
  const size_t d = edit_distance(typed, valid);
  if (d <= std::max<size_t>(1, typed.size() / 3)) cost = d;
  const auto prefix = [](const std::string& a, const std::string& b) {
    return a.size() >= 3 && b.size() > a.size() && b.compare(0, a.size(), a) == 0;
  };
  const auto initials = [](const std::string& s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i)
      if (s[i] != '_' && (i == 0 || s[i - 1] == '_')) out += s[i];
    return out.size() >= 2 ? out : std::string();
  };
  if (prefix(typed, valid) || prefix(valid, typed) || initials(typed) == valid ||
      initials(valid) == typed)
    cost = std::min<size_t>(cost, 2);
  return cost;
}

// The table a path is in: "optim" for optim.lr, "sync.oktopk" for sync.oktopk.density.
std::string table_of(const std::string& path) {
  const size_t dot = path.rfind('.');
  return dot == std::string::npos ? std::string() : path.substr(0, dot);
}
std::string last_component(const std::string& path) { return path.substr(path.rfind('.') + 1); }

// The valid key nearest to `typed`: its last component must be close to the key's, and moving to
// another section costs one edit, so "optim.momentun" -> "optim.momentum", "train.lr" -> "optim.lr"
// and "otpim.lr" -> "optim.lr". Comparing whole paths instead would let the shared section name
// make unrelated short keys look close ("optim.wd" is not "optim.lr").
std::optional<std::string> nearest_key(const std::string& typed) {
  size_t best = kFar;
  std::optional<std::string> found;
  for (const KeyInfo& k : keys()) {
    const size_t last = name_cost(last_component(typed), last_component(k.path));
    if (last == kFar) continue;
    const size_t cost = last + (table_of(typed) == table_of(k.path) ? 0 : 1);
    if (cost < best) best = cost, found = k.path;
  }
  return found;
}

std::optional<std::string> nearest_name(const std::string& typed, const std::vector<std::string>& names) {
  size_t best = kFar;
  std::optional<std::string> found;
  for (const std::string& n : names) {
    const size_t cost = name_cost(typed, n);
    if (cost < best) best = cost, found = n;
  }
  return found;
}

std::string unknown_key(const std::string& path) {
  std::string m = "unknown key '" + path + "'";
  if (auto s = nearest_key(path)) m += " (did you mean '" + *s + "'?)";
  return m;
}

std::string unknown_section(const std::string& name) {
  std::vector<std::string> names;
  for (const SectionInfo& s : sections()) names.push_back(s.name);
  std::string m = "unknown section [" + name + "]";
  if (auto s = nearest_name(name, names)) m += " (did you mean [" + *s + "]?)";
  return m;
}

// ---- reading TOML nodes ------------------------------------------------------------------------

std::string node_literal(const toml::node& n) {
  if (auto s = n.as_string()) return toml_literal(Value(s->get()));
  if (auto i = n.as_integer()) return toml_literal(Value(i->get()));
  if (auto f = n.as_floating_point()) return toml_literal(Value(f->get()));
  if (auto b = n.as_boolean()) return toml_literal(Value(b->get()));
  if (auto a = n.as_array()) {
    std::string out = "[";
    for (size_t i = 0; i < a->size(); ++i) out += (i ? ", " : "") + node_literal(*a->get(i));
    return out + "]";
  }
  if (n.is_table()) return "{...}";
  std::ostringstream s;  // dates and times
  n.visit([&s](auto&& v) { s << v; });
  return s.str();
}

// "string \"fast\"", "float 0.5", "table {...}": what the user wrote, for "got ..." messages.
std::string describe_node(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "string " + node_literal(n);
    case toml::node_type::integer: return "integer " + node_literal(n);
    case toml::node_type::floating_point: return "float " + node_literal(n);
    case toml::node_type::boolean: return "boolean " + node_literal(n);
    case toml::node_type::array: return "array " + node_literal(n);
    case toml::node_type::table: return "a table";
    default: return "date/time " + node_literal(n);
  }
}

// Reads a node as T; false when the TOML type does not fit. Integers are numbers too, but a float is
// never silently truncated to an integer.
bool read(const toml::node& n, std::string& out) {
  if (auto s = n.as_string()) out = s->get();
  return n.is_string();
}
bool read(const toml::node& n, bool& out) {
  if (auto b = n.as_boolean()) out = b->get();
  return n.is_boolean();
}
bool read(const toml::node& n, int64_t& out) {
  if (auto i = n.as_integer()) out = i->get();
  return n.is_integer();
}
bool read(const toml::node& n, double& out) {
  if (auto f = n.as_floating_point()) out = f->get();
  if (auto i = n.as_integer()) out = static_cast<double>(i->get());
  return n.is_number();
}
template <class T>
bool read(const toml::node& n, std::vector<T>& out) {
  const toml::array* a = n.as_array();
  if (!a) return false;
  out.assign(a->size(), T{});
  for (size_t i = 0; i < a->size(); ++i)
    if (!read(*a->get(i), out[i])) return false;
  return true;
}

std::string expected(Type t) {
  switch (t) {
    case Type::kString: return "a string";
    case Type::kBool: return "true or false";
    case Type::kInt: return "an integer";
    case Type::kFloat: return "a number";
    case Type::kIntArray: return "an array of integers";
    case Type::kFloatArray: return "an array of numbers";
  }
  return {};
}

std::string join(const std::vector<std::string>& xs, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < xs.size(); ++i) out += (i ? sep : "") + xs[i];
  return out;
}

// Where each key's value comes from. `order` is 0 for the file and i + 1 for the i-th --set, so a
// rule that involves several keys can blame the one set last.
struct Setting {
  const toml::node* node;
  std::string origin;
  size_t order;
};
using Settings = std::map<std::string, Setting>;

// `subject` names the value: "optim.lr = 20.0" or "optim.milestones element -1".
void check_range(const std::string& origin, const std::string& subject, const Allowed& allowed, double x) {
  if (allowed.range && !allowed.range->contains(x))
    fail(origin, subject + " is out of range " + describe(*allowed.range));
}

// Reads every key that the file or a --set provides; the others keep their defaults.
struct Loader {
  const Settings& settings;

  void section(const char*, const char*) {}

  template <class T>
  void key(const char* path, T& value, const char*, const Allowed& allowed = {}) {
    const auto it = settings.find(path);
    if (it == settings.end()) return;
    const std::string& origin = it->second.origin;
    T parsed{};
    if (!read(*it->second.node, parsed))
      fail(origin, std::string(path) + " must be " + expected(type_of<T>()) + ", got " +
                       describe_node(*it->second.node));
    check(origin, path, parsed, allowed);
    value = std::move(parsed);
  }

  void check(const std::string& origin, const std::string& path, const std::string& v,
             const Allowed& allowed) {
    if (allowed.choices.empty() ||
        std::find(allowed.choices.begin(), allowed.choices.end(), v) != allowed.choices.end())
      return;
    std::string m = path + " = " + toml_literal(Value(v)) + " is not one of " + join(allowed.choices, ", ");
    if (auto s = nearest_name(v, allowed.choices)) m += " (did you mean \"" + *s + "\"?)";
    fail(origin, m);
  }
  void check(const std::string&, const std::string&, bool, const Allowed&) {}
  void check(const std::string& origin, const std::string& path, int64_t v, const Allowed& allowed) {
    check_range(origin, path + " = " + toml_literal(Value(v)), allowed, static_cast<double>(v));
  }
  void check(const std::string& origin, const std::string& path, double v, const Allowed& allowed) {
    check_range(origin, path + " = " + toml_literal(Value(v)), allowed, v);
  }
  template <class T>
  void check(const std::string& origin, const std::string& path, const std::vector<T>& v,
             const Allowed& allowed) {
    for (const T& x : v)
      check_range(origin, path + " element " + toml_literal(Value(x)), allowed, static_cast<double>(x));
  }
};

// Maps every leaf of `table` to a known key in `out`. Anything that is not a key, a section or a
// table on the way to a key is a problem; the one earliest in the file is reported.
struct Problem {
  toml::source_position where;
  std::string message;
};

bool is_group(const std::string& path) {  // a section, or a table that holds keys
  const std::string prefix = path + ".";
  for (const KeyInfo& k : keys())
    if (k.path.compare(0, prefix.size(), prefix) == 0) return true;
  return false;
}

// The older flat spelling of a method's key, [sync] density = 0.01 (sync.density): the first
// method's key of that name (its type and refused_for_others are every declarer's: one struct), or
// null.
const comm::OptionKey* flat_method_key(const std::string& path) {
  const std::string prefix = "sync.";
  if (path.compare(0, prefix.size(), prefix) != 0 || find_key(path)) return nullptr;
  const std::string name = path.substr(prefix.size());
  for (const comm::OptionKey& k : comm::sync_method_keys())
    if (last_component(k.path) == name) return &k;
  return nullptr;
}

std::string unknown_method_table(const std::string& path) {
  std::vector<std::string> tables;
  for (const SectionInfo& s : sections())
    if (s.name.rfind("sync.", 0) == 0) tables.push_back(s.name);
  std::string m = "unknown table [" + path + "]: the methods' tables are [" + join(tables, "], [") + "]";
  if (auto s = nearest_name(path, tables)) m += " (did you mean [" + *s + "]?)";
  return m;
}

void collect(const toml::table& table, const std::string& prefix, const std::string& origin,
             Settings& out, std::vector<Problem>& problems) {
  for (auto&& [name, node] : table) {
    const std::string path = (prefix.empty() ? "" : prefix + ".") + std::string(name.str());
    const toml::source_position where = node.source().begin;
    if (find_key(path) || flat_method_key(path)) {
      out[path] = {&node, origin, 0};  // a flat spelling is resolved once sync.method is known
    } else if (is_group(path)) {
      if (const toml::table* sub = node.as_table())
        collect(*sub, path, origin, out, problems);
      else
        problems.push_back({where, path + " must be a table ([" + path + "]), got " + describe_node(node)});
    } else if (prefix.empty() && node.is_table()) {
      problems.push_back({where, unknown_section(path)});
    } else if (prefix == "sync" && node.is_table()) {
      problems.push_back({where, unknown_method_table(path)});
    } else {
      problems.push_back({where, unknown_key(path)});
    }
  }
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

// Well-formed UTF-8 as TOML requires: no overlong forms, no surrogates, nothing above U+10FFFF.
bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int n;
    uint32_t cp;
    if (c < 0x80) n = 0, cp = c;
    else if ((c & 0xe0) == 0xc0) n = 1, cp = c & 0x1f;
    else if ((c & 0xf0) == 0xe0) n = 2, cp = c & 0x0f;
    else if ((c & 0xf8) == 0xf0) n = 3, cp = c & 0x07;
    else return false;
    if (i + n >= s.size() && n > 0) return false;
    for (int k = 1; k <= n; ++k) {
      const unsigned char t = static_cast<unsigned char>(s[i + k]);
      if ((t & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (t & 0x3f);
    }
    static const uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n + 1;
  }
  return true;
}

// Applies one --set: the value is read as TOML (numbers, true/false, "quoted strings", [arrays]),
// except that a string key also takes bare text. Text that is not valid TOML stays a string, so a
// number key reports `must be a number, got string "abc"`.
void apply_override(const std::string& arg, size_t order, Settings& settings,
                    std::list<toml::table>& storage) {
  const std::string origin = "--set " + arg;
  const size_t eq = arg.find('=');
  const std::string path = eq == std::string::npos ? "" : trim(arg.substr(0, eq));
  if (path.empty()) fail(origin, "expected key.path=value");
  const KeyInfo* key = find_key(path);
  const comm::OptionKey* flat = key ? nullptr : flat_method_key(path);
  if (!key && !flat) fail(origin, unknown_key(path));
  const Type type = key ? key->type : flat->type;
  const std::string value = trim(arg.substr(eq + 1));
  toml::table& holder = storage.emplace_back();
  const bool quoted = !value.empty() && (value[0] == '"' || value[0] == '\'');
  if (type != Type::kString || quoted) {
    try {
      holder = toml::parse("v = " + value);
    } catch (const toml::parse_error&) {
      holder = toml::table{};
    }
  }
  if (!holder.contains("v") || holder.size() != 1) {
    // Bare text bypasses the TOML parser's checks; config.toml must read back, so it must be UTF-8.
    if (!valid_utf8(value)) fail(origin, "the value is not valid UTF-8 text");
    holder = toml::table{{"v", value}};
  }
  settings[path] = {holder.get("v"), origin, order};
}

// Once sync.method is known: each old flat spelling ([sync] density) becomes the key of the method's
// table (sync.oktopk.density), with a note, or is dropped with a note where the method has no such
// key (an error for a key that would silently do nothing: sync.<method>.adaptive = true under dense); another
// method's table is ignored, with a note. Two spellings of one key in the file are an error.
std::vector<std::string> resolve_method_tables(Settings& settings) {
  std::string method = comm::SyncSettings{}.method;
  if (const auto it = settings.find("sync.method"); it != settings.end())
    if (const auto name = it->second.node->as_string()) method = name->get();
  const comm::SyncMethod* spec = comm::find_sync_method(method);
  if (!spec) return {};  // the Loader reports the unknown method
  std::vector<std::string> notes;
  std::vector<std::string> ignored_tables;
  for (auto it = settings.begin(); it != settings.end();) {
    const std::string path = it->first;
    const Setting setting = it->second;
    const comm::OptionKey* flat = flat_method_key(path);
    if (!flat) {
      const KeyInfo* key = find_key(path);
      const std::string section = key ? key->section : "";
      if (!method_section_applies(section, method) &&
          std::find(ignored_tables.begin(), ignored_tables.end(), section) == ignored_tables.end())
        ignored_tables.push_back(section);
      ++it;
      continue;
    }
    it = settings.erase(it);
    const std::string name = last_component(path);
    if (const comm::OptionKey* key = comm::method_key(*spec, name)) {
      const auto [own, inserted] = settings.insert({key->path, setting});
      if (!inserted) {
        if (own->second.order == setting.order)
          fail(setting.origin, path + " and " + key->path + " both set: give it once, as " + key->path);
        if (own->second.order < setting.order) own->second = setting;
      }
      notes.push_back("note: " + setting.origin + ": " + path + " is read as " + key->path + ", the key of [sync." +
                      method + "]; the flat spelling goes in the next release");
      continue;
    }
    if (flat->refused_for_others && node_literal(*setting.node) != toml_literal(flat->default_value))
      fail(setting.origin, path + " = " + node_literal(*setting.node) + " applies to " +
                               comm::sync_methods_with_key(name) + ", not to sync.method = \"" + method + "\"");
    notes.push_back("config: " + setting.origin + ": " + path + " is ignored: sync.method = \"" + method +
                    "\" has no key " + name + " (" + comm::sync_methods_with_key(name) + " have)");
  }
  for (const std::string& table : ignored_tables)
    notes.push_back("config: [" + table + "] is ignored: sync.method = \"" + method + "\" reads [sync." + method + "]");
  return notes;
}

// Rules that involve more than one key, or more than a range.
void check_consistency(const Config& c, const comm::SyncOptions& sync, const Settings& settings,
                       const std::string& default_origin) {
  // Blame the source that set one of these keys last (a --set beats the file).
  const auto origin = [&](const std::vector<std::string>& paths) {
    const Setting* last = nullptr;
    for (const std::string& p : paths) {
      const auto it = settings.find(p);
      if (it != settings.end() && (!last || it->second.order >= last->order)) last = &it->second;
    }
    return last ? last->origin : default_origin;
  };
  if (c.experiment.name.empty())
    fail(origin({"experiment.name"}), "experiment.name must not be empty");
  if (!std::is_sorted(c.optim.milestones.begin(), c.optim.milestones.end()))
    fail(origin({"optim.milestones"}), "optim.milestones = " + toml_literal(Value(c.optim.milestones)) +
                                           " must be in increasing order");
  if (c.optim.nesterov && c.optim.name != "sgd")
    fail(origin({"optim.nesterov", "optim.name"}),
         "optim.nesterov = true applies to sgd only, not optim.name = \"" + c.optim.name + "\"");
  if (c.optim.nesterov && c.optim.momentum == 0)
    fail(origin({"optim.nesterov", "optim.momentum"}), "optim.nesterov = true needs optim.momentum > 0");
  if (c.optim.schedule == "cosine" && c.optim.min_lr > c.optim.lr)
    fail(origin({"optim.min_lr", "optim.lr", "optim.schedule"}),
         "optim.min_lr = " + toml_literal(Value(c.optim.min_lr)) + " is above optim.lr = " +
             toml_literal(Value(c.optim.lr)) + " (the cosine schedule decays from lr to min_lr)");
  if (c.runtime.communicator == "nccl" && c.runtime.device != "cuda")
    fail(origin({"runtime.communicator", "runtime.device"}),
         "runtime.communicator = \"nccl\" needs runtime.device = \"cuda\" (the CPU uses MPI)");
  // The method's own rules and capabilities (comm/sync/registry.h); sync.method is one of the
  // table's names by now (its choices). A problem names the method's keys by their names.
  const comm::SyncMethod& method = comm::sync_method(c.sync.method);
  if (method.check)
    for (const comm::SyncOptionProblem& problem : method.check(sync)) {
      std::vector<std::string> paths;
      for (const std::string& key : problem.keys)
        paths.push_back(key.find('.') == std::string::npos ? c.sync.key_path(key) : key);
      fail(origin(paths), "[sync." + c.sync.method + "] " + problem.message);
    }
  // A 16-bit sync.wire_dtype runs on every device: the methods that keep device buffers with it
  // (dense, and every method's dense warmup) cast with the backend (Backend::to_half); the
  // compressors' and DiLoCo's specs send them to host copies (needs_host_buffers, host_staged.h).
  // sync.async_ps.momentum_correction applies to SGD and is skipped for adam and adamw, set or not: an error
  // only when set would make the written config.toml (which holds every key) fail to load again.
  if (method.can.applies_update && c.train.skip_nonfinite_steps > 0)
    fail(origin({"train.skip_nonfinite_steps", "sync.method"}),
         "train.skip_nonfinite_steps applies to synchronous methods, not sync.method = \"" + c.sync.method +
             "\" (a worker cannot skip a step the server may already have applied)");
}

}  // namespace

Config parse_config(const std::string& toml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides) {
  toml::table doc;
  try {
    doc = toml::parse(toml_text, source_name);
  } catch (const toml::parse_error& e) {
    std::string what(e.description());
    std::replace(what.begin(), what.end(), '\n', ' ');
    const auto& at = e.source().begin;
    throw ConfigError(source_name + ":" + std::to_string(at.line) + ":" + std::to_string(at.column) +
                      ": " + what);
  }

  Settings settings;
  std::vector<Problem> problems;
  collect(doc, "", source_name, settings, problems);
  if (!problems.empty()) {
    const auto first = std::min_element(problems.begin(), problems.end(), [](const Problem& a, const Problem& b) {
      return std::tie(a.where.line, a.where.column) < std::tie(b.where.line, b.where.column);
    });
    fail(source_name, first->message);
  }

  std::list<toml::table> override_nodes;  // a list: the nodes must not move while settings point at them
  for (size_t i = 0; i < overrides.size(); ++i) apply_override(overrides[i], i + 1, settings, override_nodes);
  std::vector<std::string> notes = resolve_method_tables(settings);

  Config config;
  Loader loader{settings};
  visit_config(config, loader);
  config.notes = std::move(notes);
  // The method's defaults that depend on the recipe (its spec's), where the config is silent; then
  // its rules, on the same options (the run's length is not known here: the data is not read yet).
  comm::SyncOptions sync = sync_options(config);
  const comm::SyncMethod& method = comm::sync_method(config.sync.method);
  if (method.defaults)
    for (const comm::MethodDefault& d : method.defaults(sync))
      if (!settings.count(config.sync.key_path(d.key))) config.sync.keys.set(config.sync.key_path(d.key), d.value);
  sync.keys = config.sync.keys;
  check_consistency(config, sync, settings, source_name);
  return config;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  if (path.empty()) return parse_config("", "(defaults)", overrides);
  std::error_code ec;
  // Reading a directory "succeeds" with no text on Linux, which would silently mean all defaults.
  if (std::filesystem::is_directory(path, ec)) throw ConfigError(path + ": cannot open file (it is a directory)");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path + ": cannot open file");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw ConfigError(path + ": cannot read file");
  return parse_config(text.str(), path, overrides);
}

}  // namespace trainer
