// Adaptive compression (sync.<method>.adaptive, comm/sync/wrappers/accordion.h): the detector's rule on constructed
// norm sequences; PowerSGD and the sparse methods switching at the expected steps on constructed
// gradients, equal bit for bit to the fixed method while at its setting, every rank alike; exact
// resume across a switch; the saved state checked against sync.adaptive. Runs under mpiexec at 1 and 2 ranks.
#include "comm/sync/wrappers/accordion.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <sstream>

#include "comm/communicator.h"
#include "comm/sync/wrappers/error_feedback_sync.h"
#include "comm/sync/gradient_sync.h"
#include "comm/sync/methods/powersgd/powersgd.h"
#include "tests/conservation.h"
#include "tests/method_keys.h"

using namespace trainer;
using comm::Accordion;
using comm::AccordionOptions;
using comm::Communicator;
using models::ParamView;

namespace {

AccordionOptions every(int64_t interval, std::vector<int64_t> decays = {}) {
  AccordionOptions o;
  o.interval = interval;
  o.lr_decay_steps = std::move(decays);
  return o;
}

// Two groups of two entries; each step adds (a, a, b, b).
bool add(Accordion& d, float a, float b, int64_t step) {
  const float g[4] = {a, a, b, b};
  return d.add(g, step);
}

std::vector<ParamView> model() {
  std::vector<ParamView> views;
  int64_t offset = 0;
  for (const auto& [name, shape] : std::vector<std::pair<std::string, models::Shape>>{
           {"conv.weight", {8, 3, 3, 3}}, {"conv.bias", {8}}, {"fc1.weight", {12, 30}}, {"big.weight", {40, 24}}}) {
    views.push_back({name, offset, shape});
    offset += views.back().numel();
  }
  return views;
}

int64_t size_of(const std::vector<ParamView>& views) { return views.back().offset + views.back().numel(); }

// A gradient the method sends without loss at either setting, so the interval sums are the
// gradient's and the decisions are known: every weight matrix of rank 1 with the same column space
// on every rank (PowerSGD reproduces their mean exactly), or, for the sparse methods, 0.5% of the
// entries nonzero, the same ones on every rank (fewer than k at either density). Scaled by 4 from
// step `jump` on.
std::vector<float> lossless(const std::vector<ParamView>& views, bool sparse, int64_t step, int rank, int64_t jump) {
  const int64_t n = size_of(views);
  std::vector<float> g(n, 0.f);
  const float scale = step >= jump ? 4.f : 1.f;
  if (sparse) {
    for (int64_t i = 0; i < n; i += 200) g[i] = scale * (1.f + 0.01f * static_cast<float>(i % 7 + rank));
    return g;
  }
  for (const ParamView& v : views) {
    const int64_t rows = v.shape[0], cols = v.numel() / rows;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        g[v.offset + r * cols + c] =
            scale * static_cast<float>(r + 1) * (0.5f + 0.01f * static_cast<float>((c * 7 + rank) % 13));
  }
  return g;
}

std::vector<float> noisy(int64_t n, int64_t step, int rank) {
  return testing::correlated_gradient(n, 300 + step, 7000 + 31 * step + rank);
}

comm::SyncOptions adaptive(const std::string& method, int64_t interval) {
  comm::SyncOptions o;
  o.method = method;
  testing::set_if_own(o, "adaptive", true);
  testing::set_if_own(o, "adaptive_interval", interval);
  testing::set_if_own(o, "rank", 1);
  testing::set_if_own(o, "adaptive_rank", 4);
  testing::set_if_own(o, "density", 0.01);
  testing::set_if_own(o, "adaptive_density", 0.1);
  testing::set_if_own(o, "min_compression_rate", 1);  // every weight matrix pays at rank 4 too, so both settings compress the same ones
  return o;
}

// The fixed method at one of the settings.
comm::SyncOptions fixed_at(const std::string& method, bool low) {
  comm::SyncOptions o = adaptive(method, 1);
  testing::set_if_own(o, "adaptive", false);
  testing::set_if_own(o, "rank", low ? 4 : 1);
  testing::set_if_own(o, "density", low ? 0.1 : 0.01);
  return o;
}

// Both sides agree: the minimum and the maximum over the ranks are the same.
bool same_on_every_rank(double x) {
  Communicator& comm = comm::world();
  double lo = x, hi = x;
  comm.allreduce(&lo, 1, comm::DType::kF64, comm::ReduceOp::kMin, "TEST");
  comm.allreduce(&hi, 1, comm::DType::kF64, comm::ReduceOp::kMax, "TEST");
  return lo == hi;
}

}  // namespace

