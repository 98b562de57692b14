// Multi-rank tests of the sparse gradient-sync methods (run under mpiexec with P = 2, 3, 4, 8):
// oktopk with exact thresholds every step, topka and gtopk against their definitions computed
// densely here; error feedback conserving mass (all four); the bytes each rank sends per step, read
// back from the comm log; save -> load -> continue is bitwise the same (all four); dense warmup.
//
// The dense references keep every rank's residual (each rank generates every rank's gradients) and
// follow the rules of comm/sync/methods/sparse/select.h: thresholds keep ties and never zeros, exactly-k breaks
// ties by lower index, sums over ranks are formed in rank order.
#include "comm/sync/methods/sparse/oktopk.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <set>
#include <sstream>

#include "comm/comm_log.h"
#include "comm/communicator.h"
#include "comm/sync/methods/sparse/gaussiank.h"
#include "comm/sync/gradient_sync.h"
#include "comm/sync/methods/sparse/gtopk.h"
#include "comm/sync/methods/sparse/select.h"
#include "comm/sync/methods/sparse/topka.h"
#include "tests/method_keys.h"

using namespace trainer;
using comm::Communicator;

namespace {

// The gradient of `rank` at `step`: 0.5 x a normal vector shared by all ranks + a per-rank one.
std::vector<float> gradient(int64_t step, int rank, int64_t n) {
  std::mt19937_64 shared(1000 + step), own(77777 + 131 * step + rank);
  std::normal_distribution<float> normal;
  std::vector<float> g(n);
  for (auto& x : g) x = 0.5f * normal(shared);
  for (auto& x : g) x += normal(own);
  return g;
}

bool is_power_of_two(int p) { return p > 0 && (p & (p - 1)) == 0; }

comm::SyncOptions options(const std::string& method, double density) {
  comm::SyncOptions o;
  o.method = method;
  o.set("density", density);
  return o;
}

// The threshold rule: |x| >= the k-th largest magnitude, never zeros; all nonzeros if fewer than k.
std::vector<int32_t> threshold_select(const std::vector<float>& x, int64_t k) {
  std::vector<float> m;
  for (float v : x)
    if (v != 0.f) m.push_back(std::fabs(v));
  float t = 0.f;
  if (static_cast<int64_t>(m.size()) > k) {
    std::nth_element(m.begin(), m.begin() + (m.size() - k), m.end());
    t = m[m.size() - k];
  }
  std::vector<int32_t> out;
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i] != 0.f && std::fabs(x[i]) >= t) out.push_back(static_cast<int32_t>(i));
  return out;
}

// The exactly-k rule over the given (index-sorted) candidates: largest |value|, ties by lower index.
std::vector<int32_t> exactly_k(const std::vector<int32_t>& candidates, const std::vector<float>& value, int64_t k) {
  std::vector<int32_t> order = candidates;
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return std::fabs(value[a]) > std::fabs(value[b]); });
  if (static_cast<int64_t>(order.size()) > k) order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

