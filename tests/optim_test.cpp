// optim/: SGD, Adam/AdamW, learning-rate schedules and gradient clipping against PyTorch reference
// values (tests/fixtures/optim_reference.json, written by scripts/make_optim_fixtures.py).
#include <omp.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "models/backend.h"
#include "optim/adam.h"
#include "optim/clip.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "optim/sgd.h"
#include "trainer/config/config.h"

using namespace trainer::optim;
namespace models = trainer::models;
using nlohmann::json;

namespace {

const json& reference() {
  static const json j = [] {
    std::ifstream in(std::string(TRAINER_FIXTURES) + "/optim_reference.json");
    REQUIRE(in.good());
    return json::parse(in);
  }();
  return j;
}

// 1e-6 relative, with a floor so values that are (nearly) zero compare absolutely.
bool close(double a, double b) { return std::fabs(a - b) <= 1e-6 * std::max({std::fabs(a), std::fabs(b), 1e-3}); }

std::vector<float> to_floats(const json& j) {
  std::vector<float> v;
  for (const auto& x : j) v.push_back(x.get<float>());
  return v;
}

ScheduleOptions schedule_from(const json& s) {
  ScheduleOptions o;
  o.kind = schedule_kind_from_name(s.at("kind").get<std::string>());
  o.base_lr = s.at("base_lr").get<double>();
  if (s.contains("milestones")) o.milestones = s.at("milestones").get<std::vector<int64_t>>();
  if (s.contains("gamma")) o.gamma = s.at("gamma").get<double>();
  if (s.contains("min_lr")) o.min_lr = s.at("min_lr").get<double>();
  return o;
}

std::vector<float> ramp(int64_t n, float scale) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = scale * std::sin(0.37f * i + 0.1f);
  return v;
}

}  // namespace

TEST_CASE("SGD matches torch.optim.SGD trajectories", "[optim][sgd]") {
  const json& ref = reference().at("sgd");
  const auto p0 = to_floats(ref.at("p0"));
  const auto lrs = ref.at("lrs").get<std::vector<double>>();
  for (const auto& c : ref.at("cases")) {
    SgdOptions o;
    o.momentum = c.at("momentum");
    o.nesterov = c.at("nesterov");
    o.weight_decay = c.at("weight_decay");
    o.decoupled_weight_decay = c.at("decoupled_weight_decay");
    INFO("momentum " << o.momentum << " nesterov " << o.nesterov << " weight_decay "
                     << o.weight_decay << " decoupled " << o.decoupled_weight_decay);
    std::vector<float> p = p0;
    Sgd sgd(models::cpu_backend(), static_cast<int64_t>(p.size()), o);
    for (size_t s = 0; s < lrs.size(); ++s) {
      const auto g = to_floats(ref.at("grads")[s]);
      sgd.step(p.data(), g.data(), lrs[s]);
      const auto expected = c.at("params")[s].get<std::vector<double>>();
      for (size_t i = 0; i < p.size(); ++i) {
        INFO("step " << s << " element " << i << ": " << p[i] << " vs torch " << expected[i]);
        CHECK(close(p[i], expected[i]));
      }
    }
    CHECK(sgd.step_count() == static_cast<int64_t>(lrs.size()));
    CHECK(sgd.momentum_buffer().size() == (o.momentum != 0 ? p.size() : 0u));
  }
}

TEST_CASE("SGD does not modify the gradient and rejects Nesterov without momentum", "[optim][sgd]") {
  std::vector<float> p = {1, 2, 3}, g = {0.5f, -0.5f, 0.25f};
  const auto g_before = g;
  Sgd sgd(models::cpu_backend(), 3, SgdOptions{0.9, true, 0.1, false});
  sgd.step(p.data(), g.data(), 0.1);
  CHECK(g == g_before);
  CHECK_THROWS_AS(Sgd(models::cpu_backend(), 3, SgdOptions{0.0, true, 0.0, false}), std::invalid_argument);
}