TEST_CASE("The rule: a relative change of the norm of at least eta is critical", "[adaptive]") {
  CHECK(Accordion::critical(false, 0, 1, 0.5));     // nothing to compare with
  CHECK(Accordion::critical(true, 0, 1, 0.5));      // a zero previous norm
  CHECK(Accordion::critical(true, 2, 1, 0.5));      // halved: exactly eta
  CHECK(Accordion::critical(true, 2, 3, 0.5));      // up by half
  CHECK_FALSE(Accordion::critical(true, 2, 1.01, 0.5));
  CHECK_FALSE(Accordion::critical(true, 2, 2.99, 0.5));
  CHECK(Accordion::critical(true, 2, 2.5, 0.2));
}

TEST_CASE("The detector on constructed norm sequences", "[adaptive]") {
  Accordion d(4, {{0, 2}, {2, 2}}, every(2));
  CHECK(d.low() == std::vector<uint8_t>{1, 1});  // training starts critical
  CHECK(d.low_fraction() == 1.0);
  CHECK_FALSE(add(d, 1, 1, 0));
  // The first interval's end: no previous norm, so the next interval stays at low compression.
  CHECK_FALSE(add(d, 1, 1, 1));
  CHECK(d.low() == std::vector<uint8_t>{1, 1});
  // The same sums again: no change, both groups to high compression.
  CHECK_FALSE(add(d, 1, 1, 2));
  CHECK(add(d, 1, 1, 3));
  CHECK(d.low() == std::vector<uint8_t>{0, 0});
  CHECK(d.fresh_switch());
  CHECK(d.last_change() == std::vector<double>{0.0, 0.0});
  // Group 0's sum triples (a change of 2), group 1's grows by 40% (below eta): only group 0 switches.
  CHECK_FALSE(add(d, 3, 1.4f, 4));
  CHECK_FALSE(d.fresh_switch());
  CHECK(add(d, 3, 1.4f, 5));
  CHECK(d.low() == std::vector<uint8_t>{1, 0});
  CHECK(d.low_fraction() == 0.5);
  CHECK(d.switches() == 2);

  // Halving is exactly eta: critical. A learning-rate drop makes the next interval critical too.
  Accordion e(4, {{0, 2}, {2, 2}}, every(2, {6}));
  for (int64_t s = 0; s < 4; ++s) add(e, 1, 1, s);
  CHECK(e.low() == std::vector<uint8_t>{0, 0});
  add(e, 0.5f, 1, 4);
  add(e, 0.5f, 1, 5);  // group 0 halved; the drop at step 6 starts the next interval
  CHECK(e.low() == std::vector<uint8_t>{1, 1});
  add(e, 0.5f, 1, 6);
  add(e, 0.5f, 1, 7);  // no change, no drop
  CHECK(e.low() == std::vector<uint8_t>{0, 0});

  // The state mid-interval carries on exactly.
  Accordion f(4, {{0, 2}, {2, 2}}, every(3));
  for (int64_t s = 0; s < 5; ++s) add(f, 1.f + 0.1f * s, 2, s);
  std::stringstream saved;
  f.save(saved);
  Accordion g(4, {{0, 2}, {2, 2}}, every(3));
  g.load(saved);
  for (int64_t s = 5; s < 12; ++s) CHECK(add(f, 5.f * s, 2, s) == add(g, 5.f * s, 2, s));
  std::stringstream a, b;
  f.save(a);
  g.save(b);
  CHECK(a.str() == b.str());
  // An interval that did not run through (a warmup ended inside it) is no measurement: with steps 0
  // and 1 dense, the interval of steps 0-2 sums step 2 alone and stays critical; 3-5 is measured
  // (critical: nothing to compare with); 6-8 equal to it: high compression from step 9.
  Accordion w(4, {{0, 2}, {2, 2}}, every(3));
  for (int64_t s = 2; s < 9; ++s) CHECK(add(w, 1, 1, s) == (s == 8));
  CHECK(w.low() == std::vector<uint8_t>{0, 0});

  Accordion other(4, {{0, 2}, {2, 2}}, every(4));
  std::stringstream again(a.str());
  CHECK_THROWS_WITH(other.load(again), Catch::Matchers::Contains("adaptive_interval"));
}

