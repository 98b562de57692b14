// PowerSGD (comm/sync/methods/powersgd/powersgd.h): against the reference of scripts/make_powersgd_fixtures.py
// (NumPy, checked there against PyTorch's DDP powerSGD_hook), the bytes the comm log records
// against the formula, error-feedback conservation, per-bucket exchange against the whole-gradient
// one, rank-deficient and 1 x n matrices, and bit-exact resume. Runs under mpiexec at 1, 2 and 4 ranks; the reference case runs at 2.
#include "comm/sync/methods/powersgd/powersgd.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "comm/comm_log.h"
#include "comm/communicator.h"
#include "comm/sync/methods/dense/dense.h"
#include "comm/sync/gradient_sync.h"
#include "comm/sync/methods/powersgd/low_rank.h"
#include "models/safetensors.h"
#include "tests/conservation.h"

using namespace trainer;
using comm::Communicator;
using models::ParamView;

namespace {

std::vector<ParamView> make_views(const std::vector<std::pair<std::string, models::Shape>>& shapes) {
  std::vector<ParamView> views;
  int64_t offset = 0;
  for (const auto& [name, shape] : shapes) {
    views.push_back({name, offset, shape});
    offset += views.back().numel();
  }
  return views;
}

int64_t total(const std::vector<ParamView>& views) { return views.back().offset + views.back().numel(); }

// A small model's tensors: conv weight, biases, two same-shape linear weights, a 1 x n row, BN.
std::vector<ParamView> tiny_model() {
  return make_views({{"conv.weight", {8, 3, 3, 3}},
                     {"conv.bias", {8}},
                     {"fc1.weight", {12, 30}},
                     {"row.weight", {1, 50}},
                     {"fc2.weight", {12, 30}},
                     {"bn.weight", {12}},
                     {"big.weight", {40, 24}}});
}

std::vector<float> gradient(int64_t step, int rank, int64_t n) {
  return testing::correlated_gradient(n, 500 + step, 9000 + 17 * step + rank);
}

comm::PowerSgd make(const std::vector<ParamView>& views, int64_t rank, double rate, uint64_t seed = 0) {
  return comm::PowerSgd(comm::world(), views, total(views), rank, rate, seed, models::cpu_backend());
}

std::vector<float> step(comm::GradientSync& sync, const std::vector<ParamView>& views, int64_t s) {
  const int64_t n = total(views);
  auto g = gradient(s, comm::world().rank(), n);
  comm::SyncBuffers b{nullptr, g.data(), n, nullptr, 0, &views};
  sync.reduce(b, s);
  return g;
}

// The residual of `sync` laid out like the gradient (zeros on dense tensors).
std::vector<double> residual_by_offset(const comm::PowerSgd& sync, int64_t n) {
  std::vector<double> e(n, 0.0);
  if (sync.residual().empty()) return e;
  for (const auto& m : sync.matrices())
    for (int64_t i = 0; i < m.rows * m.cols; ++i) e[m.offset + i] = sync.residual()[m.e_offset + i];
  return e;
}

}  // namespace

