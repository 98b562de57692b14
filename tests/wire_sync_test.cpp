// Dense gradient sync through the 16-bit wire formats (sync.wire_dtype; comm/wire_format.h), under
// mpiexec at P = 2, 3, 4: the synced gradient against the float64 mean of every rank's gradient,
// within the bound the format allows; identical on every rank; fp16's division before the cast
// keeping a sum beyond 65504 finite; the comm log recording 2 bytes per element; and the dense
// warmup of another method going through the wire while local SGD's parameter averaging does not.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "rank_agreement.h"
#include "comm/comm_log.h"
#include "comm/communicator.h"
#include "comm/sync/gradient_sync.h"
#include "comm/wire_format.h"
#include "tests/method_keys.h"

using namespace trainer;
using comm::WireDType;

namespace {

// Rank r's gradient: magnitudes spread over six decades (1e-3 to 1e3 times a normal draw), with
// signs that differ between ranks so sums cancel, and a stretch of tiny values that land in fp16's
// subnormal range once divided by P.
std::vector<float> rank_gradient(int rank, int64_t n) {
  std::mt19937_64 rng(77 + rank);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> decade(-3.f, 3.f);
  std::vector<float> g(n);
  for (int64_t i = 0; i < n; ++i) g[i] = normal(rng) * std::pow(10.f, decade(rng));
  for (int64_t i = 0; i < n / 20; ++i) g[i] = normal(rng) * 1e-5f;
  return g;
}

struct WireBound {
  double u;         // unit roundoff: 2^-8 (bf16), 2^-11 (fp16)
  double half_min;  // half the smallest subnormal step: the absolute error of a rounding there
};

WireBound bound_of(WireDType wire) {
  return wire == WireDType::kBF16 ? WireBound{std::ldexp(1.0, -8), std::ldexp(1.0, -134)}
                                  : WireBound{std::ldexp(1.0, -11), std::ldexp(1.0, -25)};
}

// How a synced average compares with the exact one (float64 over every rank's float32 gradient).
struct Deviation {
  double worst_ratio = 0;  // max over elements of |synced - exact mean| / bound
  int64_t not_finite = 0;
};

// The bound for one element of the average of P values x_r through a 16-bit wire. The element sees
// at most k = P roundings to the format: the cast of its own value and one per add of the
// reduction (up to P - 1; the widening back is exact). By Higham's argument for recursive
// summation in any order, |fl - sum| <= gamma_k sum |x_r| with gamma_k = k u / (1 - k u), plus,
// for roundings in the subnormal range, k times half a subnormal step. The average's own scaling
// (1/P in fp32, before the cast for fp16 or after the sum for bf16: the float 1/P and the product,
// two fp32 roundings) adds 2^-23 relative; 2^-22 is taken.
double element_bound(WireDType wire, int p, double magnitude_sum) {
  const WireBound b = bound_of(wire);
  const double gamma = p * b.u / (1 - p * b.u);
  // fp16's values are divided by P before rounding, bf16's after: the absolute term is per value
  // on the wire, so bf16's shrinks by P with the division.
  const double absolute = wire == WireDType::kF16 ? p * b.half_min : b.half_min;
  return (gamma + std::ldexp(1.0, -22)) * magnitude_sum / p + absolute;
}

Deviation compare_with_exact(WireDType wire, const std::vector<float>& synced, int p, int64_t n,
                             const std::vector<std::vector<float>>& all) {
  Deviation d;
  for (int64_t i = 0; i < n; ++i) {
    double sum = 0, magnitude = 0;
    for (int r = 0; r < p; ++r) {
      sum += all[r][i];  // exact: P <= 4 float32 values fit the double's 53 bits at these ranges
      magnitude += std::fabs(all[r][i]);
    }
    if (!std::isfinite(synced[i])) {
      ++d.not_finite;
      continue;
    }
    const double error = std::fabs(synced[i] - sum / p);
    d.worst_ratio = std::max(d.worst_ratio, error / element_bound(wire, p, magnitude));
  }
  return d;
}

using trainer::testing::identical_on_all_ranks;

// Bytes and calls the log recorded per op tag during `run`.
struct Logged {
  int64_t dense_bytes = 0, dense_calls = 0, params_bytes = 0, params_calls = 0;
};

template <class Run>
Logged logged(comm::Communicator& comm, Run run) {
  comm::CommLogOptions options;
  options.enabled = true;
  comm.log().open(options, comm.rank(), comm.size());
  run();
  Logged l;
  for (const auto& op : comm.log().op_stats()) {
    if (op.op == "ALLREDUCE_DENSE") l.dense_bytes = op.bytes, l.dense_calls = op.calls;
    if (op.op == "ALLREDUCE_PARAMS") l.params_bytes = op.bytes, l.params_calls = op.calls;
  }
  comm.log().open(comm::CommLogOptions{}, comm.rank(), comm.size());
  return l;
}

comm::SyncOptions options(const std::string& method, int64_t warmup, double bucket_mb, int64_t period,
                          WireDType wire) {
  comm::SyncOptions o;
  o.method = method;
  o.dense_warmup_steps = warmup;
  o.bucket_mb = bucket_mb;
  testing::set_if_own(o, "period", period);
  o.wire_dtype = comm::wire_dtype_name(wire);
  return o;
}

}  // namespace