std::vector<int32_t> all_indices(int64_t n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// Every rank's residual, advanced by the reference definitions.
struct World {
  int p;
  int64_t n, k;
  std::vector<std::vector<float>> residual;
  World(int p_, int64_t n_, int64_t k_) : p(p_), n(n_), k(k_), residual(p_, std::vector<float>(n_, 0.f)) {}
  std::vector<std::vector<float>> accumulate(int64_t step) {
    std::vector<std::vector<float>> acc(p);
    for (int r = 0; r < p; ++r) {
      acc[r] = gradient(step, r, n);
      for (int64_t i = 0; i < n; ++i) acc[r][i] += residual[r][i];
    }
    return acc;
  }
};

// Sum over ranks in rank order of each rank's selected entries; `in` marks the union.
void rank_order_sum(const std::vector<std::vector<float>>& acc, const std::vector<std::vector<int32_t>>& sel,
                    std::vector<float>& sum, std::vector<char>& in) {
  const int64_t n = acc[0].size();
  sum.assign(n, 0.f);
  in.assign(n, 0);
  for (size_t r = 0; r < acc.size(); ++r)
    for (int32_t i : sel[r]) {
      sum[i] = in[i] ? sum[i] + acc[r][i] : acc[r][i];
      in[i] = 1;
    }
}

std::vector<float> ref_oktopk(World& w, int64_t step) {
  const auto acc = w.accumulate(step);
  std::vector<std::vector<int32_t>> sel(w.p);
  for (int r = 0; r < w.p; ++r) sel[r] = threshold_select(acc[r], w.k);
  std::vector<float> sum;
  std::vector<char> in;
  rank_order_sum(acc, sel, sum, in);
  std::vector<float> reduced(w.n, 0.f);
  for (int64_t i = 0; i < w.n; ++i)
    if (in[i]) reduced[i] = sum[i];
  const auto global = threshold_select(reduced, w.k);
  std::vector<float> out(w.n, 0.f);
  std::vector<char> chosen(w.n, 0);
  for (int32_t i : global) out[i] = reduced[i] / static_cast<float>(w.p), chosen[i] = 1;
  for (int r = 0; r < w.p; ++r) {
    w.residual[r] = acc[r];
    for (int32_t i : sel[r])
      if (chosen[i]) w.residual[r][i] = 0.f;
  }
  return out;
}

std::vector<float> ref_topka(World& w, int64_t step) {
  const auto acc = w.accumulate(step);
  std::vector<std::vector<int32_t>> sel(w.p);
  for (int r = 0; r < w.p; ++r) sel[r] = exactly_k(all_indices(w.n), acc[r], w.k);
  std::vector<float> sum;
  std::vector<char> in;
  rank_order_sum(acc, sel, sum, in);
  std::vector<float> out(w.n, 0.f);
  for (int64_t i = 0; i < w.n; ++i)
    if (in[i]) out[i] = sum[i] / static_cast<float>(w.p);
  for (int r = 0; r < w.p; ++r) {
    w.residual[r] = acc[r];
    for (int32_t i : sel[r]) w.residual[r][i] = 0.f;
  }
  return out;
}

std::vector<float> ref_gtopk(World& w, int64_t step) {
  const auto acc = w.accumulate(step);
  // Per node: current entries (dense values over its support) and which ranks are in each sum.
  std::vector<std::vector<int32_t>> support(w.p);
  std::vector<std::vector<float>> value(w.p, std::vector<float>(w.n, 0.f));
  std::vector<std::vector<uint64_t>> ranks(w.p, std::vector<uint64_t>(w.n, 0));
  std::vector<std::vector<int32_t>> sel(w.p);
  for (int r = 0; r < w.p; ++r) {
    sel[r] = support[r] = exactly_k(all_indices(w.n), acc[r], w.k);
    for (int32_t i : sel[r]) value[r][i] = acc[r][i], ranks[r][i] = uint64_t{1} << r;
  }
  for (int d = 1; d < w.p; d *= 2)
    for (int r = 0; r < w.p; r += 2 * d) {
      const int s = r + d;
      std::set<int32_t> uni(support[r].begin(), support[r].end());
      std::vector<char> in_r(w.n, 0);
      for (int32_t i : support[r]) in_r[i] = 1;
      for (int32_t i : support[s]) {
        value[r][i] = in_r[i] ? value[r][i] + value[s][i] : value[s][i];
        ranks[r][i] |= ranks[s][i];
        uni.insert(i);
      }
      const auto kept = exactly_k(std::vector<int32_t>(uni.begin(), uni.end()), value[r], w.k);
      std::vector<char> keep(w.n, 0);
      for (int32_t i : kept) keep[i] = 1;
      for (int32_t i : uni)
        if (!keep[i]) value[r][i] = 0.f, ranks[r][i] = 0;
      support[r] = kept;
    }
  std::vector<float> out(w.n, 0.f);
  for (int32_t i : support[0]) out[i] = value[0][i] / static_cast<float>(w.p);
  for (int r = 0; r < w.p; ++r) {
    w.residual[r] = acc[r];
    for (int32_t i : support[0])
      if (ranks[0][i] >> r & 1) w.residual[r][i] = 0.f;
  }
  return out;
}

// True when every rank holds bytewise the same vector.
bool identical_on_all_ranks(Communicator& comm, const std::vector<float>& v) {
  std::vector<float> root = v;
  comm.broadcast(root.data(), static_cast<int64_t>(root.size()), comm::DType::kF32, 0, "TEST");
  int32_t same = std::memcmp(root.data(), v.data(), v.size() * sizeof(float)) == 0;
  comm.allreduce(&same, 1, comm::DType::kI32, comm::ReduceOp::kMin, "TEST");
  return same == 1;
}

// Entries where the support differs, and where values differ by more than float rounding.
struct Mismatch {
  int64_t support = 0, value = 0;
};
Mismatch compare(const std::vector<float>& got, const std::vector<float>& want) {
  Mismatch m;
  for (size_t i = 0; i < got.size(); ++i) {
    if ((got[i] != 0.f) != (want[i] != 0.f))
      ++m.support;
    else if (std::fabs(got[i] - want[i]) > 1e-6f * std::max(1.f, std::fabs(want[i])))
      ++m.value;
  }
  return m;
}

// Runs `steps` steps of `sync` and of the reference `ref`, checking outputs and this rank's residual.
template <class Sync, class Ref>
void check_against_reference(Sync& sync, Ref ref, int64_t n, int64_t k, int steps) {
  Communicator& comm = comm::world();
  World w(comm.size(), n, k);
  for (int step = 0; step < steps; ++step) {
    auto g = gradient(step, comm.rank(), n);
    comm::SyncBuffers b{nullptr, g.data(), n};
    const comm::SyncStats stats = sync.reduce(b, step);
    CHECK(stats.phase == comm::Phase::kCompressed);
    const auto want = ref(w, step);
    const Mismatch m = compare(g, want);
    INFO("step " << step << " rank " << comm.rank());
    CHECK(m.support == 0);
    CHECK(m.value == 0);
    const float* residual = sync.error_feedback().residual();
    CHECK(std::equal(residual, residual + n, w.residual[comm.rank()].begin()));
    CHECK(identical_on_all_ranks(comm, g));
  }
}

}  // namespace