TEST_CASE("PowerSGD at 2 ranks equals the reference of PyTorch's powerSGD_hook",
          "[powersgd][mpi][some_world_sizes][P2]") {
  Communicator& comm = comm::world();
  REQUIRE(comm.size() == 2);  // the reference was made with 2 ranks
  const auto f = models::read_safetensors(std::string(TRAINER_FIXTURES) + "/powersgd_reference.safetensors");
  std::vector<std::pair<std::string, models::Shape>> shapes;
  for (const auto& v : nlohmann::json::parse(f.metadata.at("views")))
    shapes.push_back({v[0].get<std::string>(), v[1].get<models::Shape>()});
  const auto views = make_views(shapes);
  const int64_t n = total(views);
  const int64_t warmup = std::stoll(f.metadata.at("warmup")), steps = std::stoll(f.metadata.at("steps"));
  const auto grads = f.at("grad.rank" + std::to_string(comm.rank())).as_f32();
  REQUIRE(static_cast<int64_t>(grads.size()) == steps * n);
  for (const std::string c : {"r2", "r3"}) {
    SECTION(c) {
      auto sync = make(views, std::stoll(f.metadata.at(c + ".rank")), std::stod(f.metadata.at(c + ".rate")),
                       std::stoull(f.metadata.at("seed")));
      comm::DenseSync dense(comm, n, 25, models::cpu_backend());
      const auto out = f.at(c + ".out").as_f64();
      for (int64_t s = 0; s < steps; ++s) {
        std::vector<float> g(grads.begin() + s * n, grads.begin() + (s + 1) * n);
        comm::SyncBuffers b{nullptr, g.data(), n, nullptr, 0, &views};
        if (s < warmup)
          dense.reduce(b, s);
        else
          sync.reduce(b, s);
        double scale = 0, err = 0;
        for (int64_t i = 0; i < n; ++i) {
          scale = std::max(scale, std::abs(out[s * n + i]));
          err = std::max(err, std::abs(g[i] - out[s * n + i]));
        }
        INFO("case " << c << " step " << s);
        CHECK(err <= 2e-5 * scale);
      }
      const auto want = f.at(c + ".residual.rank" + std::to_string(comm.rank())).as_f64();
      const auto got = residual_by_offset(sync, n);
      double scale = 0, err = 0;
      for (int64_t i = 0; i < n; ++i) {
        scale = std::max(scale, std::abs(want[i]));
        err = std::max(err, std::abs(got[i] - want[i]));
      }
      CHECK(err <= 2e-5 * scale);
    }
  }
}

TEST_CASE("PowerSGD sends sum (n + m) r + dense elements per step, as the comm log records", "[powersgd][mpi]") {
  Communicator& comm = comm::world();
  const auto views = tiny_model();
  for (const int64_t rank : {1, 2, 4}) {
    // Independent of the class: the hook's rule on each tensor, shape[0] x the rest.
    int64_t p_floats = 0, q_floats = 0, dense = 0;
    for (const auto& v : views) {
      const int64_t rows = v.shape[0], cols = v.numel() / rows, r = std::min({rows, cols, rank});
      if ((rows + cols) * r * 2 < rows * cols) {
        p_floats += rows * r;
        q_floats += cols * r;
      } else {
        dense += v.numel();
      }
    }
    // Biases, BN and the 1 x 50 row; at rank 4 the 8 x 27 conv weight too ((8 + 27) 4 2 > 216).
    CHECK(dense == 8 + 50 + 12 + (rank == 4 ? 216 : 0));
    comm::CommLogOptions log;
    log.enabled = true;
    comm.log().open(log, comm.rank(), comm.size());
    auto sync = make(views, rank, 2.0);
    const int steps = 3;
    for (int s = 0; s < steps; ++s) step(sync, views, s);
    int64_t p_bytes = -1, q_bytes = -1, p_calls = 0, q_calls = 0, other = 0;
    for (const auto& op : comm.log().op_stats()) {
      if (op.op == "ALLREDUCE_P") p_bytes = op.bytes, p_calls = op.calls;
      else if (op.op == "ALLREDUCE_Q") q_bytes = op.bytes, q_calls = op.calls;
      else other += op.calls;
    }
    comm.log().open(comm::CommLogOptions{}, comm.rank(), comm.size());
    INFO("rank " << rank);
    CHECK(p_calls == steps);
    CHECK(q_calls == steps);
    CHECK(other == 0);
    CHECK(p_bytes == steps * 4 * p_floats);
    CHECK(q_bytes == steps * 4 * (q_floats + dense));
    CHECK(sync.floats_per_step() == p_floats + q_floats + dense);
  }
}

