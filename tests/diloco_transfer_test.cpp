// Streaming DiLoCo's delayed transfers on their own thread (comm/sync/methods/outer/outer_transfer.h), under
// mpiexec (P = 2 and 3; torchft's values at P = 2 only):
//   - a delayed fragment's allreduce really runs during the steps after its send (it can only finish
//     after rank 0's send step returned: the other ranks join it only then), with torchft's values
//     (tests/fixtures/torchft_diloco.json);
//   - the same bits as the inline transfer (fp32 and int8 outer gradients);
//   - an error on its thread comes back on the training thread.
// MPI_THREAD_MULTIPLE, as the trainer asks for it in such runs.
#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/comm_log.h"
#include "comm/communicator.h"
#include "comm/sync/methods/outer/diloco.h"
#include "diloco_harness.h"

using namespace trainer;
using namespace trainer::testing;
using Catch::Matchers::Contains;

namespace {

// Before main, so before MPI_Init (comm::world() on first use).
const bool kConcurrentCalls = (comm::request_concurrent_calls(), true);

// Ends the process (and so the mpiexec job) with a message when it is not disarmed in time: a
// transfer that blocks its send step deadlocks the gated run below instead of failing it.
class Watchdog {
 public:
  Watchdog(int seconds, const char* what)
      : thread_([this, seconds, what] {
          std::unique_lock<std::mutex> lock(mutex_);
          if (!done_cv_.wait_for(lock, std::chrono::seconds(seconds), [this] { return done_; })) {
            std::fprintf(stderr, "watchdog: %s\n", what);
            std::_Exit(3);
          }
        }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    done_cv_.notify_one();
    thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::thread thread_;
};

// Every rank's world; its split() gives a communicator whose collectives throw (the transfer's).
class FailingSplit final : public comm::Communicator {
 public:
  explicit FailingSplit(bool fail) : base_(comm::world()), fail_(fail) {}
  int rank() const override { return base_.rank(); }
  int size() const override { return base_.size(); }
  int local_size() const override { return base_.local_size(); }
  int local_rank() const override { return base_.local_rank(); }
  comm::CommLog& log() override { return base_.log(); }
  bool concurrent_calls() const override { return true; }
  void allreduce(void* b, int64_t n, comm::DType t, comm::ReduceOp op, const char* tag) override {
    fail(tag);
    base_.allreduce(b, n, t, op, tag);
  }
  void allgather(const void* s, int64_t n, void* r, comm::DType t, const char* tag) override {
    fail(tag);
    base_.allgather(s, n, r, t, tag);
  }
  void allgatherv(const void* s, int64_t n, void* r, const std::vector<int64_t>& c, comm::DType t,
                  const char* tag) override {
    fail(tag);
    base_.allgatherv(s, n, r, c, t, tag);
  }
  void alltoall(const void* s, int64_t n, void* r, comm::DType t, const char* tag) override {
    fail(tag);
    base_.alltoall(s, n, r, t, tag);
  }
  void broadcast(void* b, int64_t n, comm::DType t, int root, const char* tag) override {
    fail(tag);
    base_.broadcast(b, n, t, root, tag);
  }
  void barrier(const char* tag) override { base_.barrier(tag); }
  std::unique_ptr<comm::Communicator> split(int, int) override { return std::make_unique<FailingSplit>(true); }
  comm::Request isend(const void* b, int64_t n, comm::DType t, int p, int c, const char* tag) override {
    return base_.isend(b, n, t, p, c, tag);
  }
  comm::Request irecv(void* b, int64_t n, comm::DType t, int p, int c, const char* tag) override {
    return base_.irecv(b, n, t, p, c, tag);
  }
  void wait(comm::Request& r) override { base_.wait(r); }
  comm::Completion wait_completion(comm::Request& r) override { return base_.wait_completion(r); }
  void wait_all(std::vector<comm::Request>& r) override { base_.wait_all(r); }
  [[noreturn]] void abort(int code) override {
    base_.abort(code);
    std::abort();  // not reached: a call through the vtable is not known to be [[noreturn]]
  }

