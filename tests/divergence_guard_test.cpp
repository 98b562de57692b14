// The divergence guard's decision (trainer/step/divergence_guard.h) on synthetic loss curves, without
// MPI: normal noisy curves (a bump at the switch, an lr drop, spikes) never trip it at the defaults,
// a rising curve trips it at the window where its mean passes the factor, and a non-finite loss
// after the switch is reported as "diverged".
#include "trainer/step/divergence_guard.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "one_rank.h"

using namespace trainer;
using namespace trainer::app;
using Catch::Matchers::Contains;

namespace {

// Feeds `loss` (one value per step from `first`) to a watch as one rank's steps of one sample each;
// returns the step count at which it tripped, or -1, and the highest ratio of a judged window's mean
// to the reference in `max_ratio`. With a finite `start_factor` the run's start is its first loss
// `start` (the first step's loss, as the guard agrees on it), and the ratio is to the start.
int64_t first_trip(const std::vector<double>& loss, int64_t switch_step, int64_t window = 50, double factor = 1.5,
                   int64_t first = 0, double* max_ratio = nullptr, double kept = 0, int64_t kept_end = -1,
                   double start_factor = std::numeric_limits<double>::infinity(), double start = 0) {
  DivergenceWatch w(switch_step, window, factor, first, start_factor);
  w.restore(kept, kept_end);
  const bool by_start = std::isfinite(start_factor);
  if (by_start) w.set_start(start);
  double highest = 0;
  for (int64_t s = first; s < static_cast<int64_t>(loss.size()); ++s) {
    w.add(s, loss[s], 1);
    if (!w.closes(s)) continue;
    const auto v = w.close(s, w.local_loss_sum(), w.local_samples());
    if (v.judged && by_start) highest = std::max(highest, v.mean / w.start());
    if (v.judged && !by_start) highest = std::max(highest, v.mean / w.reference());
    if (v.diverged) {
      if (max_ratio) *max_ratio = highest;
      return v.end;
    }
  }
  if (max_ratio) *max_ratio = highest;
  return -1;
}

// A normal run: loss falling from 2.3 towards 0.3, per-step noise of 30% (log-normal), 1% of steps
// five times higher (a hard batch), a 20% bump over 40 steps at the switch (error feedback starting
// from zero), the lr cut tenfold at step 1200 (the loss drops), and an lr warmup at the start.
std::vector<double> normal_curve(unsigned seed, int64_t switch_step, int64_t steps = 2000) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> noise(0, 0.3);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<double> loss(steps);
  for (int64_t t = 0; t < steps; ++t) {
    double level = 2.3 * std::exp(-static_cast<double>(t) / 400) + 0.3;
    if (t < 20) level = 2.3;                    // lr warmup: flat at first
    if (t >= 1200) level *= 0.7;                 // the lr drop
    if (t >= switch_step && t < switch_step + 40) level *= 1.2;  // the bump at the switch
    double l = level * std::exp(noise(rng) - 0.045);
    if (u(rng) < 0.01) l *= 5;
    loss[t] = l;
  }
  return loss;
}

}  // namespace

TEST_CASE("Normal noisy curves never trip the guard at its defaults", "[divergence]") {
  double worst = 0;
  for (unsigned seed = 0; seed < 50; ++seed)
    for (int64_t sw : {0, 1, 20, 250, 1000}) {
      double ratio = 0;
      INFO("seed " << seed << ", switch " << sw);
      CHECK(first_trip(normal_curve(seed, sw), sw, 50, 1.5, 0, &ratio) == -1);
      worst = std::max(worst, ratio);
    }
  // The margin: the worst window (1.40 here: the bump at a late switch, where the curve is flat,
  // with a hard batch or two in the window) stays below the factor.
  CHECK(worst < 1.45);
  CHECK(worst > 1.0);  // the curves did test something: some window rose above the reference
}

