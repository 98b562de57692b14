// The async_ps servers' remedies for stale gradients (comm/sync/methods/async_ps/staleness_remedies.h) against a
// float64 reference written from the definitions: momentum corrected for asynchrony's implicit
// momentum (Mitliagkas et al. 2016) and gap-aware damping (Barkai et al. 2020).
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <sstream>
#include <vector>

#include "comm/sync/methods/async_ps/staleness_remedies.h"

using trainer::comm::corrected_momentum;
using trainer::comm::GapAwareDamping;

TEST_CASE("momentum correction subtracts asynchrony's implicit momentum 1 - 1/W, not below zero") {
  CHECK(corrected_momentum(0.9, 1) == Approx(0.9));  // one worker: no asynchrony
  CHECK(corrected_momentum(0.9, 3) == Approx(0.9 - 2.0 / 3.0));
  CHECK(corrected_momentum(0.9, 10) == Approx(0.0).margin(1e-12));
  CHECK(corrected_momentum(0.6, 3) == 0.0);
  CHECK(corrected_momentum(0.0, 2) == 0.0);
}

namespace {

struct Update {
  std::vector<float> before, after;
  double lr;
};

// The paper's damping in float64: C_i = max_lr (sqrt(m_i / (1 - 0.999^k)) + 1e-8), m the running
// average of ((before - after) / lr)^2, and (g + wd w) / (1 + |w - w_pulled| / C) is what the
// optimizer's coupled decay must see.
std::vector<double> reference_damped(const std::vector<Update>& updates, const std::vector<float>& g,
                                     const std::vector<float>& w, const std::vector<float>& pulled, double wd) {
  const size_t n = g.size();
  std::vector<double> m(n, 0.0);
  double max_lr = 0;
  for (const Update& u : updates) {
    for (size_t i = 0; i < n; ++i) {
      const double step = (static_cast<double>(u.before[i]) - u.after[i]) / u.lr;
      m[i] = 0.999 * m[i] + 0.001 * step * step;
    }
    max_lr = std::max(max_lr, u.lr);
  }
  const double bias = 1 - std::pow(0.999, static_cast<double>(updates.size()));
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) {
    const double c = max_lr * (std::sqrt(m[i] / bias) + 1e-8);
    const double penalty = 1 + std::fabs(static_cast<double>(w[i]) - pulled[i]) / c;
    out[i] = (g[i] + wd * w[i]) / penalty;  // the damped gradient plus the optimizer's decay term
  }
  return out;
}

std::vector<float> random_vector(std::mt19937& rng, size_t n, float scale) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

}  // namespace

TEST_CASE("gap-aware damping divides each element by 1 + its gap in average updates (float64 reference)") {
  const size_t n = 4099;  // not a multiple of a vector width
  std::mt19937 rng(7);
  std::vector<Update> updates;
  GapAwareDamping gap(static_cast<int64_t>(n));
  // Five updates at a warming-up then decaying lr: C uses the largest.
  for (double lr : {0.01, 0.03, 0.05, 0.04, 0.02}) {
    Update u{random_vector(rng, n, 1.f), {}, lr};
    std::vector<float> step = random_vector(rng, n, static_cast<float>(lr));
    u.after = u.before;
    for (size_t i = 0; i < n; ++i) u.after[i] -= step[i];
    gap.observe(u.before.data(), u.after.data(), lr);
    updates.push_back(u);
  }
  REQUIRE(gap.updates() == 5);
  const std::vector<float> w = random_vector(rng, n, 1.f);
  std::vector<float> pulled = w;
  // Gaps from 0 to several average steps; some elements did not move at all.
  const std::vector<float> moved = random_vector(rng, n, 0.1f);
  for (size_t i = 0; i < n; ++i)
    if (i % 5 != 0) pulled[i] += moved[i];
  const std::vector<float> g0 = random_vector(rng, n, 1.f);
  const float wd = 5e-4f;
  std::vector<float> g = g0;
  gap.damp(g.data(), w.data(), pulled.data(), wd);
  const std::vector<double> expected = reference_damped(updates, g0, w, pulled, wd);
  double worst = 0, strongest = 1;
  for (size_t i = 0; i < n; ++i) {
    const double got = static_cast<double>(g[i]) + wd * w[i];  // what the optimizer applies
    worst = std::max(worst, std::fabs(got - expected[i]) / (std::fabs(expected[i]) + 1e-6));
    if (i % 5 == 0) CHECK(g[i] == g0[i]);  // no gap: applied in full, bit for bit
    strongest = std::min(strongest, std::fabs(expected[i]) / (std::fabs(g0[i] + wd * w[i]) + 1e-30));
  }
  CHECK(worst < 1e-5);
  CHECK(strongest < 0.5);  // the test data does reach gaps of more than one average update
}

TEST_CASE("gap-aware damping does nothing before an update was observed, and its state round-trips") {
  const size_t n = 33;
  std::mt19937 rng(3);
  GapAwareDamping gap(static_cast<int64_t>(n));
  const std::vector<float> w = random_vector(rng, n, 1.f), pulled = random_vector(rng, n, 1.f);
  const std::vector<float> g0 = random_vector(rng, n, 1.f);
  std::vector<float> g = g0;
  gap.damp(g.data(), w.data(), pulled.data(), 1e-3f);
  CHECK(g == g0);  // C is unknown before the first update: no damping

  const std::vector<float> before = random_vector(rng, n, 1.f), after = random_vector(rng, n, 1.f);
  gap.observe(before.data(), after.data(), 0.1);
  gap.observe(after.data(), before.data(), 0.0);  // a zero-lr step carries no direction: ignored
  CHECK(gap.updates() == 1);
  std::stringstream state;
  gap.save(state);
  GapAwareDamping copy(static_cast<int64_t>(n));
  copy.load(state);
  std::vector<float> a = g0, b = g0;
  gap.damp(a.data(), w.data(), pulled.data(), 1e-3f);
  copy.damp(b.data(), w.data(), pulled.data(), 1e-3f);
  CHECK(a == b);
  CHECK(a != g0);
  GapAwareDamping other(static_cast<int64_t>(n + 1));
  std::stringstream again;
  gap.save(again);
  CHECK_THROWS_WITH(other.load(again), Catch::Matchers::Contains("33 elements"));
}