TEST_CASE("PowerSGD through bf16 and fp16: half the bytes of P and Q, close to fp32 PowerSGD", "[powersgd][mpi]") {
  Communicator& comm = comm::world();
  const auto views = tiny_model();
  const int64_t n = total(views);
  const int steps = 4;
  // Gradients that differ between ranks: a shared part and the rank's own, each from its own
  // distribution object (one shared by two engines would hand the second engine the first one's
  // cached draw).
  const auto rank_gradient = [&](int s) {
    std::mt19937_64 shared(700 + s), own(7000 + 31 * s + comm.rank());
    std::normal_distribution<float> shared_normal, own_normal;
    std::vector<float> g(n);
    for (auto& x : g) x = 0.5f * shared_normal(shared) + own_normal(own);
    return g;
  };
  // One run per format on the same gradients, with the comm log on: its P and Q bytes and outputs.
  struct Run {
    int64_t p_bytes = 0, q_bytes = 0, p_floats = 0, q_and_dense = 0;
    std::vector<std::vector<float>> out;
  };
  const auto run = [&](comm::WireDType wire) {
    comm::PowerSgd sync(comm, views, n, 2, 2.0, 0, models::cpu_backend(), wire);
    comm::CommLogOptions log;
    log.enabled = true;
    comm.log().open(log, comm.rank(), comm.size());
    Run r;
    for (int s = 0; s < steps; ++s) {
      r.out.push_back(rank_gradient(s));
      comm::SyncBuffers b{nullptr, r.out.back().data(), n, nullptr, 0, &views};
      sync.reduce(b, s);
    }
    for (const auto& op : comm.log().op_stats()) {
      if (op.op == "ALLREDUCE_P") r.p_bytes = op.bytes;
      if (op.op == "ALLREDUCE_Q") r.q_bytes = op.bytes;
    }
    comm.log().open(comm::CommLogOptions{}, comm.rank(), comm.size());
    for (const auto& m : sync.matrices()) r.p_floats += m.rows * m.rank, r.q_and_dense += m.cols * m.rank;
    r.q_and_dense += sync.dense_floats();
    return r;
  };
  const Run fp32 = run(comm::WireDType::kF32);
  CHECK(fp32.p_bytes == steps * 4 * fp32.p_floats);
  CHECK(fp32.q_bytes == steps * 4 * fp32.q_and_dense);
  // Relative distance of each step's output to fp32 PowerSGD's: about u (2^-8 bf16, 2^-11 fp16) at
  // the first step, growing to about 3u by the fourth at P = 1, 2, 4 as the runs drift apart
  // through the warm-started Q and the residuals (measured); 8u leaves a margin of over 2, while a
  // wrong scale or a factor sent in the wrong format is off by order 1.
  for (const auto& [wire, tolerance] :
       {std::pair{comm::WireDType::kBF16, 8 * 0x1p-8}, std::pair{comm::WireDType::kF16, 8 * 0x1p-11}}) {
    INFO(comm::wire_dtype_name(wire));
    const Run r = run(wire);
    CHECK(r.p_bytes == steps * 2 * fp32.p_floats);
    CHECK(r.q_bytes == steps * 2 * fp32.q_and_dense);
    double worst = 0, nonzero = 0;
    for (int s = 0; s < steps; ++s) {
      double diff2 = 0, norm2 = 0;
      for (int64_t i = 0; i < n; ++i) {
        diff2 += (double(r.out[s][i]) - fp32.out[s][i]) * (double(r.out[s][i]) - fp32.out[s][i]);
        norm2 += double(fp32.out[s][i]) * fp32.out[s][i];
      }
      worst = std::max(worst, std::sqrt(diff2 / norm2));
      nonzero += diff2;
    }
    INFO("worst relative distance to fp32 PowerSGD: " << worst);
    CHECK(worst < tolerance);
    CHECK(nonzero > 0);  // the wire did round something
    std::vector<float> first = r.out.back();
    comm.broadcast(first.data(), n, comm::DType::kF32, 0, "TEST");
    CHECK(first == r.out.back());
  }
}

TEST_CASE("PowerSGD conserves the gradient: applied x P plus the residuals is the sum of gradients",
          "[powersgd][mpi]") {
  Communicator& comm = comm::world();
  const auto views = tiny_model();
  const int64_t n = total(views);
  auto sync = make(views, 2, 2.0);
  std::vector<double> applied(n, 0.0), grads(n, 0.0);
  const int steps = 6;
  for (int s = 0; s < steps; ++s) {
    const auto g = gradient(s, comm.rank(), n);
    for (int64_t i = 0; i < n; ++i) grads[i] += g[i];
    const auto out = step(sync, views, s);
    for (int64_t i = 0; i < n; ++i) applied[i] += out[i];
  }
  // Every rank applies the same: check, then sum residuals and gradients over ranks.
  std::vector<double> first = applied;
  comm.broadcast(first.data(), n, comm::DType::kF64, 0, "TEST");
  CHECK(first == applied);
  auto e = residual_by_offset(sync, n);
  const testing::Conservation c = testing::conservation(comm, applied, e, grads);
  CHECK(c.worst < 1e-4);
  CHECK(c.residual_norm > 0.1);  // compression did leave something behind (the check is not vacuous)
}