TEST_CASE("oktopk with exact thresholds every step returns the global top-k of the summed local selections",
          "[oktopk][mpi]") {
  Communicator& comm = comm::world();
  const int64_t n = 20011;
  for (bool balance : {true, false})
    for (int64_t in_flight : {int64_t{1}, int64_t{4}})
      for (int64_t region_every : {int64_t{1}, int64_t{3}}) {
        auto o = options("oktopk", 0.01);
        o.set("local_threshold_every", 1);
        o.set("global_threshold_every", 1);
        o.set("region_every", region_every);
        o.set("max_in_flight", in_flight);
        o.set("balance", balance);
        comm::OkTopk sync(comm, n, comm::options_of<comm::OkTopkOptions>(o), models::cpu_backend());
        INFO("balance " << balance << ", max_in_flight " << in_flight << ", region_every " << region_every);
        check_against_reference(sync, ref_oktopk, n, sync.k(), 5);
      }
}

TEST_CASE("topka equals its definition: exact local top-k, summed in rank order", "[topka][mpi]") {
  Communicator& comm = comm::world();
  const int64_t n = 12007;
  comm::TopkA sync(comm, n, 0.02, models::cpu_backend());
  check_against_reference(sync, ref_topka, n, sync.k(), 4);
}

TEST_CASE("gtopk equals its definition: pairwise merge and reselect, then broadcast", "[gtopk][mpi]") {
  Communicator& comm = comm::world();
  const int64_t n = 12007;
  if (!is_power_of_two(comm.size())) {
    CHECK_THROWS_WITH(
        comm::make_gradient_sync(options("gtopk", 0.02), comm, n),
        Catch::Matchers::Contains("power-of-two") && Catch::Matchers::Contains(std::to_string(comm.size())));
    return;
  }
  comm::GTopk sync(comm, n, 0.02, models::cpu_backend());
  check_against_reference(sync, ref_gtopk, n, sync.k(), 4);
}

TEST_CASE("gaussiank selects about k entries by its fitted threshold, the same output on all ranks",
          "[gaussiank][mpi]") {
  Communicator& comm = comm::world();
  const int64_t n = 50021;
  comm::GaussianK sync(comm, n, 0.01, models::cpu_backend());
  World w(comm.size(), n, sync.k());
  for (int step = 0; step < 4; ++step) {
    const auto acc = w.accumulate(step);
    auto g = gradient(step, comm.rank(), n);
    comm::SyncBuffers b{nullptr, g.data(), n};
    const auto stats = sync.reduce(b, step);
    // Every rank's selection is |acc| >= its own threshold; the output is their rank-order sum / P.
    std::vector<float> thresholds(comm.size());
    float mine = sync.last_threshold();
    comm.allgather(&mine, 1, thresholds.data(), comm::DType::kF32, "TEST");
    std::vector<std::vector<int32_t>> sel(comm.size());
    for (int r = 0; r < comm.size(); ++r) {
      for (int64_t i = 0; i < n; ++i)
        if (acc[r][i] != 0.f && std::fabs(acc[r][i]) >= thresholds[r]) sel[r].push_back(static_cast<int32_t>(i));
      w.residual[r] = acc[r];
      for (int32_t i : sel[r]) w.residual[r][i] = 0.f;
    }
    const int64_t count = sel[comm.rank()].size();
    CHECK(4 * count >= 3 * sync.k());
    CHECK(4 * count <= 5 * sync.k());
    CHECK(stats.density == Approx(static_cast<double>(count) / n));
    std::vector<float> sum;
    std::vector<char> in;
    rank_order_sum(acc, sel, sum, in);
    std::vector<float> want(n, 0.f);
    for (int64_t i = 0; i < n; ++i)
      if (in[i]) want[i] = sum[i] / static_cast<float>(comm.size());
    const Mismatch m = compare(g, want);
    CHECK(m.support == 0);
    CHECK(m.value == 0);
    CHECK(identical_on_all_ranks(comm, g));
  }
}

