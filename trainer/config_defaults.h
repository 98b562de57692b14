// Defaults that depend on the sync method and the optimizer (issue 33: a user who switches
// sync.method in a working config and changes nothing else should not lose accuracy to a default).
// Each was chosen from runs this project measured (BENCHMARKS.md, "Defaults that hold accuracy"):
//   - diloco: sync.period (H) 8, and sync.outer_momentum 0.5 over SGD with momentum (the DiLoCo
//     paper's 0.9 is for AdamW inner steps; over SGD momentum 0.9 the two momenta compound and runs
//     diverged or lost 7 to 11 points); 0.9 with adam and adamw;
//   - local_sgd: sync.period 4;
//   - powersgd with sync.adaptive: sync.rank 1 under sync.adaptive_rank 4 (the pair measured).
// The method-independent keys' own defaults (sync.rank, sync.density) are set in the schema.
//
// A default applies only where the config leaves the key unset: a value in the file or a --set
// always wins. The written config.toml holds every key, so a resumed run keeps the values.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "trainer/config.h"

namespace trainer {

struct MethodDefault {
  std::string key;    // "sync.period"
  double value;       // every such key is a number
  std::string why;    // what it is for and what was measured, one clause
};

// The defaults that c's method and optimizer have (empty for dense and async_ps).
std::vector<MethodDefault> method_defaults(const Config& c);

// Sets on c each default whose key is_set(key) says the config left unset.
void apply_method_defaults(Config& c, const std::function<bool(const std::string&)>& is_set);

// For --dry-run and the start: one line per default of c's method whose value c holds, e.g.
//   "sync.period = 8: diloco's default H (...)". Empty when c's method has none.
std::vector<std::string> method_default_lines(const Config& c);

}  // namespace trainer