TEST_CASE("SGD gives the same result for any thread count", "[optim][sgd]") {
  const int64_t n = 100003;  // above the parallel threshold, not a multiple of anything
  const auto g1 = ramp(n, 1.0f), g2 = ramp(n, -0.5f);
  std::vector<float> results[2];
  const int threads[2] = {1, 3};
  for (int t = 0; t < 2; ++t) {
    omp_set_num_threads(threads[t]);
    std::vector<float> p = ramp(n, 2.0f);
    Sgd sgd(models::cpu_backend(), n, SgdOptions{0.9, true, 5e-4, false});
    sgd.step(p.data(), g1.data(), 0.1);
    sgd.step(p.data(), g2.data(), 0.1);
    results[t] = p;
  }
  CHECK(results[0] == results[1]);
}

TEST_CASE("SGD state save/load round-trips bytewise and resumes exactly", "[optim][sgd]") {
  const int64_t n = 1000;
  const auto g = ramp(n, 0.3f);
  const SgdOptions o{0.9, true, 5e-4, false};
  std::vector<float> p = ramp(n, 1.0f);
  Sgd a(models::cpu_backend(), n, o);
  a.step(p.data(), g.data(), 0.1);
  a.step(p.data(), g.data(), 0.05);

  std::stringstream first;
  a.save(first);
  Sgd b(models::cpu_backend(), n, o);
  b.load(first);
  CHECK(b.step_count() == 2);
  CHECK(b.momentum_buffer() == a.momentum_buffer());
  std::stringstream second;
  b.save(second);
  CHECK(first.str() == second.str());

  // Continuing from the loaded state gives exactly what continuing the original gives.
  std::vector<float> pa = p, pb = p;
  a.step(pa.data(), g.data(), 0.02);
  b.step(pb.data(), g.data(), 0.02);
  CHECK(pa == pb);

  SECTION("a state for another model size is a clear error") {
    Sgd other(models::cpu_backend(), n + 1, o);
    std::stringstream s(first.str());
    CHECK_THROWS_WITH(other.load(s), Catch::Contains("holds 1000 parameters but the model has 1001"));
  }
  SECTION("a state without a momentum buffer does not load into one with") {
    Sgd plain(models::cpu_backend(), n, SgdOptions{});
    std::stringstream s(first.str());
    CHECK_THROWS_WITH(plain.load(s), Catch::Contains("momentum buffer of 1000 elements, expected 0"));
  }
  SECTION("a truncated state is a clear error and leaves the optimizer unchanged") {
    Sgd fresh(models::cpu_backend(), n, o);
    std::stringstream s(first.str().substr(0, first.str().size() - 10));
    CHECK_THROWS_WITH(fresh.load(s), Catch::Contains("truncated"));
    CHECK(fresh.step_count() == 0);
  }
  SECTION("garbage is rejected") {
    Sgd fresh(models::cpu_backend(), n, o);
    std::stringstream s("not a state file at all");
    CHECK_THROWS_WITH(fresh.load(s), Catch::Contains("bad magic"));
  }
}

TEST_CASE("Adam and AdamW match torch.optim.Adam and torch.optim.AdamW trajectories", "[optim][adam]") {
  const json& sgd_ref = reference().at("sgd");  // the same start, gradients and rates
  const auto p0 = to_floats(sgd_ref.at("p0"));
  const auto lrs = sgd_ref.at("lrs").get<std::vector<double>>();
  const auto& cases = reference().at("adam").at("cases");
  REQUIRE(cases.size() >= 6);
  double worst = 0;  // largest relative deviation from torch over every value of every case
  for (const auto& c : cases) {
    AdamOptions o;
    o.beta1 = c.at("beta1");
    o.beta2 = c.at("beta2");
    o.eps = c.at("eps");
    o.weight_decay = c.at("weight_decay");
    o.decoupled_weight_decay = c.at("decoupled_weight_decay");
    INFO("beta1 " << o.beta1 << " beta2 " << o.beta2 << " eps " << o.eps << " weight_decay " << o.weight_decay
                  << " decoupled " << o.decoupled_weight_decay);
    std::vector<float> p = p0;
    Adam adam(models::cpu_backend(), static_cast<int64_t>(p.size()), o);
    CHECK(adam.name() == (o.decoupled_weight_decay ? "adamw" : "adam"));
    for (size_t s = 0; s < lrs.size(); ++s) {
      const auto g = to_floats(sgd_ref.at("grads")[s]);
      adam.step(p.data(), g.data(), lrs[s]);
      const std::vector<float> m = adam.exp_avg(), v = adam.exp_avg_sq();
      const std::pair<const char*, const std::vector<float>*> checked[] = {
          {"params", &p}, {"exp_avg", &m}, {"exp_avg_sq", &v}};
      for (const auto& [what, mine] : checked) {
        const auto expected = c.at(what)[s].get<std::vector<double>>();
        REQUIRE(mine->size() == expected.size());
        for (size_t i = 0; i < p.size(); ++i) {
          INFO(what << " step " << s << " element " << i << ": " << (*mine)[i] << " vs torch " << expected[i]);
          CHECK(close((*mine)[i], expected[i]));
          worst = std::max(worst, std::fabs((*mine)[i] - expected[i]) /
                                      std::max({std::fabs(expected[i]), 1e-3}));
        }
      }
    }
    CHECK(adam.step_count() == static_cast<int64_t>(lrs.size()));
  }
  INFO("largest relative deviation from torch: " << worst);
  CHECK(worst <= 1e-6);
}

