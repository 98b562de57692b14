// The sum over ranks through a low-bit format (comm/quantized_allreduce.h), under mpiexec at
// P = 1, 2, 3, 4, for every format and for sizes that divide by neither the block nor P, smaller
// than P, and exact multiples: the result
//   - equals, bit for bit, a simulation of the definition written here from the scalar conversions
//     (each rank's block quantized, fp32 fma sum in rank order, quantized again), element by
//     element with no chunks, so the chunked alltoall/allgather path and its array loops are
//     checked against the scalar definitions;
//   - is within the header's bound of the float64 sum of every rank's input (and not far inside it:
//     the format's rounding is really there);
//   - is the same bytes on every rank;
// the comm log records the bytes quantized_volume computes (elements, scales and padding) under the
// caller's tag; zero blocks come back exactly zero; a NaN or Inf on one rank turns its block into
// NaN on every rank and leaves the other blocks alone.
#include <catch2/catch.hpp>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "rank_agreement.h"
#include "comm/comm_log.h"
#include "comm/communicator.h"
#include "comm/quantized_allreduce.h"
#include "comm/wire_format.h"

using namespace trainer;
using comm::OuterDType;

namespace {

constexpr int64_t B = comm::kQuantBlock;
const OuterDType kLowBit[] = {OuterDType::kBF16, OuterDType::kFP8, OuterDType::kInt8};

// Rank r's input: blocks at magnitudes spread over eight decades (10^-6 .. 10^2, like tensors of
// different scales), half of them also spread over four decades within the block, signs mixed
// between ranks so sums cancel; block 2 zero on every rank, block 3 zero on rank 0 only, block 4
// tiny (1e-37: flushed to zero by fp8/int8) on rank 1.
std::vector<float> rank_input(int rank, int64_t n) {
  std::mt19937_64 rng(1234 + rank);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> decade(-2.f, 2.f);
  std::vector<float> x(n);
  for (int64_t begin = 0; begin < n; begin += B) {
    const int64_t block = begin / B;
    std::mt19937_64 block_rng(99 + block);  // the same magnitude on every rank, as a tensor's
    const float magnitude = std::pow(10.f, std::uniform_real_distribution<float>(-6.f, 2.f)(block_rng));
    const bool spread = block % 2 == 1;
    for (int64_t i = begin; i < std::min(n, begin + B); ++i)
      x[i] = normal(rng) * magnitude * (spread ? std::pow(10.f, decade(rng)) : 1.f);
  }
  auto fill = [&](int64_t block, float v) {
    for (int64_t i = block * B; i < std::min(n, (block + 1) * B); ++i) x[i] = v * static_cast<float>(i % 7 - 3);
  };
  fill(2, 0.f);
  if (rank == 0) fill(3, 0.f);
  if (rank == 1) fill(4, 1e-37f);
  return x;
}

std::vector<std::vector<float>> all_inputs(int p, int64_t n) {
  std::vector<std::vector<float>> all;
  for (int r = 0; r < p; ++r) all.push_back(rank_input(r, n));
  return all;
}

// One quantization of a block of `count` values (count <= B; the rest count as zeros) from the
// scalar definitions: the decoded codes and the scale.
struct Quantized {
  float decoded[B] = {};
  float scale = 1;
};

Quantized quantize(OuterDType d, const float* x, int64_t count) {
  Quantized q;
  if (d == OuterDType::kBF16) {
    for (int64_t i = 0; i < count; ++i) q.decoded[i] = comm::bf16_to_float(comm::float_to_bf16(x[i]));
    return q;
  }
  float max_abs = 0;
  for (int64_t i = 0; i < count; ++i) max_abs = std::isfinite(x[i]) ? std::max(max_abs, std::fabs(x[i])) : INFINITY;
  const comm::BlockScale s = comm::block_scale(d, max_abs);
  q.scale = s.scale;
  for (int64_t i = 0; i < count; ++i)
    q.decoded[i] = d == OuterDType::kFP8 ? comm::e4m3_to_float(comm::float_to_e4m3(x[i] * s.inverse))
                                         : static_cast<float>(comm::float_to_int8(x[i] * s.inverse));
  return q;
}

// The definition, block by block, without chunks or communication.
std::vector<float> simulate(OuterDType d, const std::vector<std::vector<float>>& all, int64_t n) {
  std::vector<float> out(n);
  for (int64_t begin = 0; begin < n; begin += B) {
    const int64_t count = std::min(B, n - begin);
    float acc[B] = {};
    for (const auto& x : all) {
      const Quantized q = quantize(d, x.data() + begin, count);
      for (int64_t i = 0; i < B; ++i) acc[i] = std::fma(q.decoded[i], q.scale, acc[i]);
    }
    const Quantized q = quantize(d, acc, B);  // the padding's sums (zeros) are part of the block
    for (int64_t i = 0; i < count; ++i) out[begin + i] = q.decoded[i] * q.scale;
  }
  return out;
}

// The header's bound for one element: delta M + gamma_P (1 + delta) M + delta (1 + gamma_P)(1 + delta) M
// + (P + 1) tau, with M the sum over ranks of each rank's block max.
struct FormatBound {
  double delta, tau;
};

FormatBound format_bound(OuterDType d) {
  switch (d) {
    case OuterDType::kBF16: return {std::ldexp(1.0, -8), std::ldexp(1.0, -134)};
    case OuterDType::kFP8: return {16.0 / 448 + std::ldexp(1.0, -21), 448 * std::ldexp(1.0, -126)};
    case OuterDType::kInt8: return {0.5 / 127 + std::ldexp(1.0, -21), 127 * std::ldexp(1.0, -126)};
    case OuterDType::kF32: break;
  }
  return {0, 0};
}

struct Deviation {
  double worst_ratio = 0;  // max over elements of |result - exact| / bound
  int64_t not_finite = 0;
};

Deviation compare_with_exact(OuterDType d, const std::vector<float>& result,
                             const std::vector<std::vector<float>>& all, int64_t n) {
  const int p = static_cast<int>(all.size());
  const double u = std::ldexp(1.0, -24);
  const double gamma_p = p * u / (1 - p * u), gamma_p1 = (p - 1) * u / (1 - (p - 1) * u);
  const FormatBound f = format_bound(d);
  Deviation dev;
  for (int64_t begin = 0; begin < n; begin += B) {
    const int64_t end = std::min(n, begin + B);
    double m = 0;  // sum over ranks of the rank's block max
    for (const auto& x : all) {
      double block_max = 0;
      for (int64_t i = begin; i < end; ++i) block_max = std::max(block_max, std::fabs(static_cast<double>(x[i])));
      m += block_max;
    }
    for (int64_t i = begin; i < end; ++i) {
      double exact = 0, magnitude = 0;
      for (const auto& x : all) {
        exact += x[i];  // within 2^-52 of the exact sum: nothing next to any bound here
        magnitude += std::fabs(x[i]);
      }
      if (!std::isfinite(result[i])) {
        ++dev.not_finite;
        continue;
      }
      const double bound = d == OuterDType::kF32
                               ? gamma_p1 * magnitude
                               : f.delta * m + gamma_p * (1 + f.delta) * m + f.delta * (1 + gamma_p) * (1 + f.delta) * m +
                                     (p + 1) * f.tau;
      const double error = std::fabs(result[i] - exact);
      if (error > 0) dev.worst_ratio = std::max(dev.worst_ratio, bound > 0 ? error / bound : INFINITY);
    }
  }
  return dev;
}

bool same_bits_or_both_nan(float a, float b) {
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y || (std::isnan(a) && std::isnan(b));
}

struct Logged {
  int64_t calls = 0, bytes = 0, bytes_recv = 0, other_calls = 0;
};

// Runs `run` with the log enabled and returns what it recorded under `tag`.
template <class Run>
Logged logged(comm::Communicator& comm, const char* tag, Run run) {
  comm::CommLogOptions options;
  options.enabled = true;
  comm.log().open(options, comm.rank(), comm.size());
  run();
  Logged l;
  for (const auto& op : comm.log().op_stats()) {
    if (op.op == tag) l.calls = op.calls, l.bytes = op.bytes, l.bytes_recv = op.bytes_recv;
    else l.other_calls += op.calls;
  }
  comm.log().open(comm::CommLogOptions{}, comm.rank(), comm.size());
  return l;
}

using trainer::testing::identical_on_all_ranks;

}  // namespace

