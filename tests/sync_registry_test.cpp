// The method table (comm/sync/registry.h): a method registered here, in this test file alone, with
// keys of its own, is one the config accepts (its keys typed, ranged, defaulted and documented, its
// own rule checked and blamed on its key), --dry-run describes and the factory builds (inside the
// dense warmup), and it runs: its reduce() is the mean over the ranks. The built-in table's capabilities are what the trainer relies on. Run under mpiexec
// with P = 1 and 2.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "comm/communicator.h"
#include "comm/sync/methods/dense/dense.h"
#include "comm/sync/registry.h"
#include "device_like_backend.h"
#include "trainer/config/config.h"
#include "trainer/config/config_sync.h"
#include "trainer/run.h"

using namespace trainer;
using Catch::Matchers::Contains;

namespace {

// test_mean's own keys, as a method declares them in its header (comm/sync/option_keys.h).
struct TestMeanOptions {
  double scale = 1.0;
  int64_t every = 1;
  template <class Keys>
  static void declare(Keys& k) {
    k.key("test_scale", &TestMeanOptions::scale, "the factor the mean is scaled by.", comm::open_closed(0, 10));
    k.key("test_every", &TestMeanOptions::every, "steps between two means; only 1 runs.", comm::at_least(1));
  }
};

// The mean of the ranks' gradients, scaled by its test_scale. Its rule: test_every must be 1.
class TestMean final : public comm::GradientSync {
 public:
  TestMean(comm::Communicator& comm, int64_t n, double scale) : comm_(comm), n_(n), scale_(scale) {}
  std::string name() const override { return "test_mean"; }
  std::string describe() const override { return "test_mean: the mean of " + std::to_string(n_) + " floats, scaled"; }
  comm::Phase phase(int64_t) const override { return comm::Phase::kCompressed; }
  comm::SyncStats reduce(comm::SyncBuffers& b, int64_t) override {
    comm::allreduce_average(comm_, models::cpu_backend(), b.grads, b.n, 1 << 20, "ALLREDUCE_TEST");
    for (int64_t i = 0; i < b.n; ++i) b.grads[i] *= static_cast<float>(scale_);
    return {comm::Phase::kCompressed, 1.0};
  }
  void save(std::ostream&) const override {}
  void load(std::istream&) override {}