TEST_CASE("Adam leaves the gradient alone and rejects what torch.optim.Adam rejects", "[optim][adam]") {
  std::vector<float> p = {1, 2, 3}, g = {0.5f, -0.5f, 0.25f};
  const auto g_before = g;
  Adam adam(models::cpu_backend(), 3, AdamOptions{0.9, 0.999, 1e-8, 0.1, false});
  adam.step(p.data(), g.data(), 0.1);
  CHECK(g == g_before);
  // The first step moves every weight by about lr against the sign of its (decayed) gradient:
  // m_hat / sqrt(v_hat) = +-1 up to eps.
  CHECK(p[0] == Approx(1 - 0.1).epsilon(1e-3));
  CHECK(p[1] == Approx(2 + 0.1).epsilon(1e-3));
  CHECK_THROWS_AS(Adam(models::cpu_backend(), 3, AdamOptions{1.0, 0.999, 1e-8, 0, false}), std::invalid_argument);
  CHECK_THROWS_AS(Adam(models::cpu_backend(), 3, AdamOptions{0.9, -0.1, 1e-8, 0, false}), std::invalid_argument);
  CHECK_THROWS_AS(Adam(models::cpu_backend(), 3, AdamOptions{0.9, 0.999, -1, 0, false}), std::invalid_argument);
  CHECK_THROWS_AS(Adam(models::cpu_backend(), 3, AdamOptions{0.9, 0.999, 1e-8, -1, false}), std::invalid_argument);
  CHECK_THROWS_AS(Adam(models::cpu_backend(), -1, AdamOptions{}), std::invalid_argument);
}

TEST_CASE("Adam gives the same result for any thread count", "[optim][adam]") {
  const int64_t n = 100003;  // above the parallel threshold, not a multiple of anything
  const auto g1 = ramp(n, 1.0f), g2 = ramp(n, -0.5f);
  for (const bool decoupled : {false, true}) {
    std::vector<float> results[2];
    const int threads[2] = {1, 3};
    for (int t = 0; t < 2; ++t) {
      omp_set_num_threads(threads[t]);
      std::vector<float> p = ramp(n, 2.0f);
      Adam adam(models::cpu_backend(), n, AdamOptions{0.9, 0.999, 1e-8, 1e-2, decoupled});
      adam.step(p.data(), g1.data(), 1e-3);
      adam.step(p.data(), g2.data(), 5e-4);
      results[t] = p;
    }
    CHECK(results[0] == results[1]);
  }
}

