// The method table (comm/sync/registry.cpp) for the fuzz targets, which link the config reader
// without the sync methods (and so without MPI and oneDNN): the built-in methods by name, with
// default capabilities and no rules. The config's parsing and validation are what is fuzzed; the
// methods' own rules are tested in tests/config_test.cpp against the real table.
#include <memory>
#include <stdexcept>

#include "comm/sync/registry.h"

namespace trainer::comm {
namespace {

SyncMethod named(const char* name) {
  SyncMethod m;
  m.name = name;
  m.doc = "(fuzz build)";
  m.make = [](const SyncOptions&, const SyncContext&) -> std::unique_ptr<GradientSync> {
    throw std::logic_error("the fuzz build has no sync methods");
  };
  return m;
}

}  // namespace

SyncMethod dense_method() { return named("dense"); }
SyncMethod local_sgd_method() { return named("local_sgd"); }
SyncMethod diloco_method() { return named("diloco"); }
SyncMethod oktopk_method() { return named("oktopk"); }
SyncMethod topka_method() { return named("topka"); }
SyncMethod gaussiank_method() { return named("gaussiank"); }
SyncMethod gtopk_method() { return named("gtopk"); }
SyncMethod powersgd_method() { return named("powersgd"); }
SyncMethod async_ps_method() { return named("async_ps"); }

}  // namespace trainer::comm