namespace {

// Error feedback conserves mass. Per rank: each entry of acc is either kept in the residual or
// cleared (contributed whole); the sum over steps of the contributions plus the final residual is
// the sum of the gradients. Across ranks: the contributions of a step sum to P x the output, so
// nothing is lost or counted twice.
template <class Sync>
void check_mass(Sync& sync, int64_t n, int steps) {
  Communicator& comm = comm::world();
  const int p = comm.size();
  std::vector<double> gradients(n, 0.0), contributed(n, 0.0);
  int64_t partial_entries = 0;
  double worst_step = 0, scale = 0;
  for (int step = 0; step < steps; ++step) {
    auto g = gradient(step, comm.rank(), n);
    const float* before = sync.error_feedback().residual();
    std::vector<float> acc(n);
    for (int64_t i = 0; i < n; ++i) acc[i] = g[i] + before[i], gradients[i] += g[i];
    comm::SyncBuffers b{nullptr, g.data(), n};
    sync.reduce(b, step);
    const float* after = sync.error_feedback().residual();
    std::vector<double> step_contribution(n);
    for (int64_t i = 0; i < n; ++i) {
      if (after[i] != acc[i] && after[i] != 0.f) ++partial_entries;
      step_contribution[i] = static_cast<double>(acc[i]) - after[i];
      contributed[i] += step_contribution[i];
    }
    comm.allreduce(step_contribution.data(), n, comm::DType::kF64, comm::ReduceOp::kSum, "TEST");
    for (int64_t i = 0; i < n; ++i) {
      worst_step = std::max(worst_step, std::fabs(step_contribution[i] - static_cast<double>(p) * g[i]));
      scale = std::max(scale, std::fabs(step_contribution[i]));
    }
  }
  CHECK(partial_entries == 0);
  INFO("largest |sum over ranks of contributions - P x output| " << worst_step << " (largest contribution " << scale
                                                                 << ")");
  CHECK(worst_step <= 1e-5 * std::max(1.0, scale));
  const float* residual = sync.error_feedback().residual();
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(contributed[i] + residual[i] - gradients[i]));
  CHECK(worst <= 1e-4);
}

}  // namespace

TEST_CASE("Error feedback conserves mass in all four sparse methods", "[oktopk][mpi]") {
  Communicator& comm = comm::world();
  const int64_t n = 30011;
  {
    auto o = options("oktopk", 0.01);
    o.set("local_threshold_every", 3);
    o.set("global_threshold_every", 2);
    o.set("region_every", 4);
    comm::OkTopk sync(comm, n, comm::options_of<comm::OkTopkOptions>(o), models::cpu_backend());
    check_mass(sync, n, 8);
  }
  {
    comm::TopkA sync(comm, n, 0.01, models::cpu_backend());
    check_mass(sync, n, 5);
  }
  {
    comm::GaussianK sync(comm, n, 0.01, models::cpu_backend());
    check_mass(sync, n, 5);
  }
  if (is_power_of_two(comm.size())) {
    comm::GTopk sync(comm, n, 0.01, models::cpu_backend());
    check_mass(sync, n, 5);
  }
}