TEST_CASE("Adam state save/load round-trips bytewise and resumes exactly", "[optim][adam]") {
  const int64_t n = 1000;
  const auto g1 = ramp(n, 0.3f), g2 = ramp(n, -0.7f);
  const AdamOptions o{0.9, 0.999, 1e-8, 1e-2, true};
  std::vector<float> p = ramp(n, 1.0f);
  Adam a(models::cpu_backend(), n, o);
  a.step(p.data(), g1.data(), 1e-3);
  a.step(p.data(), g2.data(), 5e-4);
  a.step(p.data(), g1.data(), 5e-4);

  std::stringstream first;
  a.save(first);
  Adam b(models::cpu_backend(), n, o);
  Optimizer& as_interface = b;  // what the training loop holds
  as_interface.load(first);
  CHECK(b.step_count() == 3);
  CHECK(b.exp_avg() == a.exp_avg());
  CHECK(b.exp_avg_sq() == a.exp_avg_sq());
  std::stringstream second;
  b.save(second);
  CHECK(first.str() == second.str());

  // Continuing from the loaded state gives bit for bit what continuing the original gives (the
  // step count drives the bias corrections, so it must come back too).
  std::vector<float> pa = p, pb = p;
  for (int s = 0; s < 3; ++s) {
    a.step(pa.data(), (s % 2 ? g1 : g2).data(), 2e-4);
    b.step(pb.data(), (s % 2 ? g1 : g2).data(), 2e-4);
  }
  CHECK(std::memcmp(pa.data(), pb.data(), sizeof(float) * n) == 0);
  CHECK(a.exp_avg() == b.exp_avg());
  CHECK(a.exp_avg_sq() == b.exp_avg_sq());

  SECTION("a state for another model size is a clear error") {
    Adam other(models::cpu_backend(), n + 1, o);
    std::stringstream s(first.str());
    CHECK_THROWS_WITH(other.load(s), Catch::Contains("holds 1000 parameters but the model has 1001"));
  }
  SECTION("an SGD state does not load into Adam, nor an Adam state into SGD, and both say so") {
    Sgd sgd(models::cpu_backend(), n, SgdOptions{0.9, false, 0, false});
    std::stringstream sgd_state;
    sgd.save(sgd_state);
    Adam fresh(models::cpu_backend(), n, o);
    CHECK_THROWS_WITH(fresh.load(sgd_state), Catch::Contains("SGD optimizer state") && Catch::Contains("bad magic"));
    std::stringstream s(first.str());
    CHECK_THROWS_WITH(sgd.load(s), Catch::Contains("Adam optimizer state") && Catch::Contains("bad magic"));
  }
  SECTION("a truncated state is a clear error and leaves the optimizer unchanged") {
    for (const size_t cut : {size_t{10}, size_t{4 * n + 10}, first.str().size() - 20}) {
      INFO("cut " << cut << " bytes");
      Adam fresh(models::cpu_backend(), n, o);
      std::stringstream s(first.str().substr(0, first.str().size() - cut));
      CHECK_THROWS_WITH(fresh.load(s), Catch::Contains("truncated"));
      CHECK(fresh.step_count() == 0);
      CHECK(fresh.exp_avg() == std::vector<float>(n, 0.0f));
      CHECK(fresh.exp_avg_sq() == std::vector<float>(n, 0.0f));
    }
  }
  SECTION("garbage and another format version are rejected") {
    Adam fresh(models::cpu_backend(), n, o);
    std::stringstream s("not a state file at all");
    CHECK_THROWS_WITH(fresh.load(s), Catch::Contains("bad magic"));
    std::string bumped = first.str();
    bumped[4] = 9;  // the version follows the 4-byte magic
    std::stringstream v(bumped);
    CHECK_THROWS_WITH(fresh.load(v), Catch::Contains("unsupported format version 9"));
    CHECK(fresh.step_count() == 0);
  }
}

