// Fuzz target: the experiment file as the trainer loads it: TOML parsing, the schema (types,
// ranges, choices, unknown keys), --set overrides and the consistency checks (parse_config, which
// load_config runs on the file's text). Input: <TOML> %% <override> %% <override> ... (up to four
// overrides, "key.path=value" as given to --set). A ConfigError must be one line starting with the
// file name or the --set argument; an accepted config must survive to_toml and parse back equal
// (config.h promises parse_config(to_toml(c)) == c).
#include <stdexcept>

#include "tests/fuzz/fuzz_input.h"
#include "trainer/config/config.h"

using namespace trainer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> parts = fuzz::split_parts(data, size, 5);
  const std::string toml = parts[0];
  std::vector<std::string> overrides;
  for (size_t i = 1; i < parts.size(); ++i)
    if (!parts[i].empty()) overrides.push_back(parts[i]);
  Config config;
  try {
    config = parse_config(toml, "fuzz.toml", overrides);
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    fuzz::check_error_message(what, what.rfind("--set ", 0) == 0 ? "--set " : "fuzz.toml");
    return 0;
  }
  const std::string written = to_toml(config);
  Config again;
  try {
    again = parse_config(written, "written.toml");
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "an accepted config does not parse back: %s\n%s\n", e.what(), written.c_str());
    std::abort();
  }
  if (again != config) {
    std::fprintf(stderr, "an accepted config changes through to_toml:\n%s\n", written.c_str());
    std::abort();
  }
  return 0;
}
