// Error feedback's conservation law, checked across ranks: what every rank applied (the same on
// all of them, P times over) plus every rank's residual equals the sum of all gradients. Shared by
// the tests of the compressors that keep a residual.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "comm/communicator.h"

namespace trainer::testing {

// A rank's synthetic gradient of n entries: 0.5 x a normal vector drawn from shared_seed (the same
// on every rank that passes the same seed) plus one drawn from own_seed (the rank's own), so ranks'
// gradients are correlated as real ones are.
inline std::vector<float> correlated_gradient(int64_t n, uint64_t shared_seed, uint64_t own_seed) {
  std::mt19937_64 shared(shared_seed), own(own_seed);
  // One distribution per engine: libstdc++'s normal_distribution draws its values in pairs and
  // keeps the second for the next call, so a distribution shared by the two engines handed the
  // shared engine's values out as the rank's own ones (every rank's gradient was the same).
  std::normal_distribution<float> shared_normal, own_normal;
  std::vector<float> g(static_cast<size_t>(n));
  for (auto& x : g) x = 0.5f * shared_normal(shared) + own_normal(own);
  return g;
}

struct Conservation {
  double worst = 0;          // max |P x applied + sum of residuals - sum of gradients|
  double residual_norm = 0;  // max |sum of residuals|: > 0 shows the compression was lossy
};

// Collective. applied: what this rank applied, summed over steps; residual: its residual now;
// grads: its gradients summed over steps. residual and grads are summed over ranks in place.
inline Conservation conservation(comm::Communicator& comm, const std::vector<double>& applied,
                                 std::vector<double>& residual, std::vector<double>& grads) {
  const auto n = static_cast<int64_t>(applied.size());
  comm.allreduce(residual.data(), n, comm::DType::kF64, comm::ReduceOp::kSum, "TEST");
  comm.allreduce(grads.data(), n, comm::DType::kF64, comm::ReduceOp::kSum, "TEST");
  Conservation c;
  for (int64_t i = 0; i < n; ++i) {
    c.worst = std::max(c.worst, std::abs(applied[i] * comm.size() + residual[i] - grads[i]));
    c.residual_norm = std::max(c.residual_norm, std::abs(residual[i]));
  }
  return c;
}

}  // namespace trainer::testing