TEST_CASE("make_optimizer builds what optim.name says", "[optim]") {
  CHECK(trainer::kOptimizers == optimizer_names());
  OptimizerOptions o;
  o.momentum = 0.9;
  o.weight_decay = 0.05;
  CHECK(make_optimizer(models::cpu_backend(), o, 5)->name() == "sgd");
  o.name = "adam";
  auto adam = make_optimizer(models::cpu_backend(), o, 5);
  REQUIRE(adam->name() == "adam");
  CHECK(adam->size() == 5);
  o.decoupled_weight_decay = true;  // adam with decoupled decay is AdamW
  CHECK(make_optimizer(models::cpu_backend(), o, 5)->name() == "adamw");
  o.name = "adamw";
  o.decoupled_weight_decay = false;  // adamw decouples whatever the flag says
  auto adamw = make_optimizer(models::cpu_backend(), o, 5);
  CHECK(adamw->name() == "adamw");

  // The factory's Adam follows the options: one AdamW step by the factory's optimizer equals one by
  // a directly built torch-checked Adam.
  std::vector<float> p1 = {1, -2, 3, 0.5f, -0.25f}, p2 = p1;
  const std::vector<float> g = {0.1f, 0.2f, -0.3f, 0.0f, 1.0f};
  adamw->step(p1.data(), g.data(), 0.01);
  Adam direct(models::cpu_backend(), 5, AdamOptions{0.9, 0.999, 1e-8, 0.05, true});
  direct.step(p2.data(), g.data(), 0.01);
  CHECK(p1 == p2);

  o.nesterov = true;
  CHECK_THROWS_WITH(make_optimizer(models::cpu_backend(), o, 5), Catch::Contains("nesterov applies to sgd only"));
  o.nesterov = false;
  o.name = "lamb";
  CHECK_THROWS_WITH(make_optimizer(models::cpu_backend(), o, 5), Catch::Contains("unknown optimizer 'lamb'"));
}

TEST_CASE("learning-rate schedules match PyTorch's schedulers", "[optim][schedule]") {
  for (const auto& s : reference().at("schedules")) {
    const ScheduleOptions o = schedule_from(s);
    const int64_t spe = s.at("steps_per_epoch"), total = s.at("total_steps");
    const auto lrs = s.at("lrs").get<std::vector<double>>();
    for (size_t step = 0; step < lrs.size(); ++step) {
      const double lr = learning_rate(o, static_cast<int64_t>(step), spe, total);
      INFO(s.at("kind").get<std::string>() << " step " << step << ": " << lr << " vs torch " << lrs[step]);
      CHECK(std::fabs(lr - lrs[step]) <= 1e-6 * std::fabs(lrs[step]) + 1e-12);
    }
  }
}

TEST_CASE("linear warmup composes with any schedule", "[optim][schedule]") {
  ScheduleOptions o;
  o.kind = ScheduleKind::kMultiStep;
  o.base_lr = 0.4;
  o.milestones = {1};
  o.gamma = 0.5;
  o.warmup_steps = 4;
  // steps_per_epoch 3: the milestone at epoch 1 falls inside the warmup.
  CHECK(learning_rate(o, 0, 3, 100) == Approx(0.4 * 0.25));
  CHECK(learning_rate(o, 2, 3, 100) == Approx(0.4 * 0.75));
  CHECK(learning_rate(o, 3, 3, 100) == Approx(0.2 * 1.0));
  CHECK(learning_rate(o, 4, 3, 100) == Approx(0.2));

  o.kind = ScheduleKind::kCosine;
  o.min_lr = 0.0;
  o.warmup_steps = 10;
  const double scheduled = learning_rate(ScheduleOptions{ScheduleKind::kCosine, 0.4, {}, 0.1, 0.0, 0}, 5, 3, 100);
  CHECK(learning_rate(o, 5, 3, 100) == Approx(scheduled * 0.6));
  // Past total_steps cosine stays at min_lr.
  o.min_lr = 0.01;
  CHECK(learning_rate(o, 150, 3, 100) == Approx(0.01));
}

TEST_CASE("schedule arguments are checked", "[optim][schedule]") {
  CHECK_THROWS_AS(schedule_kind_from_name("linear"), std::invalid_argument);
  ScheduleOptions o;
  CHECK_THROWS_AS(learning_rate(o, 0, 0, 10), std::invalid_argument);
  o.kind = ScheduleKind::kCosine;
  CHECK_THROWS_AS(learning_rate(o, 0, 10, 0), std::invalid_argument);
}