TEST_CASE("PowerSGD and the sparse methods switch at the expected steps, alike on every rank", "[adaptive][mpi]") {
  Communicator& comm = comm::world();
  const std::vector<ParamView> views = model();
  const int64_t n = size_of(views);
  for (const char* method : {"powersgd", "topka", "oktopk", "gaussiank"}) {
    INFO(method);
    const bool sparse = std::string(method) != "powersgd";
    // Intervals of 3 steps; the gradient jumps by 4x at step 6. Steps 0-5 at low compression (the
    // first interval and the one after it), 6-8 at high (no change between 0-2 and 3-5), 9-11 at
    // low again (the sums went up 4x between 3-5 and 6-8).
    auto sync = comm::make_gradient_sync(adaptive(method, 3), comm, n, &views);
    auto low_run = comm::make_gradient_sync(fixed_at(method, true), comm, n, &views);
    auto high_run = comm::make_gradient_sync(fixed_at(method, false), comm, n, &views);
    double pattern = 0;
    for (int64_t s = 0; s < 12; ++s) {
      INFO("step " << s);
      auto g = lossless(views, sparse, s, comm.rank(), 6);
      comm::SyncBuffers b{nullptr, g.data(), n, nullptr, 0, &views};
      const comm::SyncStats stats = sync->reduce(b, s);
      const bool low = s < 6 || s >= 9;
      CHECK(stats.low_compression == (low ? 1.0 : 0.0));
      // What was sent is what the fixed method at that setting sends.
      auto h = lossless(views, sparse, s, comm.rank(), 6);
      comm::SyncBuffers hb{nullptr, h.data(), n, nullptr, 0, &views};
      const comm::SyncStats fixed = (low ? low_run : high_run)->reduce(hb, s);
      if (!sparse || std::string(method) == "topka") CHECK(stats.density == fixed.density);
      pattern = pattern * 2 + stats.low_compression + (sparse ? 0 : stats.density);
    }
    CHECK(same_on_every_rank(pattern));
  }
}

TEST_CASE("After a switch PowerSGD restarts each tensor from its seeded Q at the new rank", "[adaptive][mpi]") {
  Communicator& comm = comm::world();
  const std::vector<ParamView> views = model();
  const int64_t n = size_of(views);
  // Without error feedback acc is the gradient, so the first step after a switch (6: to rank 1; 9:
  // back to rank 4) is the first step of a fresh fixed run at that rank, bit for bit.
  comm::SyncOptions o = adaptive("powersgd", 3);
  o.set("error_feedback", false);
  auto sync = comm::make_gradient_sync(o, comm, n, &views);
  for (int64_t s = 0; s < 10; ++s) {
    auto g = lossless(views, false, s, comm.rank(), 6);
    const auto input = g;
    comm::SyncBuffers b{nullptr, g.data(), n, nullptr, 0, &views};
    sync->reduce(b, s);
    if (s != 6 && s != 9) continue;
    INFO("step " << s);
    comm::SyncOptions f = fixed_at("powersgd", s == 9);
    f.set("error_feedback", false);
    auto fresh = comm::make_gradient_sync(f, comm, n, &views);
    auto h = input;
    comm::SyncBuffers hb{nullptr, h.data(), n, nullptr, 0, &views};
    fresh->reduce(hb, s);
    CHECK(std::memcmp(g.data(), h.data(), n * sizeof(float)) == 0);
  }
}

TEST_CASE("At the low-compression setting the output is the fixed method's, bit for bit", "[adaptive][mpi]") {
  Communicator& comm = comm::world();
  const std::vector<ParamView> views = model();
  const int64_t n = size_of(views);
  for (const char* method : {"powersgd", "topka", "oktopk", "gtopk"}) {
    if (std::string(method) == "gtopk" && (comm.size() & (comm.size() - 1)) != 0) continue;
    INFO(method);
    // An interval longer than the run: every step at the low-compression setting.
    auto sync = comm::make_gradient_sync(adaptive(method, 100), comm, n, &views);
    auto reference = comm::make_gradient_sync(fixed_at(method, true), comm, n, &views);
    int64_t differing = 0;
    for (int64_t s = 0; s < 6; ++s) {
      auto g = noisy(n, s, comm.rank()), h = g;
      comm::SyncBuffers b{nullptr, g.data(), n, nullptr, 0, &views}, hb{nullptr, h.data(), n, nullptr, 0, &views};
      sync->reduce(b, s);
      reference->reduce(hb, s);
      differing += std::memcmp(g.data(), h.data(), n * sizeof(float)) != 0;
    }
    CHECK(differing == 0);
  }
}