 private:
  comm::Communicator& comm_;
  int64_t n_;
  double scale_;
};

void register_test_method() {
  static const bool once = [] {
    comm::SyncMethod m;
    m.name = "test_mean";
    m.doc = "a test's own method";
    comm::declare_options<TestMeanOptions>(m);
    m.check = [](const comm::SyncOptions& o) {
      std::vector<comm::SyncOptionProblem> found;
      if (comm::options_of<TestMeanOptions>(o).every != 1)
        found.push_back({{"test_every"}, "test_every must be 1 for test_mean"});
      return found;
    };
    m.make = [](const comm::SyncOptions& o, const comm::SyncContext& c) -> std::unique_ptr<comm::GradientSync> {
      c.host_backend(o.method);  // a method of host loops, as an extension's first version would be
      return std::make_unique<TestMean>(c.comm, c.n, comm::options_of<TestMeanOptions>(o).scale);
    };
    comm::register_sync_method(m);
    return true;
  }();
  (void)once;
}

std::string error_of(const std::string& toml, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(toml, "configs/x.toml", overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// What `f` prints on stdout.
template <class F>
std::string stdout_of(F f) {
  char path[] = "/tmp/sync_registry_test_XXXXXX";
  const int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  std::fflush(stdout);
  const int saved = dup(STDOUT_FILENO);
  dup2(fd, STDOUT_FILENO);
  f();
  std::fflush(stdout);
  dup2(saved, STDOUT_FILENO);
  close(saved);
  close(fd);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::remove(path);
  return text.str();
}

}  // namespace

TEST_CASE("a method registered in a test file is accepted by the config, its rule blamed on its key", "[registry]") {
  register_test_method();
  const auto names = comm::sync_method_names();
  CHECK(std::find(names.begin(), names.end(), "test_mean") != names.end());
  CHECK(parse_config("[sync]\nmethod = \"test_mean\"\n", "configs/x.toml").sync.method == "test_mean");
  CHECK(error_of("[sync]\nmethod = \"test_mean\"\n[sync.test_mean]\ntest_every = 2\n") ==
        "configs/x.toml: [sync.test_mean] test_every must be 1 for test_mean");
  CHECK(error_of("[sync]\nmethod = \"test_mean\"\n", {"sync.test_mean.test_every=3"}) ==
        "--set sync.test_mean.test_every=3: [sync.test_mean] test_every must be 1 for test_mean");
  // Its keys are config keys, in its own table: typed, ranged, defaulted, documented, written back.
  CHECK(error_of("[sync]\nmethod = \"test_mean\"\n[sync.test_mean]\ntest_scale = 20\n") ==
        "configs/x.toml: sync.test_mean.test_scale = 20.0 is out of range (0, 10]");
  CHECK_THAT(error_of("[sync.test_mean]\ntest_scael = 2\n"), Contains("did you mean 'sync.test_mean.test_scale'?"));
  const Config defaults = parse_config("[sync]\nmethod = \"test_mean\"\n", "t");
  CHECK(defaults.sync.get<double>("test_scale") == 1.0);
  CHECK_THAT(config_reference_markdown(), Contains("## [sync.test_mean]") && Contains("the factor the mean is scaled by."));
  CHECK_THAT(to_toml(defaults), Contains("[sync.test_mean]") && Contains("test_scale = 1.0"));
  CHECK(parse_config(to_toml(defaults), "config.toml") == defaults);
  // Not a key it declared: no keep_dense (it does not compress).
  CHECK_THAT(error_of("[sync]\nmethod = \"test_mean\"\nkeep_dense = \"fc.*\"\n"),
             Contains("keep_dense = \"fc.*\" applies to oktopk, topka, gaussiank, gtopk and powersgd, not to "
                      "sync.method = \"test_mean\""));
  CHECK_THROWS_WITH(comm::register_sync_method([] {
                      comm::SyncMethod again;
                      again.name = "test_mean";
                      again.make = [](const comm::SyncOptions&, const comm::SyncContext&) { return nullptr; };
                      return again;
                    }()),
                    Contains("registered already"));
}

TEST_CASE("a registered method is built by the factory, inside the dense warmup, and runs", "[registry]") {
  register_test_method();
  comm::Communicator& world = comm::world();
  const int p = world.size(), r = world.rank();
  Config config = parse_config("[sync]\nmethod = \"test_mean\"\ndense_warmup_steps = 2\n[sync.test_mean]\ntest_scale = 0.5\n", "t");
  const int64_t n = 5;
  auto sync = comm::make_gradient_sync(sync_options(config), world, n);
  CHECK(sync->name() == "test_mean");
  CHECK_THAT(sync->describe(), Contains("first 2 steps: dense") && Contains("test_mean: the mean of 5 floats"));
  CHECK(sync->phase(1) == comm::Phase::kDense);
  CHECK(sync->phase(2) == comm::Phase::kCompressed);
  // Rank q's gradient entry i is q + i: the mean over ranks is (p - 1) / 2 + i, scaled by 0.5
  // after the warmup (exact in float: halves of small integers).
  std::vector<float> params(n, 0.f), grads(n);
  comm::SyncBuffers b{params.data(), grads.data(), n};
  for (int64_t step : {0, 2}) {
    for (int64_t i = 0; i < n; ++i) grads[i] = static_cast<float>(r + i);
    sync->reduce(b, step);
    const float scale = step < 2 ? 1.f : 0.5f;
    for (int64_t i = 0; i < n; ++i) CHECK(grads[i] == scale * ((p - 1) / 2.f + static_cast<float>(i)));
  }
}

TEST_CASE("methods that keep host state get a host backend: staged by the factory on a device, refused directly",
          "[registry]") {
  comm::Communicator& world = comm::world();
  trainer::models::DeviceLikeCpu device;  // not host memory, as a GPU's
  const std::vector<models::ParamView> views{{"w", 0, {4, 2}}, {"b", 8, {4}}};
  const std::vector<bool> none;
  register_test_method();
  for (const char* method : {"test_mean"}) {
    INFO(method);
    Config config = parse_config(std::string("[sync]\nmethod = \"") + method + "\"\n", "t");
    comm::SyncOptions o = sync_options(config);
    const comm::SyncContext direct{world, 12, &views, device, none};
    CHECK_THROWS_WITH(comm::sync_method(method).make(o, direct), Contains("keeps its state in host memory"));
    o.backend = &device;  // through the factory: built for the host, run on host copies
    CHECK(comm::make_gradient_sync(o, world, 12, &views)->name() == method);
  }
}

TEST_CASE("a sparse method takes device buffers unless its options need host loops", "[registry]") {
  trainer::models::DeviceLikeCpu device;
  const std::vector<models::ParamView> views{{"w", 0, {4, 2}}, {"b", 8, {4}}};
  Config config = parse_config("[sync]\nmethod = \"oktopk\"\n", "t");
  comm::SyncOptions o = sync_options(config);
  o.backend = &device;
  const comm::SyncMethod& spec = comm::sync_method("oktopk");
  CHECK(comm::takes_device_buffers(spec, o));
  CHECK_THAT(comm::make_gradient_sync(o, comm::world(), 12, &views)->describe(), !Contains("through host memory"));
  o.set("keep_dense", "b");  // keep_dense's gathers are host loops: host copies
  CHECK_FALSE(comm::takes_device_buffers(spec, o));
  CHECK_THAT(comm::make_gradient_sync(o, comm::world(), 12, &views)->describe(), Contains("through host memory"));
  o.set("keep_dense", "");
  o.set("adaptive", true);  // so is Accordion's detector
  o.set("adaptive_density", 0.5);
  CHECK_FALSE(comm::takes_device_buffers(spec, o));
}

TEST_CASE("--dry-run describes a registered method", "[registry]") {
  register_test_method();
  const Config config = parse_config("[sync]\nmethod = \"test_mean\"\n", "t");
  const std::string out = stdout_of([&] { app::print_dry_run(config, comm::world()); });
  if (comm::world().rank() != 0) return;  // rank 0 prints
  CHECK_THAT(out, Contains("method = \"test_mean\""));
  CHECK_THAT(out, Contains("sync: test_mean: the mean of 269722 floats, scaled"));
  CHECK_THAT(out, Contains("overlap with backward: none (test_mean starts after backward)"));
}

TEST_CASE("the built-in methods' capabilities", "[registry]") {
  using comm::SyncCapabilities;
  CHECK(comm::sync_methods_that(&SyncCapabilities::device_buffers) ==
        "dense, local_sgd, diloco, sparseloco, oktopk, topka, gaussiank, gtopk, powersgd and async_ps");
  CHECK(comm::sync_methods_that(&SyncCapabilities::compresses) == "oktopk, topka, gaussiank, gtopk and powersgd");
  CHECK(comm::sync_methods_that(&SyncCapabilities::applies_update) == "async_ps");
  for (const char* name : {"local_sgd", "diloco", "sparseloco", "async_ps"})
    CHECK_FALSE(comm::sync_method(name).can.keeps_parameters_equal);
  for (const char* name : {"dense", "oktopk", "powersgd"}) CHECK(comm::sync_method(name).can.keeps_parameters_equal);
  CHECK_FALSE(comm::sync_method("dense").can.wrapped_in_warmup);
  CHECK_FALSE(comm::sync_method("async_ps").can.wrapped_in_warmup);
  CHECK(comm::sync_method("diloco").can.wrapped_in_warmup);
  CHECK_THROWS_WITH(comm::sync_method("sparse"), Contains("unknown sync.method 'sparse' (available: dense, local_sgd"));
}

TEST_CASE("diloco's rules are checked once, by the config, naming the key set last", "[registry]") {
  CHECK(error_of("[sync]\nmethod = \"diloco\"\n[sync.diloco]\nperiod = 4\nfragments = 8\n") ==
        "configs/x.toml: [sync.diloco] fragments = 8 must be between 1 and period = 4 (one fragment syncs every "
        "period / fragments steps)");
  CHECK(error_of("[sync]\nmethod = \"diloco\"\n[sync.diloco]\nperiod = 4\nfragments = 2\n", {"sync.diloco.sync_delay=2"}) ==
        "--set sync.diloco.sync_delay=2: [sync.diloco] sync_delay = 2 must be below period / fragments = 2 (a "
        "fragment's outer step must land before the next fragment is sent)");
  CHECK_THAT(error_of("[sync]\nmethod = \"diloco\"\n[sync.diloco]\nouter_momentum = 0.0\n"),
             Contains("[sync.diloco] outer_optimizer = \"nesterov\" needs outer_momentum > 0"));
  // The same options under another method are not diloco's business.
  CHECK(error_of("[sync]\nmethod = \"local_sgd\"\nperiod = 4\nfragments = 8\n").empty());
}

TEST_CASE("sparseloco's bad values are one line naming the key; its defaults are the paper's", "[registry]") {
  CHECK(error_of("[sync]\nmethod = \"sparseloco\"\nvalue_bits = 3\n") ==
        "configs/x.toml: [sync.sparseloco] value_bits = 3 must be 2, 4, 8 or 32");
  CHECK_THAT(error_of("[sync]\nmethod = \"sparseloco\"\nerror_decay = 1.5\n"), Contains("error_decay"));
  CHECK_THAT(error_of("[sync]\nmethod = \"sparseloco\"\nperiod = 4\nfragments = 8\n"),
             Contains("[sync.sparseloco] fragments = 8 must be between 1 and period = 4"));
  CHECK_THAT(error_of("[sync]\nmethod = \"sparseloco\"\ndensity = 0.0\n"), Contains("density"));
  // Unset, its keys take the paper's values (H as diloco's default): its table's own defaults.
  const Config c = parse_config("[sync]\nmethod = \"sparseloco\"\n", "t");
  CHECK(c.sync.get<int64_t>("period") == 8);
  CHECK(c.sync.get<double>("outer_lr") == 1.0);
  CHECK(c.sync.get<double>("density") == 0.02);
  CHECK(c.sync.get<double>("error_decay") == 0.95);
  CHECK(c.sync.get<int64_t>("value_bits") == 2);
}