TEST_CASE("clip_grad_norm matches torch.nn.utils.clip_grad_norm_", "[optim][clip]") {
  for (const auto& c : reference().at("clip")) {
    auto g = to_floats(c.at("grads"));
    const double norm = clip_grad_norm(models::cpu_backend(), g.data(), static_cast<int64_t>(g.size()), c.at("max_norm"));
    CHECK(close(norm, c.at("norm").get<double>()));
    const auto expected = c.at("clipped").get<std::vector<double>>();
    for (size_t i = 0; i < g.size(); ++i) {
      INFO("element " << i << ": " << g[i] << " vs torch " << expected[i]);
      CHECK(close(g[i], expected[i]));
    }
  }
}

TEST_CASE("clip_grad_norm with max_norm 0 only measures and the norm is thread-count independent",
          "[optim][clip]") {
  std::vector<float> g = {3, 4};
  CHECK(clip_grad_norm(models::cpu_backend(), g.data(), 2, 0.0) == 5.0);
  CHECK(g == std::vector<float>{3, 4});
  CHECK(global_norm(models::cpu_backend(), nullptr, 0) == 0.0);

  const int64_t n = 300001;
  const auto big = ramp(n, 1.0f);
  omp_set_num_threads(1);
  const double one = global_norm(models::cpu_backend(), big.data(), n);
  omp_set_num_threads(3);
  const double three = global_norm(models::cpu_backend(), big.data(), n);
  CHECK(one == three);  // bitwise, not approximately
}

TEST_CASE("a clip's coefficient applied in the optimizer's update equals the gradient scaled first",
          "[optim][clip]") {
  // The trainer hands the clip's coefficient to Optimizer::step (grad_scale) instead of scaling the
  // gradient in a pass of its own (trainer/step/update_rule.cpp): the two must give the same update.
  CHECK(clip_coefficient(5.0, 0.0) == 1.f);   // no clipping
  CHECK(clip_coefficient(5.0, 10.0) == 1.f);  // not binding
  CHECK(clip_coefficient(5.0, 2.0) == static_cast<float>(2.0 / (5.0 + 1e-6)));
  CHECK(clip_coefficient(std::nan(""), 2.0) == 1.f);  // the caller refuses a non-finite norm itself
  const int64_t n = 100003;
  const auto g1 = ramp(n, 1.0f), g2 = ramp(n, -0.5f);
  const float scale = 0.37f;
  auto scaled = [&](std::vector<float> g) {
    models::cpu_backend().scale(n, scale, g.data());
    return g;
  };
  const auto g1s = scaled(g1), g2s = scaled(g2);
  SECTION("SGD with momentum, Nesterov and coupled weight decay") {
    std::vector<float> fused = ramp(n, 2.0f), two_pass = fused, unscaled = fused;
    const SgdOptions o{0.9, true, 5e-4, false};
    Sgd a(models::cpu_backend(), n, o), b(models::cpu_backend(), n, o), c(models::cpu_backend(), n, o);
    for (const auto* g : {&g1, &g2}) a.step(fused.data(), g->data(), 0.1, scale);
    for (const auto* g : {&g1s, &g2s}) b.step(two_pass.data(), g->data(), 0.1);
    for (const auto* g : {&g1, &g2}) c.step(unscaled.data(), g->data(), 0.1);
    CHECK(fused != unscaled);  // the scale acts
    // The same bits where the build fuses grad + wd p (TRAINER_NATIVE on FMA hardware, as CI);
    // within a rounding per step elsewhere (optim_ops.cpp).
    for (int64_t i = 0; i < n; i += 997) {
      INFO("element " << i);
      CHECK(close(fused[i], two_pass[i]));
    }
  }
  SECTION("Adam and AdamW: bit for bit (the update's fused multiply-adds are explicit)") {
    for (bool decoupled : {false, true}) {
      std::vector<float> fused = ramp(n, 2.0f), two_pass = fused;
      AdamOptions o;
      o.weight_decay = 1e-2;
      o.decoupled_weight_decay = decoupled;
      Adam a(models::cpu_backend(), n, o), b(models::cpu_backend(), n, o);
      for (const auto* g : {&g1, &g2}) a.step(fused.data(), g->data(), 1e-3, scale);
      for (const auto* g : {&g1s, &g2s}) b.step(two_pass.data(), g->data(), 1e-3);
      CHECK(fused == two_pass);
    }
  }
}