TEST_CASE("Low-bit sums: the definition bit for bit, within the bound of the float64 sum, the same on every rank",
          "[quant][mpi]") {
  comm::Communicator& comm = comm::world();
  const int p = comm.size();
  comm::QuantizedScratch scratch;  // reused across sizes and formats, as a caller would
  // Not a multiple of the block or of P; one element; fewer than P; exact multiples of the block
  // and of P blocks; a size whose last chunks are padding only.
  for (const int64_t n : {int64_t(100003), int64_t(1), int64_t(3), B, B * p * 3, B * 5 + 1}) {
    const auto all = all_inputs(p, n);
    for (const OuterDType d : {OuterDType::kF32, OuterDType::kBF16, OuterDType::kFP8, OuterDType::kInt8}) {
      INFO(comm::outer_dtype_name(d) << ", n = " << n << ", P = " << p);
      std::vector<float> x = all[comm.rank()];
      const Logged log = logged(comm, "ALLREDUCE_OUTER",
                                [&] { comm::allreduce_sum_quantized(comm, x.data(), n, d, scratch, "ALLREDUCE_OUTER"); });
      // The bytes are what the format says: elements, scales and padding, as quantized_volume has them.
      const comm::QuantizedVolume v = comm::quantized_volume(d, n, p);
      CHECK(log.calls == (d == OuterDType::kF32 ? 1 : 2));
      CHECK(log.other_calls == 0);
      CHECK(log.bytes == v.bytes_sent);
      CHECK(log.bytes_recv == v.bytes_received);
      if (d != OuterDType::kF32) {
        CHECK(v.chunk_bytes == v.chunk_blocks * (comm::outer_scale_bytes(d) + B * comm::outer_element_bytes(d)));
        CHECK(v.bytes_sent == p * v.chunk_bytes);
        CHECK(v.chunk_blocks * p * B >= n);
        CHECK((v.chunk_blocks - 1) * p * B < n);  // no chunk longer than it must be
      }
      CHECK(identical_on_all_ranks(comm, x));
      const Deviation dev = compare_with_exact(d, x, all, n);
      INFO("worst |result - exact| in units of the bound: " << dev.worst_ratio);
      CHECK(dev.not_finite == 0);
      CHECK(dev.worst_ratio <= 1);
      // Zero blocks come back exactly zero.
      int64_t nonzero = 0;
      for (int64_t i = 2 * B; i < std::min(n, 3 * B); ++i) nonzero += x[i] != 0.f;
      CHECK(nonzero == 0);
      if (d == OuterDType::kF32) continue;
      const std::vector<float> want = simulate(d, all, n);
      int64_t differ = 0, first = -1;
      for (int64_t i = 0; i < n; ++i)
        if (!same_bits_or_both_nan(x[i], want[i])) differ += 1, first = first < 0 ? i : first;
      INFO("first element that differs from the definition: " << first);
      CHECK(differ == 0);
      // The rounding is the format's, not fp32's: on the large input the worst element uses a good
      // part of the bound (about half of it is the first rounding alone, in the worst case).
      if (n == 100003) CHECK(dev.worst_ratio > 0.1);
    }
  }
}

