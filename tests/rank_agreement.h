// Whether every rank of a test holds the same bytes: the property synchronous data parallelism
// promises after each step.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "comm/communicator.h"

namespace trainer::testing {

// True when every rank holds bytewise the same vector (collective).
inline bool identical_on_all_ranks(comm::Communicator& comm, const std::vector<float>& v) {
  std::vector<float> root = v;
  comm.broadcast(root.data(), static_cast<int64_t>(root.size()), comm::DType::kF32, 0, "TEST");
  int32_t same = std::memcmp(root.data(), v.data(), v.size() * sizeof(float)) == 0;
  comm.allreduce(&same, 1, comm::DType::kI32, comm::ReduceOp::kMin, "TEST");
  return same == 1;
}

}  // namespace trainer::testing
