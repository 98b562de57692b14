// The notes a run prints at its start (trainer/start_notes.h): each appears exactly where its
// measured cost applies, and nowhere else.
#include "trainer/start_notes.h"

#include <catch2/catch.hpp>

#include "trainer/config/config_sync.h"

using namespace trainer;
using Catch::Matchers::Contains;

namespace {

Config diloco_over_sgd_momentum() {
  Config c;
  c.model.arch = "resnet20";
  c.sync.method = "diloco";
  c.sync.set("outer_momentum", 0.9);
  c.optim.name = "sgd";
  c.optim.momentum = 0.9;
  return c;
}

}  // namespace

TEST_CASE("DiLoCo's outer momentum 0.9 over SGD momentum 0.9 gets one note, other settings none", "[config]") {
  Config c = diloco_over_sgd_momentum();
  auto notes = app::start_notes(c, sync_options(c, 0, 1000));
  REQUIRE(notes.size() == 1);
  CHECK_THAT(notes[0], Contains("note: diloco with outer momentum 0.9") && Contains("over SGD momentum 0.9"));

  c.sync.set("outer_momentum", 0.5);
  CHECK(app::start_notes(c, sync_options(c, 0, 1000)).empty());
  c = diloco_over_sgd_momentum();
  c.optim.name = "adamw";  // the paper's inner optimizer
  CHECK(app::start_notes(c, sync_options(c, 0, 1000)).empty());
  c = diloco_over_sgd_momentum();
  c.optim.momentum = 0.0;
  CHECK(app::start_notes(c, sync_options(c, 0, 1000)).empty());
  c = diloco_over_sgd_momentum();
  c.sync.method = "local_sgd";
  CHECK(app::start_notes(c, sync_options(c, 0, 1000)).empty());
}

TEST_CASE("A speech model compressed after a dense warmup under a tenth of the run gets one note", "[config]") {
  Config c;
  c.model.arch = "las";
  c.data.dataset = "an4";  // a speech task: what the notes ask (comm/sync/registry.h, SyncRecipe::speech)
  c.sync.method = "oktopk";
  c.sync.dense_warmup_steps = 50;
  auto notes = app::start_notes(c, sync_options(c, 0, 1250));
  REQUIRE(notes.size() == 1);
  CHECK_THAT(notes[0], Contains("note: oktopk after 50 dense steps (sync.dense_warmup_steps) of 1250"));
  CHECK_THAT(notes[0], Contains("(25 epochs = 1,250 steps)"));  // the horizon its figures came from
  c.sync.dense_warmup_steps = 125;  // a tenth
  CHECK(app::start_notes(c, sync_options(c, 0, 1250)).empty());
  c.sync.dense_warmup_steps = 50;
  c.model.arch = "resnet20";
  c.data.dataset = "cifar10";
  CHECK(app::start_notes(c, sync_options(c, 0, 1250)).empty());
  c.model.arch = "las";
  c.data.dataset = "an4";
  c.sync.method = "powersgd";
  c.sync.set("rank", 8);
  CHECK(app::start_notes(c, sync_options(c, 0, 1250)).empty());
}

TEST_CASE("An image model compressed from its first step gets one note, with a dense warmup none", "[config]") {
  Config c;
  c.model.arch = "resnet20";
  c.sync.method = "oktopk";
  c.sync.dense_warmup_steps = 0;
  auto notes = app::start_notes(c, sync_options(c, 0, 468));
  REQUIRE(notes.size() == 1);
  CHECK_THAT(notes[0], Contains("note: oktopk from the first step (sync.dense_warmup_steps = 0)"));
  CHECK_THAT(notes[0], Contains("6 epochs = 585 steps"));  // the horizon its figures came from
  c.sync.dense_warmup_steps = 39;
  CHECK(app::start_notes(c, sync_options(c, 0, 468)).empty());
  c.sync.dense_warmup_steps = 0;
  c.sync.method = "local_sgd";  // averages parameters: not a compressor
  CHECK(app::start_notes(c, sync_options(c, 0, 468)).empty());
}

TEST_CASE("A sparse method whose compressed steps last under 20 error-feedback delays gets a note", "[config]") {
  Config c;
  c.model.arch = "resnet20";
  c.sync.method = "oktopk";
  c.sync.set("density", 0.01);
  c.sync.dense_warmup_steps = 39;
  auto notes = app::start_notes(c, sync_options(c, 0, 468));  // the 6-epoch hard CIFAR grid
  REQUIRE(notes.size() == 1);
  CHECK_THAT(notes[0], Contains("note: oktopk at density 0.01 for 429 compressed steps: steps x density = 4.3 "
                                "error-feedback delays"));
  CHECK_THAT(notes[0], Contains("0.1 at 75 (7,488; three seeds"));  // the longest horizon measured, and its steps
  CHECK(app::start_notes(c, sync_options(c, 0, 2039)).empty());  // 20 delays: long enough
  CHECK(app::start_notes(c, sync_options(c, 0, 2038)).size() == 1);
  c.sync.set("adaptive", true);  // the density follows the regime: no single horizon
  CHECK(app::start_notes(c, sync_options(c, 0, 468)).empty());
  c.sync.set("adaptive", false);
  c.sync.set("density", 0.1);  // the default: 43 delays
  CHECK(app::start_notes(c, sync_options(c, 0, 468)).empty());
}