namespace {

struct StepVolume {
  int64_t bytes = 0, bytes_recv = 0;
  std::set<std::string> ops;
};

// Runs `steps` steps of a method with the comm log on, and reads this rank's records back.
std::map<int64_t, StepVolume> logged_volume(const comm::SyncOptions& o, int64_t n, int steps) {
  Communicator& comm = comm::world();
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("oktopk_test_log_" + std::to_string(comm.size()));
  const std::string path = (dir / ("rank" + std::to_string(comm.rank()) + ".jsonl")).string();
  comm::CommLogOptions log;
  log.enabled = true;
  log.path = path;
  comm.log().open(log, comm.rank(), comm.size());
  {
    auto sync = comm::make_gradient_sync(o, comm, n);
    for (int step = 0; step < steps; ++step) {
      auto g = gradient(step, comm.rank(), n);
      comm::SyncBuffers b{nullptr, g.data(), n};
      sync->reduce(b, step);
    }
  }
  comm.log().open(comm::CommLogOptions{}, comm.rank(), comm.size());  // writes out, closes, disables
  std::map<int64_t, StepVolume> volume;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const auto r = nlohmann::json::parse(line);
    StepVolume& v = volume[r.at("step").get<int64_t>()];
    v.bytes += r.at("bytes").get<int64_t>();
    v.bytes_recv += r.at("bytes_recv").get<int64_t>();
    v.ops.insert(r.at("op").get<std::string>());
    CHECK(r.at("phase").get<std::string>() == "compressed");
  }
  comm.barrier("TEST");
  std::error_code ec;
  fs::remove(path, ec);
  return volume;
}

}  // namespace

TEST_CASE("Bytes per rank and step from the comm log: oktopk within 6k(P-1)/P words, topka 2k(P-1)", "[oktopk][mpi]") {
  Communicator& comm = comm::world();
  const int p = comm.size();
  const int64_t n = 200003;
  SECTION("oktopk") {
    for (bool balance : {true, false}) {
      auto o = options("oktopk", 0.02);
      o.set("local_threshold_every", 1);
        o.set("global_threshold_every", 1);
      o.set("balance", balance);
      const int64_t k = comm::top_k_count(o.get<double>("density"), n);
      const double bound = 6.0 * k * (p - 1) / p * 4;
      // The method states the same bound itself (for trainer bench sync and --dry-run).
      CHECK(comm::make_gradient_sync(o, comm, n)->wire_volume().words * 4 == Approx(bound));
      const auto volume = logged_volume(o, n, 4);
      REQUIRE(volume.size() == 4);
      for (const auto& [step, v] : volume) {
        INFO("step " << step << ": sent " << v.bytes << " B, received " << v.bytes_recv << " B, bound " << bound);
        CHECK(v.bytes <= bound);
        CHECK(v.bytes_recv <= bound);
        const std::set<std::string> allowed{"ALLREDUCE_REGION",    "ALLTOALL_COUNTS",  "ISEND_INDEX",
                                            "IRECV_INDEX",         "ISEND_VALUE",      "IRECV_VALUE",
                                            "ALLREDUCE_THRESHOLD", "ALLGATHER_COUNTS", "ALLGATHERV_FINAL"};
        for (const auto& op : v.ops) CHECK(allowed.count(op) == 1);
        CHECK(v.ops.count("ALLGATHERV_FINAL") == 1);
        CHECK(v.ops.count("ISEND_INDEX") == 1);
      }
    }
  }
  SECTION("topka") {
    const auto o = options("topka", 0.02);
    const int64_t k = comm::top_k_count(o.get<double>("density"), n);
    CHECK(comm::make_gradient_sync(o, comm, n)->wire_volume().words == 2.0 * k * (p - 1));
    CHECK(comm::make_gradient_sync(o, comm, n)->wire_volume().formula == "2k(P-1)");
    for (const auto& [step, v] : logged_volume(o, n, 3)) {
      CHECK(v.bytes == 2 * k * 4);                 // its own k indices and k values
      CHECK(v.bytes_recv == 2 * k * (p - 1) * 4);  // everyone else's: 2k(P-1) words
      CHECK(v.ops == std::set<std::string>{"ALLGATHER_TOPK"});
    }
  }
}

namespace {

// save -> load -> continue is bitwise the same as never stopping: outputs of every later step and
// the saved state afterwards.
void check_resume(const comm::SyncOptions& o, int64_t n, int before, int after) {
  Communicator& comm = comm::world();
  auto a = comm::make_gradient_sync(o, comm, n);
  auto run = [&](comm::GradientSync& s, int step) {
    auto g = gradient(step, comm.rank(), n);
    comm::SyncBuffers b{nullptr, g.data(), n};
    s.reduce(b, step);
    return g;
  };
  for (int step = 0; step < before; ++step) run(*a, step);
  std::stringstream saved;
  a->save(saved);
  auto b = comm::make_gradient_sync(o, comm, n);
  b->load(saved);
  int64_t differing = 0;
  for (int step = before; step < before + after; ++step) {
    const auto ga = run(*a, step), gb = run(*b, step);
    differing += std::memcmp(ga.data(), gb.data(), n * sizeof(float)) != 0;
  }
  CHECK(differing == 0);
  std::stringstream sa, sb;
  a->save(sa);
  b->save(sb);
  CHECK(sa.str() == sb.str());
}

}  // namespace