TEST_CASE("PowerSGD per bucket equals whole-gradient PowerSGD: each tensor's factors are its own",
          "[powersgd][mpi]") {
  // Every P and Q is a function of its own tensor, so grouping the tensors into buckets (several
  // allreduces instead of one) changes which message carries an element, not its sum. With at most
  // two ranks a sum is one add either way: bit-identical. With more, MPI may order a sum
  // differently for another message size: equal up to float rounding.
  Communicator& comm = comm::world();
  const auto views = tiny_model();
  const int64_t n = total(views);
  auto whole = make(views, 2, 1.0, 5);
  // ~2 kB buckets, the first ~0.4 kB: the tiny model's 7.8 kB fall into several.
  comm::PowerSgd bucketed(comm, views, n, 2, 1.0, 5, models::cpu_backend(), comm::WireDType::kF32, 0.002,
                          comm::DenseBuckets{0.0004, false, &views});
  REQUIRE(whole.buckets().size() == 1);
  REQUIRE(bucketed.buckets().size() == 3);  // {big}, {bn, fc2, row, fc1}, {conv.bias, conv}
  // The buckets tile the gradient: every element is in one compressed matrix or one dense range.
  std::vector<int> covered(n, 0);
  for (const auto& m : bucketed.matrices())
    for (int64_t i = 0; i < m.rows * m.cols; ++i) ++covered[m.offset + i];
  for (const auto& b : bucketed.buckets())
    for (const auto& r : b.dense)
      for (int64_t i = 0; i < r.count; ++i) ++covered[r.offset + i];
  CHECK(std::all_of(covered.begin(), covered.end(), [](int c) { return c == 1; }));
  CHECK(bucketed.floats_per_step() == whole.floats_per_step());
  for (int s = 0; s < 5; ++s) {
    INFO("step " << s);
    const auto a = step(whole, views, s), b = step(bucketed, views, s);
    if (comm.size() <= 2) {
      CHECK(std::memcmp(a.data(), b.data(), n * sizeof(float)) == 0);
    } else {
      double worst = 0;
      for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(double(a[i]) - b[i]) / (std::abs(a[i]) + 1e-3));
      CHECK(worst < 1e-4);
    }
  }
  std::stringstream saved;
  bucketed.save(saved);
  whole.load(saved);  // the saved Q do not depend on the buckets
  const auto a = step(whole, views, 5), b = step(bucketed, views, 5);
  if (comm.size() <= 2) CHECK(std::memcmp(a.data(), b.data(), n * sizeof(float)) == 0);
}

TEST_CASE("PowerSGD on rank-deficient matrices: exact, finite, nothing left behind", "[powersgd][mpi]") {
  // A rank-1 matrix u v^T (the same on every rank) at rank 2: the second column of P is dependent.
  const auto views = make_views({{"w", {20, 30}}, {"zero", {16, 16}}});
  const int64_t n = total(views);
  auto sync = make(views, 2, 2.0);
  REQUIRE(sync.matrices().size() == 2);
  for (int s = 0; s < 3; ++s) {
    std::vector<float> g(n, 0.f);
    for (int i = 0; i < 20; ++i)
      for (int j = 0; j < 30; ++j) g[i * 30 + j] = std::sin(0.3f * i + s) * std::cos(0.2f * j);
    const auto want = g;
    comm::SyncBuffers b{nullptr, g.data(), n, nullptr, 0, &views};
    sync.reduce(b, s);
    for (int64_t i = 0; i < n; ++i) {
      REQUIRE(std::isfinite(g[i]));
      CHECK(std::abs(g[i] - want[i]) < 1e-5f);
    }
    for (float r : sync.residual()) CHECK(std::abs(r) < 1e-5f);
  }
}

