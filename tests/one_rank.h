// A local Communicator that plays rank 0 of a world of `size` with no peers: for size 1 that is
// exactly a world of one, and a larger size writes checkpoints whose manifest names that many
// processes (rank 0's file only). Enough for the checkpoint code, which uses only collectives whose
// result for identical contributions is the contribution itself; other calls throw logic_error.
// Shared by checkpoint_test and the checkpoint fuzz target (tests/fuzz).
#pragma once

#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "comm/communicator.h"

namespace trainer::testing {

class OneRank : public comm::Communicator {
 public:
  explicit OneRank(int size) : size_(size) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  int local_size() const override { return 1; }
  int local_rank() const override { return 0; }
  comm::CommLog& log() override { throw std::logic_error("OneRank has no comm log"); }
  // With no peers every reduction of identical contributions is the contribution itself.
  void allreduce(void*, int64_t, comm::DType, comm::ReduceOp, const char*) override {}
  void allgather(const void* send, int64_t count, void* recv, comm::DType type, const char*) override {
    const size_t bytes = static_cast<size_t>(count) * elem(type);
    for (int r = 0; r < size_; ++r) std::memcpy(static_cast<char*>(recv) + r * bytes, send, bytes);
  }
  void allgatherv(const void*, int64_t, void*, const std::vector<int64_t>&, comm::DType, const char*) override {
    unused();
  }
  void alltoall(const void*, int64_t, void*, comm::DType, const char*) override { unused(); }
  void broadcast(void*, int64_t, comm::DType, int, const char*) override {}
  void barrier(const char*) override {}
  std::unique_ptr<comm::Communicator> split(int, int) override { unused(); }
  comm::Request isend(const void*, int64_t, comm::DType, int, int, const char*) override { unused(); }
  comm::Request irecv(void*, int64_t, comm::DType, int, int, const char*) override { unused(); }
  void wait(comm::Request&) override { unused(); }
  comm::Completion wait_completion(comm::Request&) override { unused(); }
  void wait_all(std::vector<comm::Request>&) override { unused(); }
  [[noreturn]] void abort(int code) override { std::exit(code); }

 private:
  int size_;
  static size_t elem(comm::DType t) {
    return t == comm::DType::kU8 ? 1 : (t == comm::DType::kF32 || t == comm::DType::kI32) ? 4 : 8;
  }
  [[noreturn]] static void unused() { throw std::logic_error("checkpoints do not use this call"); }
};

}  // namespace trainer::testing