TEST_CASE("Resume from state saved during the compressed phase is bitwise identical", "[oktopk][mpi]") {
  Communicator& comm = comm::world();
  const int64_t n = 20011;
  auto ok = options("oktopk", 0.01);
  ok.dense_warmup_steps = 2;
  ok.set("local_threshold_every", 3);
  ok.set("global_threshold_every", 4);
  ok.set("region_every", 5);
  check_resume(ok, n, 6, 9);
  for (const char* method : {"topka", "gaussiank", "gtopk"}) {
    if (std::string(method) == "gtopk" && !is_power_of_two(comm.size())) continue;
    auto o = options(method, 0.01);
    o.dense_warmup_steps = 2;
    INFO(method);
    check_resume(o, n, 4, 4);
  }
}

TEST_CASE("Saved sparse state is checked: another method, another size, another world", "[oktopk][mpi]") {
  Communicator& comm = comm::world();
  auto ok = comm::make_gradient_sync(options("oktopk", 0.01), comm, 1000);
  std::stringstream s1;
  ok->save(s1);
  auto topka = comm::make_gradient_sync(options("topka", 0.01), comm, 1000);
  CHECK_THROWS_WITH(topka->load(s1), Catch::Matchers::Contains("oktopk"));
  std::stringstream s2;
  ok->save(s2);
  auto bigger = comm::make_gradient_sync(options("oktopk", 0.01), comm, 1001);
  CHECK_THROWS_WITH(bigger->load(s2), Catch::Matchers::Contains("1000") && Catch::Matchers::Contains("1001"));
  // A residual cut short.
  const int64_t n = 1000;
  auto stepped = comm::make_gradient_sync(options("oktopk", 0.01), comm, n);
  auto g = gradient(0, comm.rank(), n);
  comm::SyncBuffers b{nullptr, g.data(), n};
  stepped->reduce(b, 0);
  std::stringstream s3;
  stepped->save(s3);
  std::stringstream cut(s3.str().substr(0, s3.str().size() - 100));
  auto again = comm::make_gradient_sync(options("oktopk", 0.01), comm, n);
  CHECK_THROWS_WITH(again->load(cut), Catch::Matchers::Contains("truncated"));
}

TEST_CASE("Dense warmup: the first steps are dense averages, compression starts after", "[oktopk][mpi]") {
  Communicator& comm = comm::world();
  const int64_t n = 5003;
  for (const char* method : {"oktopk", "topka", "gaussiank", "gtopk"}) {
    if (std::string(method) == "gtopk" && !is_power_of_two(comm.size())) continue;
    auto o = options(method, 0.01);
    o.dense_warmup_steps = 3;
    // Exact thresholds: a reused one lets through several times k right after the first
    // compressed step, while the residual grows (this test is about where compression starts).
    testing::set_if_own(o, "local_threshold_every", 1);
    testing::set_if_own(o, "global_threshold_every", 1);
    auto sync = comm::make_gradient_sync(o, comm, n);
    for (int step = 0; step < 5; ++step) {
      auto g = gradient(step, comm.rank(), n);
      std::vector<double> mean(n, 0.0);
      for (int r = 0; r < comm.size(); ++r) {
        const auto gr = gradient(step, r, n);
        for (int64_t i = 0; i < n; ++i) mean[i] += gr[i];
      }
      comm::SyncBuffers b{nullptr, g.data(), n};
      const auto stats = sync->reduce(b, step);
      int64_t nonzero = 0;
      double worst = 0;
      for (int64_t i = 0; i < n; ++i) {
        nonzero += g[i] != 0.f;
        worst = std::max(worst, std::fabs(g[i] - mean[i] / comm.size()));
      }
      INFO(method << " step " << step);
      if (step < 3) {
        CHECK(stats.phase == comm::Phase::kDense);
        CHECK(worst < 1e-5);
      } else {
        CHECK(stats.phase == comm::Phase::kCompressed);
        CHECK(nonzero < n / 10);
      }
    }
  }
}