TEST_CASE("Orthonormalization zeroes dependent columns instead of dividing by zero", "[powersgd]") {
  for (const int64_t cols : {2, 3}) {
    // Columns: a, 2a, then (for 3) b independent of a.
    std::vector<float> m(10 * cols);
    for (int i = 0; i < 10; ++i) {
      m[i * cols] = 1.f + i;
      m[i * cols + 1] = 2.f * (1.f + i);
      if (cols == 3) m[i * cols + 2] = (i % 3) - 1.f;
    }
    models::cpu_backend().orthonormalize_columns({{m.data(), 10, cols}});
    double n0 = 0, n1 = 0, n2 = 0, d02 = 0;
    for (int i = 0; i < 10; ++i) {
      n0 += m[i * cols] * m[i * cols];
      n1 += m[i * cols + 1] * m[i * cols + 1];
      if (cols == 3) n2 += m[i * cols + 2] * m[i * cols + 2], d02 += m[i * cols] * m[i * cols + 2];
    }
    CHECK(n0 == Approx(1.0));
    CHECK(n1 == 0.0);
    if (cols == 3) {
      CHECK(n2 == Approx(1.0));
      CHECK(std::abs(d02) < 1e-6);
    }
  }
}

TEST_CASE("PowerSGD on 1 x n tensors: dense at the default rate, exact rank-1 factors at rate 0", "[powersgd][mpi]") {
  Communicator& comm = comm::world();
  const auto views = make_views({{"row", {1, 64}}, {"col", {64}}});
  const int64_t n = total(views);
  auto by_default = make(views, 2, 2.0);
  CHECK(by_default.matrices().empty());
  CHECK(by_default.dense_floats() == n);
  auto compressed = make(views, 2, 0.0);  // everything compressed, r' = min(1, 64, 2) = 1
  REQUIRE(compressed.matrices().size() == 2);
  for (int s = 0; s < 3; ++s) {
    auto mean = gradient(s, comm.rank(), n);
    comm.allreduce(mean.data(), n, comm::DType::kF32, comm::ReduceOp::kSum, "TEST");
    const auto a = step(by_default, views, s);
    const auto b = step(compressed, views, s);
    for (int64_t i = 0; i < n; ++i) {
      CHECK(a[i] == Approx(mean[i] / comm.size()).margin(1e-6));
      CHECK(b[i] == Approx(mean[i] / comm.size()).margin(1e-5));
    }
  }
}

TEST_CASE("PowerSGD resumes bit for bit from its saved state", "[powersgd][mpi]") {
  const auto views = tiny_model();
  comm::SyncOptions o;
  o.method = "powersgd";
  o.dense_warmup_steps = 2;
  o.set("rank", 3);
  o.recipe.seed = 11;
  Communicator& comm = comm::world();
  const int64_t n = total(views);
  auto straight = comm::make_gradient_sync(o, comm, n, &views);
  std::vector<float> want;
  for (int s = 0; s < 7; ++s) want = step(*straight, views, s);
  for (const int stop : {1, 4}) {  // during the warmup (nothing started) and after compression started
    auto first = comm::make_gradient_sync(o, comm, n, &views);
    for (int s = 0; s < stop; ++s) step(*first, views, s);
    std::stringstream state;
    first->save(state);
    first.reset();
    auto resumed = comm::make_gradient_sync(o, comm, n, &views);
    resumed->load(state);
    std::vector<float> got;
    for (int s = stop; s < 7; ++s) got = step(*resumed, views, s);
    CHECK(std::memcmp(got.data(), want.data(), n * sizeof(float)) == 0);
  }
  std::stringstream state;
  straight->save(state);
  comm::SyncOptions other = o;
  other.set("rank", 2);
  auto wrong = comm::make_gradient_sync(other, comm, n, &views);
  CHECK_THROWS_WITH(wrong->load(state), Catch::Matchers::Contains("rank"));
}

TEST_CASE("Every sync method name builds; powersgd needs the model's tensors", "[powersgd]") {
  const auto views = tiny_model();
  for (const auto& name : comm::sync_method_names()) {
    comm::SyncOptions o;
    o.method = name;
    CHECK_NOTHROW(comm::make_gradient_sync(o, comm::world(), total(views), &views));
  }
  comm::SyncOptions o;
  o.method = "powersgd";
  CHECK_THROWS_WITH(comm::make_gradient_sync(o, comm::world(), total(views)),
                    Catch::Matchers::Contains("tensor shapes"));
}
