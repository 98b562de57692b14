// The method table (comm/sync/registry.cpp) for the fuzz targets, which link the config reader
// without the sync methods (and so without MPI and oneDNN): the built-in methods of
// comm/sync/methods.h, each with its own keys read from its options struct (declared in the method's
// header), default capabilities and no rules, defaults or factory. The config's parsing and
// validation are what is fuzzed; the methods' own rules are tested in tests/config_test.cpp against
// the real table.
#include <memory>
#include <stdexcept>

#include "comm/sync/methods/async_ps/async_ps.h"
#include "comm/sync/wrappers/compressor_options.h"
#include "comm/sync/methods/demo/demo.h"
#include "comm/sync/methods/outer/diloco.h"
#include "comm/sync/methods/local_sgd/local_sgd.h"
#include "comm/sync/methods.h"
#include "comm/sync/methods/sparse/oktopk.h"
#include "comm/sync/methods/powersgd/powersgd.h"
#include "comm/sync/registry.h"
#include "comm/sync/methods/outer/sparseloco.h"

namespace trainer::comm {
namespace {

template <class Options>
SyncMethod keys_only(const char* name) {
  SyncMethod m;
  m.name = name;
  m.doc = "(fuzz build)";
  declare_options<Options>(m);
  m.make = [](const SyncOptions&, const SyncContext&) -> std::unique_ptr<GradientSync> {
    throw std::logic_error("the fuzz build has no sync methods");
  };
  return m;
}

}  // namespace

#define TRAINER_FUZZ_SYNC_METHOD(name, options) \
  SyncMethod name##_method() { return keys_only<options>(#name); }
TRAINER_SYNC_METHODS(TRAINER_FUZZ_SYNC_METHOD)
#undef TRAINER_FUZZ_SYNC_METHOD

}  // namespace trainer::comm