TEST_CASE("Against the run's start: normal curves never trip it, a blow-up inside the first window does",
          "[divergence]") {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  double worst = 0;
  for (unsigned seed = 0; seed < 50; ++seed)
    for (int64_t sw : {0, 2, 20, 250, 1000}) {
      double ratio = 0;
      INFO("seed " << seed << ", switch " << sw);
      // The start is the untrained level, 2.3: an untrained model's loss hardly varies by batch (its
      // outputs are near uniform); the curves' noise is a trained model's batch-to-batch spread.
      CHECK(first_trip(normal_curve(seed, sw), sw, 50, kInf, 0, &ratio, 0, -1, 3.0, 2.3) == -1);
      worst = std::max(worst, ratio);
    }
  CHECK(worst < 1.5);  // the margin below 3: windows of the flat start with a hard batch or two
  CHECK(worst > 0.9);
  // The LAS quickstart at lr 10 without clipping and a 2-step warmup: 3.5 to 862 within 20 steps.
  // The reference is the first window, which holds the blow-up itself, so only the start sees it:
  // at that window's end.
  std::vector<double> blow_up(300, 3.5);
  for (int64_t t = 2; t < 300; ++t) blow_up[t] = std::min(862.0, 3.5 * std::pow(1.35, static_cast<double>(t)));
  CHECK(first_trip(blow_up, 2) == -1);  // the level at the switch alone: never
  CHECK(first_trip(blow_up, 2, 50, 1.5, 0, nullptr, 0, -1, 3.0, blow_up[0]) == 50);
  // A long dense warmup (switch at 250) that blows up from step 60: the dense windows are judged
  // against the start too, [50, 100) first (its mean far above 3 x 1.0).
  std::vector<double> in_warmup(400, 1.0);
  for (int64_t t = 60; t < 400; ++t) in_warmup[t] = 50.0;
  CHECK(first_trip(in_warmup, 250) == -1);
  CHECK(first_trip(in_warmup, 250, 50, 1.5, 0, nullptr, 0, -1, 3.0, in_warmup[0]) == 100);
  // A curve that falls stays clear of it, however long.
  std::vector<double> falling(2000);
  for (int64_t t = 0; t < 2000; ++t) falling[t] = 2.3 * std::exp(-static_cast<double>(t) / 300) + 0.1;
  CHECK(first_trip(falling, 20, 50, 1.5, 0, nullptr, 0, -1, 3.0, falling[0]) == -1);
}

TEST_CASE("A rising loss trips the guard at the window whose mean passes the factor", "[divergence]") {
  // Flat 1.0 through a warmup of 250 steps, then rising by 0.01 a step: the window to step 300 has
  // mean 1.245, the one to 350 has 1.745 > 1.5.
  std::vector<double> loss(1000, 1.0);
  for (int64_t t = 250; t < 1000; ++t) loss[t] = 1.0 + 0.01 * static_cast<double>(t - 250);
  CHECK(first_trip(loss, 250) == 350);
  CHECK(first_trip(loss, 250, 50, 2.0) == 400);  // mean 2.245 > 2
  CHECK(first_trip(loss, 250, 10) == 310);        // [300, 310): 1.545; [290, 300): 1.445
  // Resumed past the switch at 600: the reference is the first window, [600, 650) (4.745), and 1.5 x
  // that is 7.12: the window to 900 (7.745) passes it, the one to 850 (6.745) does not.
  CHECK(first_trip(loss, 250, 50, 1.5, 600) == 900);
  // Resumed with the reference its checkpoint kept (1.0, the window to step 250): the first whole
  // window after the resume, [600, 650), is judged against the level at the switch.
  CHECK(first_trip(loss, 250, 50, 1.5, 600, nullptr, 1.0, 250) == 650);
  CHECK(first_trip(loss, 250, 50, 1.5, 613, nullptr, 1.0, 250) == 663);
  // No warmup: the reference is the first window, [0, 50).
  std::vector<double> early(400, 2.0);
  for (int64_t t = 100; t < 400; ++t) early[t] = 2.0 + 0.02 * static_cast<double>(t - 100);
  CHECK(first_trip(early, 0) == 200);  // [150, 200): 2 + 0.02 x 74.5 = 3.49 > 3; [100, 150): 2.49
}