TEST_CASE("Resume across a switch is bit for bit", "[adaptive][mpi]") {
  Communicator& comm = comm::world();
  const std::vector<ParamView> views = model();
  const int64_t n = size_of(views);
  for (const char* method : {"powersgd", "oktopk", "topka", "gaussiank"}) {
    const bool sparse = std::string(method) != "powersgd";
    const comm::SyncOptions o = adaptive(method, 3);
    // Switches after steps 5 and 8 (and 11); saved mid-interval before the first, and right after
    // it (a fresh switch: Ok-Top-k's exact thresholds are still due).
    for (int64_t before : {4, 6}) {
      INFO(method << " saved after " << before << " steps");
      auto run = [&](comm::GradientSync& s, int64_t step) {
        auto g = lossless(views, sparse, step, comm.rank(), 6);
        const auto noise = noisy(n, step, comm.rank());
        for (int64_t i = 0; i < n; ++i) g[i] += 1e-3f * noise[i];
        comm::SyncBuffers b{nullptr, g.data(), n, nullptr, 0, &views};
        const double low = s.reduce(b, step).low_compression;
        return std::make_pair(g, low);
      };
      auto a = comm::make_gradient_sync(o, comm, n, &views);
      for (int64_t s = 0; s < before; ++s) run(*a, s);
      std::stringstream saved;
      a->save(saved);
      auto b = comm::make_gradient_sync(o, comm, n, &views);
      b->load(saved);
      int64_t differing = 0, switches = 0;
      double previous = -1;
      for (int64_t s = before; s < 15; ++s) {
        const auto [ga, la] = run(*a, s);
        const auto [gb, lb] = run(*b, s);
        differing += std::memcmp(ga.data(), gb.data(), n * sizeof(float)) != 0 || la != lb;
        switches += previous >= 0 && la != previous;
        previous = la;
      }
      CHECK(differing == 0);
      CHECK(switches >= 1);  // the compared steps cross a switch
      std::stringstream sa, sb;
      a->save(sa);
      b->save(sb);
      CHECK(sa.str() == sb.str());
    }
  }
}

TEST_CASE("A saved state says whether it adapted", "[adaptive][mpi]") {
  Communicator& comm = comm::world();
  const std::vector<ParamView> views = model();
  const int64_t n = size_of(views);
  for (const char* method : {"powersgd", "oktopk"}) {
    INFO(method);
    comm::SyncOptions on = adaptive(method, 3), off = on;
    off.set("adaptive", false);
    auto g = noisy(n, 0, comm.rank());
    comm::SyncBuffers b{nullptr, g.data(), n, nullptr, 0, &views};
    auto adapting = comm::make_gradient_sync(on, comm, n, &views);
    adapting->reduce(b, 0);
    std::stringstream with;
    adapting->save(with);
    auto plain = comm::make_gradient_sync(off, comm, n, &views);
    CHECK_THROWS_WITH(plain->load(with), Catch::Matchers::Contains("saved with adaptive = true"));
    std::stringstream without;
    plain->save(without);
    auto again = comm::make_gradient_sync(on, comm, n, &views);
    CHECK_THROWS_WITH(again->load(without), Catch::Matchers::Contains("saved with adaptive = false"));
    // Another pair of settings.
    comm::SyncOptions other = on;
    testing::set_if_own(other, "adaptive_rank", 8);
    testing::set_if_own(other, "adaptive_density", 0.2);
    std::stringstream again_with(with.str());
    CHECK_THROWS_WITH(comm::make_gradient_sync(other, comm, n, &views)->load(again_with),
                      Catch::Matchers::Contains("adapts between"));
    // The failed loads left both as they were.
    std::stringstream x, y;
    again->save(x);
    comm::make_gradient_sync(on, comm, n, &views)->save(y);
    CHECK(x.str() == y.str());
  }
  // A method that does not compress has no such key in its table (the config refuses the flat
  // spelling under it: config_test.cpp).
  comm::SyncOptions dense;
  CHECK_THROWS_WITH(dense.set("adaptive", true), Catch::Matchers::Contains("no sync method has a key sync.dense.adaptive"));
  // An epoch interval needs the epoch's length to run (--dry-run builds the method without it).
  comm::SyncOptions epoch = adaptive("topka", 0);
  auto unknown = comm::make_gradient_sync(epoch, comm, n, &views);
  CHECK_THAT(unknown->describe(), Catch::Matchers::Contains("intervals of an epoch"));
  auto g = noisy(n, 0, comm.rank());
  comm::SyncBuffers b{nullptr, g.data(), n, nullptr, 0, &views};
  CHECK_THROWS_WITH(unknown->reduce(b, 0), Catch::Matchers::Contains("adaptive_interval"));
  epoch.recipe.steps_per_epoch = 10;
  CHECK_THAT(comm::make_gradient_sync(epoch, comm, n, &views)->describe(),
             Catch::Matchers::Contains("intervals of 10 steps"));
}
