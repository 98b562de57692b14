// trainer/config: loading, validation, --set overrides, the resolved config.toml and the reference
// documentation.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "comm/sync/registry.h"
#include "trainer/config/config.h"
#include "trainer/config/config_schema.h"
#include "trainer/config/config_sync.h"

using namespace trainer;

namespace {

Config parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return parse_config(text, "configs/x.toml", overrides);
}

// The message of the ConfigError that parsing `text` throws ("" when it does not throw).
std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse(text, overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("keys the file does not set keep their defaults", "[config]") {
  CHECK(parse("") == Config{});
  const Config c = parse("[optim]\nlr = 0.05\n\n[train]\nepochs = 3\n");
  CHECK(c.optim.lr == 0.05);
  CHECK(c.train.epochs == 3);
  Config expected;
  expected.optim.lr = 0.05;
  expected.train.epochs = 3;
  CHECK(c == expected);
  CHECK(c.optim.milestones == std::vector<int64_t>{100, 150});
  CHECK(c.model.arch == "resnet20");
  CHECK(output_dir(c) == "runs/quickstart");
  CHECK(output_dir(parse("[experiment]\noutput_dir = \"/tmp/r\"\n")) == "/tmp/r");
  // Dotted keys and inline tables are the same TOML.
  CHECK(parse("optim.lr = 0.05\ntrain = { epochs = 3 }\n") == expected);
}

TEST_CASE("method-dependent defaults apply where the config is silent, and say so", "[config]") {
  // diloco over the default optimizer (sgd, momentum 0.9): outer momentum 0.5; H = 8 is its key's own.
  Config c = parse("[sync]\nmethod = \"diloco\"\n");
  CHECK(c.sync.get<int64_t>("period") == 8);
  CHECK(c.sync.get<double>("outer_momentum") == 0.5);
  const auto lines = method_default_lines(sync_options(c));
  REQUIRE(lines.size() == 1);
  CHECK_THAT(lines[0], Catch::StartsWith("sync.diloco.outer_momentum = 0.5: "));
  // The paper's 0.9 over AdamW; a value the file or a --set gives always wins.
  CHECK(parse("[optim]\nname = \"adamw\"\n[sync]\nmethod = \"diloco\"\n").sync.get<double>("outer_momentum") == 0.9);
  c = parse("[sync]\nmethod = \"diloco\"\n[sync.diloco]\nperiod = 2\n", {"sync.diloco.outer_momentum=0.7"});
  CHECK(c.sync.get<int64_t>("period") == 2);
  CHECK(c.sync.get<double>("outer_momentum") == 0.7);
  CHECK(method_default_lines(sync_options(c)).empty());  // not the default's value
  CHECK(method_default_lines(sync_options(parse(""))).empty());
  // powersgd under adaptive: the measured pair, rank 1 below adaptive_rank 4.
  c = parse("", {"sync.method=powersgd", "sync.powersgd.adaptive=true"});
  CHECK(c.sync.get<int64_t>("rank") == 1);
  CHECK(c.sync.get<int64_t>("adaptive_rank") == 4);
  // The sparse methods under adaptive: 0.01 below adaptive_density's 0.1; without it the
  // measured 0.1 (the key's), and powersgd's measured rank 8.
  CHECK(parse("", {"sync.method=oktopk", "sync.oktopk.adaptive=true"}).sync.get<double>("density") == 0.01);
  CHECK(parse("", {"sync.method=oktopk"}).sync.get<double>("density") == 0.1);
  CHECK(parse("", {"sync.method=powersgd"}).sync.get<int64_t>("rank") == 8);
  // The written config holds the chosen values, and reads back to the same config.
  c = parse("[sync]\nmethod = \"diloco\"\n");
  CHECK(parse_config(to_toml(c), "config.toml") == c);
}

TEST_CASE("each method's keys are its own table, with its own defaults", "[config]") {
  // One key name, three tables, three defaults: none constrains another.
  CHECK(parse("", {"sync.method=oktopk"}).sync.get<double>("density") == 0.1);
  CHECK(parse("", {"sync.method=sparseloco"}).sync.get<double>("density") == 0.02);
  CHECK(parse("", {"sync.method=demo"}).sync.get<double>("density") == 1.0 / 128);
  CHECK(parse("", {"sync.method=demo"}).sync.get<int64_t>("value_bits") == 32);
  CHECK(parse("", {"sync.method=sparseloco"}).sync.get<int64_t>("value_bits") == 2);
  CHECK(parse("", {"sync.method=local_sgd"}).sync.get<int64_t>("period") == 4);
  // The key table documents each method's key under its own path and default.
  REQUIRE(config_schema::find_key("sync.sparseloco.density"));
  CHECK(config_schema::find_key("sync.sparseloco.density")->default_value == comm::Value(0.02));
  CHECK(config_schema::find_key("sync.oktopk.density")->default_value == comm::Value(0.1));
  CHECK(config_schema::find_key("sync.oktopk.density")->section == "sync.oktopk");
  CHECK_FALSE(config_schema::find_key("sync.density"));
  CHECK_FALSE(config_schema::find_key("sync.dense.density"));
  // A table sets the key; a --set of the full path beats the file.
  Config c = parse("[sync]\nmethod = \"oktopk\"\n[sync.oktopk]\ndensity = 0.01\ndgc = true\n");
  CHECK(c.sync.get<double>("density") == 0.01);
  CHECK(c.sync.get<bool>("dgc"));
  CHECK(c.notes.empty());
  CHECK(parse("[sync]\nmethod = \"oktopk\"\n[sync.oktopk]\ndensity = 0.01\n", {"sync.oktopk.density=0.05"})
            .sync.get<double>("density") == 0.05);
  // config.toml holds sync.method's table only, and reads back to the same config.
  const std::string written = to_toml(c);
  CHECK(written.find("[sync.oktopk]") != std::string::npos);
  CHECK(written.find("[sync.powersgd]") == std::string::npos);
  CHECK(parse_config(written, "config.toml") == c);
  // Another method's table is read and checked, then ignored with a note.
  c = parse("[sync]\nmethod = \"oktopk\"\n[sync.powersgd]\nrank = 2\n");
  REQUIRE(c.notes.size() == 1);
  CHECK(c.notes[0] == "config: [sync.powersgd] is ignored: sync.method = \"oktopk\" reads [sync.oktopk]");
  CHECK(to_toml(c) == to_toml(parse("[sync]\nmethod = \"oktopk\"\n")));
  CHECK(c == parse("[sync]\nmethod = \"oktopk\"\n"));
  CHECK_THAT(error_of("[sync.powersgd]\nrank = 0\n"), Catch::Matchers::Contains("sync.powersgd.rank = 0 is out of range"));
  // A table that is no method's, and a key a table does not have, name what there is.
  CHECK_THAT(error_of("[sync.oktopkk]\ndensity = 0.1\n"),
             Catch::Matchers::StartsWith("configs/x.toml: unknown table [sync.oktopkk]: the methods' tables are") &&
                 Catch::Matchers::Contains("(did you mean [sync.oktopk]?)"));
  CHECK(error_of("[sync.oktopk]\ndensty = 0.1\n") ==
        "configs/x.toml: unknown key 'sync.oktopk.densty' (did you mean 'sync.oktopk.density'?)");
  CHECK_THAT(error_of("", {"sync.dense.density=0.1"}), Catch::Matchers::Contains("unknown key 'sync.dense.density'"));
  // A rule between a method's keys names them in its table and blames the one set last.
  CHECK_THAT(error_of("[sync]\nmethod = \"diloco\"\n[sync.diloco]\nperiod = 4\nfragments = 2\n", {"sync.diloco.sync_delay=2"}),
             Catch::Matchers::StartsWith(
                 "--set sync.diloco.sync_delay=2: [sync.diloco] sync_delay = 2 must be below period / fragments = 2"));
}

TEST_CASE("older configs' flat spelling reads as sync.method's key, with a note", "[config]") {
  const Config c = parse("[sync]\nmethod = \"oktopk\"\ndensity = 0.01\n", {"sync.dgc=true"});
  CHECK(c.sync.get<double>("density") == 0.01);
  CHECK(c.sync.get<bool>("dgc"));
  CHECK(c == parse("[sync]\nmethod = \"oktopk\"\n[sync.oktopk]\ndensity = 0.01\ndgc = true\n"));
  REQUIRE(c.notes.size() == 2);
  CHECK_THAT(c.notes, Catch::Matchers::VectorContains(std::string(
                          "note: configs/x.toml: sync.density is read as sync.oktopk.density, the key of [sync.oktopk]; "
                          "the flat spelling goes in the next release")));
  // The method set after the key (a --set) decides whose key it is.
  CHECK(parse("[sync]\nperiod = 2\n", {"sync.method=local_sgd"}).sync.get<int64_t>("period") == 2);
  // The later of the two spellings wins; both in the file is an error naming both.
  CHECK(parse("[sync]\nmethod = \"oktopk\"\n[sync.oktopk]\ndensity = 0.01\n", {"sync.density=0.05"})
            .sync.get<double>("density") == 0.05);
  CHECK(error_of("[sync]\nmethod = \"oktopk\"\ndensity = 0.02\n[sync.oktopk]\ndensity = 0.01\n") ==
        "configs/x.toml: sync.density and sync.oktopk.density both set: give it once, as sync.oktopk.density");
  // Under a method without the key it is ignored with a note, as it was ignored before ...
  const Config dense = parse("[sync]\ndensity = 0.01\n");
  CHECK(dense == parse(""));
  REQUIRE(dense.notes.size() == 1);
  CHECK_THAT(dense.notes[0], Catch::Matchers::Contains("density is ignored: sync.method = \"dense\" has no key density"));
  // ... except a key that would silently do nothing, which stays an error.
  CHECK(error_of("[sync]\nadaptive = true\n") ==
        "configs/x.toml: sync.adaptive = true applies to oktopk, topka, gaussiank, gtopk and powersgd, not to "
        "sync.method = \"dense\"");
  CHECK(error_of("[sync]\nadaptive = false\n").empty());
  // Its value is checked as the method's key.
  CHECK_THAT(error_of("[sync]\nmethod = \"oktopk\"\ndensity = 2.0\n"),
             Catch::Matchers::Contains("sync.oktopk.density = 2.0 is out of range (0, 1]"));
}

TEST_CASE("unknown keys name the key and suggest the nearest one", "[config]") {
  CHECK(error_of("[optim]\nlearning_rate = 0.1\n") ==
        "configs/x.toml: unknown key 'optim.learning_rate' (did you mean 'optim.lr'?)");
  CHECK(error_of("[optim]\nmomentun = 0.9\n") ==
        "configs/x.toml: unknown key 'optim.momentun' (did you mean 'optim.momentum'?)");
  // The last component is matched across sections.
  CHECK(error_of("[train]\nlr = 0.1\n") == "configs/x.toml: unknown key 'train.lr' (did you mean 'optim.lr'?)");
  CHECK(error_of("lr = 0.1\n") == "configs/x.toml: unknown key 'lr' (did you mean 'optim.lr'?)");
  CHECK(error_of("[data]\nbatch = 64\n") ==
        "configs/x.toml: unknown key 'data.batch' (did you mean 'data.batch_size'?)");
  CHECK(error_of("[optim]\nwd = 0.1\n") ==
        "configs/x.toml: unknown key 'optim.wd' (did you mean 'optim.weight_decay'?)");
  // Nothing close: no suggestion.
  CHECK(error_of("[optim]\nflux_capacitor = 1\n") == "configs/x.toml: unknown key 'optim.flux_capacitor'");
  // A table where a key is expected, or nested below a key, is unknown too.
  CHECK(error_of("[optim.adam]\nbeta1 = 0.9\n") == "configs/x.toml: unknown key 'optim.adam'");
  // With several problems, the first in the file is reported.
  CHECK(error_of("[train]\nzzz_b = 1\n[data]\nzzz_a = 1\n") == "configs/x.toml: unknown key 'train.zzz_b'");
}

TEST_CASE("unknown sections are errors", "[config]") {
  CHECK(error_of("[optimizer]\nlr = 0.1\n") ==
        "configs/x.toml: unknown section [optimizer] (did you mean [optim]?)");
  CHECK(error_of("[trian]\nepochs = 1\n") == "configs/x.toml: unknown section [trian] (did you mean [train]?)");
  CHECK(error_of("[logging]\nlevel = 1\n") == "configs/x.toml: unknown section [logging]");
  CHECK(error_of("optim = 3\n") == "configs/x.toml: optim must be a table ([optim]), got integer 3");
}

TEST_CASE("values of the wrong type name the key and the expected type", "[config]") {
  CHECK(error_of("[optim]\nlr = \"fast\"\n") == "configs/x.toml: optim.lr must be a number, got string \"fast\"");
  CHECK(error_of("[train]\nepochs = 10.5\n") == "configs/x.toml: train.epochs must be an integer, got float 10.5");
  CHECK(error_of("[train]\nepochs = 10.0\n") == "configs/x.toml: train.epochs must be an integer, got float 10.0");
  CHECK(error_of("[data]\naugment = 1\n") == "configs/x.toml: data.augment must be true or false, got integer 1");
  CHECK(error_of("[model]\narch = 20\n") == "configs/x.toml: model.arch must be a string, got integer 20");
  CHECK(error_of("[optim]\nmilestones = [1, \"x\"]\n") ==
        "configs/x.toml: optim.milestones must be an array of integers, got array [1, \"x\"]");
  CHECK(error_of("[optim]\nmilestones = 100\n") ==
        "configs/x.toml: optim.milestones must be an array of integers, got integer 100");
  CHECK(error_of("[optim.lr]\nx = 1\n") == "configs/x.toml: optim.lr must be a number, got a table");
  // Integers are accepted where numbers are expected.
  CHECK(parse("[optim]\nlr = 1\n").optim.lr == 1.0);
}

TEST_CASE("values outside their range or choices are errors", "[config]") {
  CHECK(error_of("[optim]\nmomentum = 1.5\n") == "configs/x.toml: optim.momentum = 1.5 is out of range [0, 1)");
  CHECK(error_of("[optim]\nmomentum = 1\n") == "configs/x.toml: optim.momentum = 1.0 is out of range [0, 1)");
  CHECK(parse("[optim]\nmomentum = 0\n").optim.momentum == 0.0);
  CHECK(error_of("[train]\nepochs = 0\n") == "configs/x.toml: train.epochs = 0 is out of range [1, inf)");
  CHECK(error_of("[optim]\ngamma = 0.0\n") == "configs/x.toml: optim.gamma = 0.0 is out of range (0, 1]");
  CHECK(error_of("[optim]\nlr = nan\n") == "configs/x.toml: optim.lr = nan is out of range [0, 10]");
  CHECK(error_of("[model]\nnum_classes = 1\n") == "configs/x.toml: model.num_classes = 1 is out of range [2, 1000000]");
  CHECK(error_of("[optim]\nmilestones = [10, -1]\n") ==
        "configs/x.toml: optim.milestones element -1 is out of range [0, inf)");
  CHECK(error_of("[model]\narch = \"resnet21\"\n") ==
        "configs/x.toml: model.arch = \"resnet21\" is not one of resnet20, resnet32, resnet56, resnet18, "
        "vgg16, deepspeech, las (did you mean \"resnet20\"?)");
  CHECK(error_of("[optim]\nschedule = \"step\"\n") ==
        "configs/x.toml: optim.schedule = \"step\" is not one of constant, multistep, cosine, exponential");
}

TEST_CASE("rules across keys", "[config]") {
  CHECK(error_of("[optim]\nmilestones = [150, 100]\n") ==
        "configs/x.toml: optim.milestones = [150, 100] must be in increasing order");
  CHECK(error_of("[optim]\nmomentum = 0.0\nnesterov = true\n") ==
        "configs/x.toml: optim.nesterov = true needs optim.momentum > 0");
  // The source that set one of the keys last is blamed.
  CHECK(error_of("[optim]\nnesterov = true\n", {"optim.momentum=0"}) ==
        "--set optim.momentum=0: optim.nesterov = true needs optim.momentum > 0");
  CHECK(error_of("[optim]\nschedule = \"cosine\"\nmin_lr = 0.5\n") ==
        "configs/x.toml: optim.min_lr = 0.5 is above optim.lr = 0.1 (the cosine schedule decays from lr to "
        "min_lr)");
  CHECK(error_of("[experiment]\nname = \"\"\n") == "configs/x.toml: experiment.name must not be empty");
  // Device buffers: NCCL only for them; every method runs with them (those that compute on the host
  // through host copies, comm/sync/wrappers/host_staged.h).
  CHECK(error_of("[runtime]\ncommunicator = \"nccl\"\n") ==
        "configs/x.toml: runtime.communicator = \"nccl\" needs runtime.device = \"cuda\" (the CPU uses MPI)");
  for (const char* method : {"oktopk", "powersgd", "diloco", "async_ps"})
    CHECK(error_of(std::string("[runtime]\ndevice = \"cuda\"\n[sync]\nmethod = \"") + method + "\"\n").empty());
  CHECK(error_of("[runtime]\ndevice = \"cuda\"\ncommunicator = \"mpi\"\n[sync]\nmethod = \"local_sgd\"\n").empty());
  CHECK(error_of("[runtime]\ncommunicator = \"gloo\"\n").find("runtime.communicator") != std::string::npos);
}

TEST_CASE("sync.wire_dtype: fp32 by default, bf16 and fp16, anything else one line naming the key", "[config]") {
  CHECK(Config{}.sync.wire_dtype == "fp32");
  CHECK(parse("[sync]\nwire_dtype = \"bf16\"\n").sync.wire_dtype == "bf16");
  CHECK(parse("", {"sync.wire_dtype=fp16"}).sync.wire_dtype == "fp16");
  CHECK(error_of("[sync]\nwire_dtype = \"bf15\"\n") ==
        "configs/x.toml: sync.wire_dtype = \"bf15\" is not one of fp32, bf16, fp16 (did you mean \"bf16\"?)");
  CHECK(error_of("", {"sync.wire_dtype=half"}) == "--set sync.wire_dtype=half: sync.wire_dtype = \"half\" is not one of "
                                                  "fp32, bf16, fp16");
  CHECK(error_of("[sync]\nwire_dtype = 16\n").find("sync.wire_dtype") != std::string::npos);
  // Every method takes a 16-bit wire on a device: dense (and every dense warmup) casts with the
  // backend, the compressors on host copies as on the CPU.
  for (const char* method : {"dense", "local_sgd", "oktopk"})
    CHECK(error_of(std::string("[runtime]\ndevice = \"cuda\"\n[sync]\nmethod = \"") + method +
                   "\"\nwire_dtype = \"fp16\"\n")
              .empty());
  CHECK(error_of("[runtime]\ndevice = \"cuda\"\n[sync]\nmethod = \"powersgd\"\nwire_dtype = \"bf16\"\n").empty());
}

TEST_CASE("optimizer choice: sgd, adam, adamw with betas and eps", "[config]") {
  const Config defaults;
  CHECK(defaults.optim.name == "sgd");
  CHECK(defaults.optim.beta1 == 0.9);
  CHECK(defaults.optim.beta2 == 0.999);
  CHECK(defaults.optim.eps == 1e-8);
  const Config c = parse("[optim]\nname = \"adamw\"\nbeta1 = 0.8\nbeta2 = 0.99\neps = 1e-6\nweight_decay = 0.01\n");
  CHECK(c.optim.name == "adamw");
  CHECK(c.optim.beta1 == 0.8);
  CHECK(c.optim.beta2 == 0.99);
  CHECK(c.optim.eps == 1e-6);
  CHECK(parse("", {"optim.name=adam"}).optim.name == "adam");
  CHECK(error_of("[optim]\nname = \"adagrad\"\n") ==
        "configs/x.toml: optim.name = \"adagrad\" is not one of sgd, adam, adamw");
  CHECK(error_of("[optim]\nbeta1 = 1.0\n") == "configs/x.toml: optim.beta1 = 1.0 is out of range [0, 1)");
  CHECK(error_of("[optim]\nbeta2 = -0.5\n") == "configs/x.toml: optim.beta2 = -0.5 is out of range [0, 1)");
  CHECK(error_of("[optim]\neps = 0.0\n") == "configs/x.toml: optim.eps = 0.0 is out of range (0, 1]");
  // Nesterov is SGD's; momentum is simply unused by adam (its default is 0.9).
  CHECK(error_of("[optim]\nname = \"adam\"\nnesterov = true\n") ==
        "configs/x.toml: optim.nesterov = true applies to sgd only, not optim.name = \"adam\"");
  CHECK(error_of("[optim]\nnesterov = true\n", {"optim.name=adamw"}) ==
        "--set optim.name=adamw: optim.nesterov = true applies to sgd only, not optim.name = \"adamw\"");
  CHECK(error_of("[optim]\nname = \"adam\"\nmomentum = 0.5\n").empty());
  // async_ps's momentum correction lowers SGD's momentum: adam has none to lower, so it does not
  // apply, set or not (an error only when set broke the written config's round trip: the fuzzer).
  CHECK(error_of("[optim]\nname = \"adam\"\n[sync]\nmomentum_correction = \"momentum\"\n").empty());
  CHECK(error_of("[sync]\nmethod = \"async_ps\"\nmomentum_correction = \"momentum_and_lr\"\nstaleness_lr = \"gap\"\n")
            .empty());
  // The default correction is skipped with adam, not an error.
  CHECK(error_of("[optim]\nname = \"adam\"\n[sync]\nmethod = \"async_ps\"\n").empty());
}

TEST_CASE("overrides are typed and beat the file in order", "[config]") {
  const Config c = parse("[optim]\nlr = 0.05\nmomentum = 0.8\n",
                         {"optim.lr=0.2", "train.epochs=7", "optim.nesterov=true", "model.arch=resnet56",
                          "experiment.name=\"quoted name\"", "optim.milestones=[3, 5]",
                          "optim.weight_decay=0", "experiment.output_dir = out/x", "experiment.seed=123",
                          "train.epochs=9", "data.root="});
  CHECK(c.optim.lr == 0.2);         // --set beats the file
  CHECK(c.optim.momentum == 0.8);   // the file beats the default
  CHECK(c.train.epochs == 9);       // a later --set beats an earlier one
  CHECK(c.optim.nesterov);
  CHECK(c.model.arch == "resnet56");                // bare string
  CHECK(c.experiment.name == "quoted name");        // quoted string
  CHECK(c.optim.milestones == std::vector<int64_t>{3, 5});
  CHECK(c.optim.weight_decay == 0.0);               // an integer for a number
  CHECK(c.experiment.output_dir == "out/x");        // spaces around '=' are trimmed
  CHECK(c.experiment.seed == 123);
  CHECK(c.data.root.empty());
  // A string key takes digits as text.
  CHECK(parse("", {"experiment.name=123"}).experiment.name == "123");
  CHECK(parse("", {"optim.lr=1e-3"}).optim.lr == 1e-3);
}

TEST_CASE("override errors name the --set argument", "[config]") {
  CHECK(error_of("", {"optim.lr=abc"}) == "--set optim.lr=abc: optim.lr must be a number, got string \"abc\"");
  CHECK(error_of("", {"foo"}) == "--set foo: expected key.path=value");
  CHECK(error_of("", {"=3"}) == "--set =3: expected key.path=value");
  CHECK(error_of("", {"optim.learning_rate=0.1"}) ==
        "--set optim.learning_rate=0.1: unknown key 'optim.learning_rate' (did you mean 'optim.lr'?)");
  CHECK(error_of("", {"nosuch.key=1"}) == "--set nosuch.key=1: unknown key 'nosuch.key'");
  CHECK(error_of("", {"optim.momentum=1.5"}) == "--set optim.momentum=1.5: optim.momentum = 1.5 is out of range [0, 1)");
  CHECK(error_of("", {"train.epochs=2.5"}) == "--set train.epochs=2.5: train.epochs must be an integer, got float 2.5");
  CHECK(error_of("", {"data.augment=yes"}) == "--set data.augment=yes: data.augment must be true or false, got string \"yes\"");
  CHECK(error_of("", {"optim.milestones=[1,2"}) ==
        "--set optim.milestones=[1,2: optim.milestones must be an array of integers, got string \"[1,2\"");
  // One line even when the argument holds a newline (found by the config fuzz target).
  CHECK(error_of("", {"optim.lr=1\nx"}) == "--set optim.lr=1 x: optim.lr must be a number, got string \"1\\nx\"");
  // Bare text must be UTF-8: the resolved config.toml has to read back (found by the fuzz target).
  CHECK(error_of("", {"experiment.name=ab\xa7"}) == "--set experiment.name=ab\xa7: the value is not valid UTF-8 text");
  CHECK(error_of("", {"experiment.name=\xc0\xaf"}) == "--set experiment.name=\xc0\xaf: the value is not valid UTF-8 text");
  CHECK(parse("", {"experiment.name=na\xc3\xafve-\xe2\x82\xac-\xf0\x9f\x98\x80"}).experiment.name ==
        "na\xc3\xafve-\xe2\x82\xac-\xf0\x9f\x98\x80");
  // An override replaces the file's value before values are read, so a bad value it replaces is
  // never looked at.
  CHECK(parse("[optim]\nlr = \"x\"\n", {"optim.lr=0.1"}).optim.lr == 0.1);
}

TEST_CASE("TOML syntax errors report file:line:column", "[config]") {
  const std::string e = error_of("[optim]\nlr = 0.1\nmomentum = = 0.9\n");
  INFO(e);
  CHECK(e.rfind("configs/x.toml:3:", 0) == 0);
  CHECK(e.find('\n') == std::string::npos);
  CHECK(e.size() > std::string("configs/x.toml:3:1: ").size());
  const std::string dup = error_of("[optim]\nlr = 0.1\nlr = 0.2\n");
  INFO(dup);
  CHECK(dup.rfind("configs/x.toml:3:", 0) == 0);
}

TEST_CASE("load_config reads files and reports missing ones", "[config]") {
  CHECK_THROWS_WITH(load_config("configs/does_not_exist.toml"), "configs/does_not_exist.toml: cannot open file");
  CHECK_THROWS_WITH(load_config(TRAINER_SOURCE_DIR "/tests"),
                    Catch::StartsWith(TRAINER_SOURCE_DIR "/tests: cannot open file"));
  const std::string path = "config_test_tmp.toml";
  {
    std::ofstream out(path);
    out << "[train]\nepochs = 5\n";
  }
  CHECK(load_config(path, {"train.max_steps=10"}).train.epochs == 5);
  CHECK(load_config(path, {"train.max_steps=10"}).train.max_steps == 10);
  std::remove(path.c_str());
  CHECK(load_config("", {"optim.lr=0.3"}).optim.lr == 0.3);
}

TEST_CASE("to_toml round-trips every value", "[config]") {
  CHECK(parse(to_toml(Config{})) == Config{});
  Config c;
  c.experiment.name = "odd \"name\" with \\ and\ttab and ünïcode";
  c.experiment.seed = 42;
  c.experiment.output_dir = "/tmp/some dir";
  c.model.arch = "vgg16";
  c.model.label_smoothing = 0.1 + 0.2;  // not representable briefly: needs all 17 digits
  c.data.synthesize_if_missing = true;
  c.data.batch_size = 32;
  c.optim.lr = 1.0;                       // integral double
  c.optim.gamma = 1.0 / 1.01;
  c.optim.weight_decay = 1e-7;
  c.optim.milestones = {};
  c.optim.schedule = "exponential";
  c.optim.nesterov = true;
  c.optim.beta2 = 0.95;
  c.optim.eps = 1e-12;
  c.train.max_steps = 123456789012345;
  c.runtime.deterministic = true;
  const std::string text = to_toml(c);
  INFO(text);
  const Config back = parse(text);
  CHECK(back == c);
  CHECK(back.experiment.name == c.experiment.name);
  CHECK(back.model.label_smoothing == c.model.label_smoothing);
  CHECK(config_hash(back) == config_hash(c));
  CHECK(config_hash(c) != config_hash(Config{}));
  CHECK(c != Config{});
  // Every key that applies appears (sync.method's table, not the others'), with its documentation above it.
  for (const auto& k : config_schema::keys()) {
    if (!config_schema::method_section_applies(k.section, c.sync.method)) {
      CHECK(text.find("[" + k.section + "]") == std::string::npos);
      continue;
    }
    const std::string name = k.path.substr(k.section.size() + 1);
    CHECK(text.find("\n" + name + " = ") != std::string::npos);
  }
  CHECK(text.find("# Base learning rate, before the schedule and warmup.\n# Allowed: [0, 10]\nlr = 1.0\n") !=
        std::string::npos);
}

TEST_CASE("the key table is consistent", "[config]") {
  const auto& keys = config_schema::keys();
  CHECK(keys.size() > 30);
  std::vector<std::string> names;
  for (const auto& section : config_schema::sections()) names.push_back(section.name);
  // The sections, with each method that has keys as its table after [sync], in the method table's order.
  std::vector<std::string> expected{"experiment", "model", "data", "optim", "train", "runtime", "sync"};
  for (const comm::SyncMethod& m : comm::sync_methods())
    if (!m.keys.empty()) expected.push_back("sync." + m.name);
  expected.push_back("comm");
  CHECK(names == expected);
  CHECK(names.size() == 18);  // ten of the eleven built-in methods have keys (dense has none)
  CHECK(config_schema::find_key("optim.lr") != nullptr);
  CHECK(config_schema::find_key("optim.lr")->type == config_schema::Type::kFloat);
  CHECK(config_schema::find_key("optim") == nullptr);
  for (const auto& k : keys) {
    INFO(k.path);
    CHECK(!k.doc.empty());
    CHECK(k.doc.back() == '.');
  }
}

TEST_CASE("docs/config.md is generated from the key list", "[config]") {
  const std::string expected = config_reference_markdown();
  std::ifstream in(TRAINER_SOURCE_DIR "/docs/config.md", std::ios::binary);
  std::stringstream actual;
  actual << in.rdbuf();
  INFO("docs/config.md is out of date: regenerate it with `trainer --config-reference > docs/config.md`");
  CHECK(actual.str() == expected);
}

TEST_CASE("sync.adaptive's rules name their keys", "[config]") {
  // Only the compressing methods adapt.
  const std::string dense = error_of("[sync]\nadaptive = true\n");
  CHECK_THAT(dense, Catch::Matchers::Contains("adaptive") && Catch::Matchers::Contains("\"dense\""));
  // The low-compression setting must send more than the high one.
  const std::string rank = error_of("[sync]\nmethod = \"powersgd\"\nadaptive = true\nrank = 4\nadaptive_rank = 4\n");
  CHECK_THAT(rank, Catch::Matchers::Contains("[sync.powersgd] adaptive_rank = 4 must be above rank = 4"));
  const std::string density =
      error_of("[sync]\nmethod = \"oktopk\"\nadaptive = true\ndensity = 0.2\nadaptive_density = 0.1\n");
  CHECK_THAT(density, Catch::Matchers::Contains("[sync.oktopk] adaptive_density = 0.1 must be above density = 0.2"));
  CHECK(error_of("[sync]\nmethod = \"topka\"\nadaptive = true\ndensity = 0.2\nadaptive_density = 0.1\n", {})
            .find("configs/x.toml") == 0);
  // Off, the adaptive keys are not judged; on with sensible settings, no error.
  CHECK(error_of("[sync]\nmethod = \"powersgd\"\nrank = 8\n").empty());
  CHECK(error_of("[sync]\nmethod = \"powersgd\"\nadaptive = true\nrank = 1\nadaptive_rank = 2\n").empty());
  CHECK(error_of("[sync]\nmethod = \"gtopk\"\nadaptive = true\nadaptive_interval = 50\n").empty());
  CHECK_THAT(error_of("[sync]\nmethod = \"powersgd\"\nadaptive_threshold = 0\n"),
             Catch::Matchers::Contains("sync.powersgd.adaptive_threshold"));
}