TEST_CASE("Dense sync through bf16 and fp16: the float64 mean within the format's rounding bound", "[wire][mpi]") {
  comm::Communicator& comm = comm::world();
  const int p = comm.size();
  const int64_t n = 100003;  // 0.1 MB buckets: 25,000 floats, so four whole buckets and a short one
  std::vector<std::vector<float>> all;
  for (int r = 0; r < p; ++r) all.push_back(rank_gradient(r, n));
  for (const WireDType wire : {WireDType::kBF16, WireDType::kF16}) {
    INFO(comm::wire_dtype_name(wire) << " at P = " << p);
    auto sync = comm::make_gradient_sync(options("dense", 0, 0.1, 1, wire), comm, n);
    std::vector<float> g = all[comm.rank()];
    comm::SyncBuffers b{nullptr, g.data(), n, nullptr, 0, nullptr};
    const Logged log = logged(comm, [&] { sync->reduce(b, 0); });
    const Deviation d = compare_with_exact(wire, g, p, n, all);
    INFO("worst |synced - exact mean| in units of the bound: " << d.worst_ratio);
    CHECK(d.not_finite == 0);
    CHECK(d.worst_ratio <= 1);
    // The rounding is the format's, not fp32's: the worst element is within an order of magnitude
    // of the bound (fp32 would be ~2^-16 of it).
    CHECK(d.worst_ratio > 0.1);
    CHECK(identical_on_all_ranks(comm, g));
    CHECK(log.dense_calls == 5);
    CHECK(log.dense_bytes == 2 * n);  // what went out: 2 bytes per element
  }
  // fp32 through the same code: 4 bytes per element, and the float32 result.
  auto sync = comm::make_gradient_sync(options("dense", 0, 0.1, 1, WireDType::kF32), comm, n);
  std::vector<float> g = all[comm.rank()];
  comm::SyncBuffers b{nullptr, g.data(), n, nullptr, 0, nullptr};
  const Logged log = logged(comm, [&] { sync->reduce(b, 0); });
  CHECK(log.dense_bytes == 4 * n);
}

TEST_CASE("fp16 divides by P before its cast: a sum beyond 65504 whose mean is below stays finite", "[wire][mpi]") {
  comm::Communicator& comm = comm::world();
  const int p = comm.size();
  const int64_t n = 1000;
  std::vector<std::vector<float>> all;
  for (int r = 0; r < p; ++r) {
    std::vector<float> x(n);
    for (int64_t i = 0; i < n; ++i) x[i] = 40000.f + 10.f * static_cast<float>((i * 7 + r * 13) % 1000);
    all.push_back(x);  // every sum over ranks is at least 80,000: Inf in fp16
  }
  auto sync = comm::make_gradient_sync(options("dense", 0, 25, 1, WireDType::kF16), comm, n);
  std::vector<float> g = all[comm.rank()];
  comm::SyncBuffers b{nullptr, g.data(), n, nullptr, 0, nullptr};
  sync->reduce(b, 0);
  const Deviation d = compare_with_exact(WireDType::kF16, g, p, n, all);
  CHECK(d.not_finite == 0);
  CHECK(d.worst_ratio <= 1);
}

TEST_CASE("The dense warmup goes through the wire; local SGD's parameter averaging stays fp32", "[wire][mpi]") {
  comm::Communicator& comm = comm::world();
  const int64_t n = 4096, n_state = 64;
  std::vector<float> params(n), grads(n), state(n_state);
  for (int64_t i = 0; i < n; ++i) params[i] = 0.001f * static_cast<float>(i) + 1e-7f * static_cast<float>(comm.rank());
  for (int64_t i = 0; i < n_state; ++i) state[i] = 0.5f + static_cast<float>(comm.rank());
  comm::SyncBuffers b{params.data(), grads.data(), n, state.data(), n_state, nullptr};
  // One warmup step (dense, through bf16), then local SGD averaging parameters after every step.
  auto sync = comm::make_gradient_sync(options("local_sgd", 1, 25, 1, WireDType::kBF16), comm, n);
  const Logged warmup = logged(comm, [&] {
    for (int64_t i = 0; i < n; ++i) grads[i] = 1.f + static_cast<float>(comm.rank());
    sync->reduce(b, 0);
    sync->after_step(b, 0);
  });
  CHECK(warmup.dense_calls == 1);
  CHECK(warmup.dense_bytes == 2 * n);
  CHECK(warmup.params_calls == 0);
  const Logged local = logged(comm, [&] {
    sync->reduce(b, 1);
    sync->after_step(b, 1);
  });
  CHECK(local.dense_calls == 0);
  CHECK(local.params_bytes == 4 * (n + n_state));
  // The parameters were averaged in fp32: the per-rank offsets of 1e-7 (far below bf16's step at
  // these magnitudes) survive as their exact fp32 mean.
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    double mean = 0;
    for (int r = 0; r < comm.size(); ++r)
      mean += static_cast<double>(0.001f * static_cast<float>(i) + 1e-7f * static_cast<float>(r));
    mean /= comm.size();
    worst = std::max(worst, std::fabs(params[i] - mean) / std::max(1e-30, std::fabs(mean)));
  }
  CHECK(worst < 1e-6);
}

TEST_CASE("An unknown wire format name lists the choices", "[wire]") {
  CHECK_THROWS_WITH(comm::parse_wire_dtype("fp8"), Catch::Matchers::Contains("sync.wire_dtype") &&
                                                       Catch::Matchers::Contains("fp32, bf16, fp16"));
}