 private:
  void fail(const char* tag) const {
    if (fail_) throw std::runtime_error(std::string("injected failure in ") + tag);
  }
  comm::Communicator& base_;
  bool fail_;
};

}  // namespace

TEST_CASE("A delayed fragment's allreduce runs during the next steps, with the blocking values",
          "[diloco][mpi][some_world_sizes][P2]") {
  comm::Communicator& comm = comm::world();
  REQUIRE(comm.size() == 2);  // torchft's fixture: 2 replicas
  REQUIRE(comm.concurrent_calls());
  // torchft's delay-1 run with mixing 0.5: H = 6, F = 2 (offsets 3 and 6): fragments go out after
  // inner steps 2, 5, 8, 11, 14 (our steps 1, 4, 7, 10, 13) and land one step later.
  const nlohmann::json* run = nullptr;
  for (const auto& r : torchft_fixture().at("runs"))
    if (r.at("sync_delay") == 1 && r.at("mixing") == 0.5) run = &r;
  REQUIRE(run);
  const auto history = rows(run->at("replicas").at(static_cast<size_t>(comm.rank())).at("history"));
  comm::CommLogOptions log_options;
  log_options.enabled = true;
  log_options.trace_last_step = 1000;  // every call kept in memory, with its step and times
  comm.log().open(log_options, comm.rank(), comm.size());

  // The gate: the other ranks take each step's after_step only once rank 0's has returned. An
  // allreduce that started in rank 0's after_step can then only end after it returned; a blocking
  // one would wait there for the others, which wait for rank 0: the watchdog ends that.
  MockedReplica replica(torchft_options(1, 0.5));
  REQUIRE(replica.diloco().overlapped());
  std::vector<int64_t> called_us, returned_us;  // rank 0: when after_step of each step was called, returned
  {
    Watchdog watchdog(60, "deadlock: the outer allreduce blocked the step that sent it");
    for (const Row& row : history) {
      const int64_t k = static_cast<int64_t>(row[0]);
      replica.record_point();
      INFO("torchft row " << k);
      CHECK(replica.params[0] == row[1]);
      CHECK(replica.params[1] == row[2]);
      if (k + 1 == static_cast<int64_t>(history.size())) break;
      for (float& p : replica.params) p -= 1.f * 2.f;
      int32_t token = 0;
      if (comm.rank() == 0) {
        called_us.push_back(comm.log().now_us());
        replica.sync->after_step(replica.b, replica.steps);
        returned_us.push_back(comm.log().now_us());
        std::vector<comm::Request> sent;
        for (int r = 1; r < comm.size(); ++r) sent.push_back(comm.isend(&token, 1, comm::DType::kI32, r, 7, "GATE"));
        comm.wait_all(sent);
      } else {
        comm::Request got = comm.irecv(&token, 1, comm::DType::kI32, 0, 7, "GATE");
        comm.wait(got);
        replica.sync->after_step(replica.b, replica.steps);
      }
      ++replica.steps;
    }
  }
  replica.sync->complete_in_flight();
  std::vector<int64_t> outer_steps;
  for (const comm::TracedCall& c : comm.log().traced()) {
    if (std::string(c.record.op) != "ALLREDUCE_OUTER") continue;
    outer_steps.push_back(c.record.step);
    CHECK(c.record.bytes == 4);  // one 1x1 weight
    if (comm.rank() == 0) {
      INFO("sent at step " << c.record.step);
      const auto step = static_cast<size_t>(c.record.step);
      CHECK(c.record.t_start_us >= called_us.at(step));  // started by the send ...
      CHECK(c.record.t_end_us > returned_us.at(step));   // ... and still running when it returned
    }
  }
  comm.log().open(comm::CommLogOptions{}, comm.rank(), comm.size());
  CHECK(outer_steps == std::vector<int64_t>{1, 4, 7, 10, 13});
}

TEST_CASE("Overlapped and inline transfers give the same bits, a fragment in flight at the end included",
          "[diloco][mpi]") {
  for (const auto dtype : {comm::OuterDType::kF32, comm::OuterDType::kInt8}) {  // the low-bit sum's calls too
    INFO(comm::outer_dtype_name(dtype));
    comm::SyncOptions o = diloco_options(4, 2, 1, 0.5);
    o.set("outer_dtype", comm::outer_dtype_name(dtype));
    o.overlap = false;
    Trainee inline_(o);
    o.overlap = true;
    Trainee overlapped(o);
    CHECK_FALSE(dynamic_cast<const comm::Diloco&>(*inline_.sync).overlapped());
    CHECK(dynamic_cast<const comm::Diloco&>(*overlapped.sync).overlapped());
    // Fragment 1 goes out after inner step 11 and is in flight when the runs stop.
    inline_.run_to(11);
    overlapped.run_to(11);
    CHECK(same_bits(inline_.state(), overlapped.state()));
    std::stringstream a, b;
    inline_.save(a);
    overlapped.save(b);  // waits for the transfer
    CHECK(a.str() == b.str());
  }
}

TEST_CASE("An error on the transfer's thread comes back on the training thread", "[diloco][mpi]") {
  std::vector<models::ParamView> views{{"a", 0, {1}}, {"b", 1, {1}}};
  std::vector<float> params{1.f, 1.f}, grads{0.f, 0.f};
  comm::SyncBuffers b{params.data(), grads.data(), 2, nullptr, 0, &views};
  FailingSplit comm(false);
  comm::DilocoOptions o;
  o.period = 4;
  o.fragments = 2;
  o.sync_delay = 1;  // fragment 0 goes out after inner step 1 and lands after step 2
  comm::Diloco diloco(comm, models::cpu_backend(), 2, &views, o, 1 << 22, true);
  REQUIRE(diloco.overlapped());
  diloco.reduce(b, 0);
  diloco.after_step(b, 0);  // the send: the error happens on the thread, nothing throws here
  diloco.reduce(b, 1);
  CHECK_THROWS_WITH(diloco.after_step(b, 1), Contains("outer allreduce started at step 0 failed") &&
                                                 Contains("injected failure in ALLREDUCE_OUTER"));
  diloco.complete_in_flight();  // nothing left: no second error, no hang
}