TEST_CASE("Low-bit sums: a NaN or Inf on one rank makes its block NaN on every rank, nothing else", "[quant][mpi]") {
  comm::Communicator& comm = comm::world();
  const int p = comm.size();
  const int64_t n = 20 * B + 17;
  auto all = all_inputs(p, n);
  const int64_t nan_at = 5 * B + 3, inf_at = 11 * B + 200;
  all[p - 1][nan_at] = NAN;        // the last rank's NaN ...
  all[0][inf_at] = -INFINITY;      // ... and rank 0's Inf
  comm::QuantizedScratch scratch;
  for (const OuterDType d : kLowBit) {
    INFO(comm::outer_dtype_name(d) << " at P = " << p);
    std::vector<float> x = all[comm.rank()];
    comm::allreduce_sum_quantized(comm, x.data(), n, d, scratch, "ALLREDUCE_OUTER");
    CHECK(identical_on_all_ranks(comm, x));
    CHECK(std::isnan(x[nan_at]));
    int64_t nan_elsewhere = 0, nan_in_blocks = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t block = i / B;
      if (block == 5 || block == 11) nan_in_blocks += std::isnan(x[i]);
      else nan_elsewhere += !std::isfinite(x[i]);
    }
    CHECK(nan_elsewhere == 0);
    if (d == OuterDType::kBF16) {
      // No scales: NaN and Inf stay per element, as wire_format's conversions keep them.
      CHECK(std::isinf(x[inf_at]));
      CHECK(x[inf_at] < 0);
      CHECK(nan_in_blocks == 1);
    } else {
      CHECK(nan_in_blocks == 2 * B);  // both whole blocks
    }
    // The other blocks still agree with the definition, bit for bit.
    const std::vector<float> want = simulate(d, all, n);
    int64_t differ = 0;
    for (int64_t i = 0; i < n; ++i) differ += !same_bits_or_both_nan(x[i], want[i]);
    CHECK(differ == 0);
  }
}

TEST_CASE("Low-bit sums: n = 0 makes no call; a negative count is refused", "[quant][mpi]") {
  comm::Communicator& comm = comm::world();
  comm::QuantizedScratch scratch;
  const Logged log = logged(comm, "ALLREDUCE_OUTER", [&] {
    for (const OuterDType d : kLowBit) comm::allreduce_sum_quantized(comm, nullptr, 0, d, scratch, "ALLREDUCE_OUTER");
  });
  CHECK(log.calls == 0);
  float x = 1;
  CHECK_THROWS_AS(comm::allreduce_sum_quantized(comm, &x, -1, OuterDType::kFP8, scratch, "ALLREDUCE_OUTER"),
                  std::invalid_argument);
}

TEST_CASE("Low-bit sums: the same bytes when the communicator cuts messages into small pieces", "[quant][mpi]") {
  // Messages over 2^30 bytes are cut into pieces (MPI's int counts); lowering the piece size runs
  // those paths of the alltoall and the allgather on a small buffer.
  comm::Communicator& comm = comm::world();
  const int64_t n = 50021;
  const auto all = all_inputs(comm.size(), n);
  comm::QuantizedScratch scratch;
  for (const OuterDType d : kLowBit) {
    INFO(comm::outer_dtype_name(d));
    std::vector<float> whole = all[comm.rank()], pieces = whole;
    comm::allreduce_sum_quantized(comm, whole.data(), n, d, scratch, "ALLREDUCE_OUTER");
    const int64_t previous = comm::set_message_piece_bytes(1000);
    comm::allreduce_sum_quantized(comm, pieces.data(), n, d, scratch, "ALLREDUCE_OUTER");
    comm::set_message_piece_bytes(previous);
    CHECK(std::memcmp(whole.data(), pieces.data(), n * sizeof(float)) == 0);
  }
}