TEST_CASE("Only runs with a switch are watched, and skipped or non-finite steps do not count", "[divergence]") {
  std::vector<double> loss(400, 1.0);
  for (int64_t t = 100; t < 400; ++t) loss[t] = 100;
  CHECK(first_trip(loss, -1) == -1);  // dense, async_ps, or the guard off: not watched
  // A NaN inside a window is left out of its mean (the step was skipped).
  std::vector<double> nan_inside(400, 1.0);
  nan_inside[120] = std::numeric_limits<double>::quiet_NaN();
  CHECK(first_trip(nan_inside, 100) == -1);
  DivergenceWatch w(100, 50, 1.5, 0);
  CHECK_FALSE(w.after_switch(99));
  CHECK(w.after_switch(100));
  CHECK_FALSE(DivergenceWatch(-1, 50, 1.5, 0).after_switch(1000));
}

TEST_CASE("The guard's lines name the method, its settings and the step", "[divergence]") {
  Config c;
  c.sync.method = "diloco";
  c.sync.set("period", 1);
  c.sync.dense_warmup_steps = 250;
  c.optim.lr = 0.5;
  const std::string settings = method_settings(c);
  CHECK_THAT(settings, Contains("sync.method = diloco (") && Contains("period = 1") &&
                           Contains("outer_lr = 0.7") && Contains("outer_momentum = 0.9") &&
                           Contains("sync.dense_warmup_steps = 250") && Contains("optim.lr = 0.5"));
  CHECK_THAT(settings, !Contains("density") && !Contains("rank ="));
  c.sync.method = "oktopk";
  CHECK_THAT(method_settings(c), Contains("density = 0.") && Contains("region_every") &&
                                     !Contains("outer_lr") && !Contains("period"));
  c.sync.method = "powersgd";
  CHECK_THAT(method_settings(c), Contains("rank = ") && !Contains("density"));

  // One rank, windows of 10 after a warmup of 20: flat 1.0, then 3.0 from step 30.
  c.sync.method = "diloco";
  c.sync.dense_warmup_steps = 20;
  c.train.divergence_window = 10;
  testing::OneRank one(1);
  DivergenceGuard guard(c, 20, 0, one);
  std::optional<std::string> line;
  int64_t at = -1;
  for (int64_t s = 0; s < 100 && !line; ++s) {
    line = guard.after_step(s, s < 30 ? 1.0 : 3.0, 8, true, "runs/x/checkpoints/step_" + std::to_string(s));
    at = s + 1;
  }
  REQUIRE(line);
  CHECK(at == 40);
  CHECK_THAT(*line, Contains("diverged: sync.method = diloco (") && Contains("after its dense warmup") &&
                        Contains("over the 10 steps to step 40 is 3") &&
                        Contains("above 1.5 x the 1 of the 10 steps to step 20"));
  // The last window judged fine ended at step 30: the checkpoint complete then is the last good one
  // (not on disk here, so the note says it is gone).
  CHECK_THAT(guard.stop_note("", "x"), Contains("step_29") && Contains("train.divergence_guard = false"));

  // A non-finite value that ends the run after the switch: "diverged" when the loss is non-finite,
  // or when the window so far has risen past the factor; a gradient's NaN with the loss fine, or any
  // before the switch, is left to the non-finite guard.
  DivergenceGuard fresh(c, 20, 0, one);
  for (int64_t s = 0; s < 22; ++s) CHECK_FALSE(fresh.after_step(s, 1.0, 8, true, ""));
  CHECK_FALSE(fresh.nonfinite(19, std::nan(""), 8, true, "non-finite value at step 19: the loss on rank 1"));
  const auto nan_loss = fresh.nonfinite(22, std::nan(""), 8, true, "non-finite value at step 22: the loss on rank 1");
  REQUIRE(nan_loss);
  CHECK_THAT(*nan_loss, Contains("diverged: sync.method = diloco") && Contains("step 22: the loss on rank 1"));
  CHECK_FALSE(fresh.nonfinite(22, 1.0, 8, false, "non-finite value at step 22: the gradient of w on rank 0"));
  const auto blown = fresh.nonfinite(22, 1e9, 8, false, "non-finite value at step 22: the gradient of w on rank 0");
  REQUIRE(blown);
  CHECK_THAT(*blown, Contains("diverged: ") && Contains("the gradient of w on rank 0") &&
                         Contains("window so far at 3.333e+08, above 1.5 x the 1 of the 10 steps to step 20"));
  CHECK_THAT(fresh.stop_note("", "x"), Contains("no checkpoint written (x)"));
}
