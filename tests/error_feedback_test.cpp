// Error feedback as one wrapper (comm/sync/wrappers/error_feedback_sync.h), under mpiexec with P = 1 and 2:
// a third compressor written here in a few lines (EF-SignSGD's scaled sign, a dense approximation)
// gets its residual, conservation and resume from the base alone; the step handle refuses calls
// out of order; a failed load leaves a method exactly as it was.
#include "comm/sync/wrappers/error_feedback_sync.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <stdexcept>

#include "comm/communicator.h"
#include "comm/sync/gradient_sync.h"
#include "comm/sync/sync_state.h"
#include "tests/conservation.h"

using namespace trainer;
using comm::Communicator;

namespace {

std::vector<float> gradient(int64_t step, int rank, int64_t n) {
  return testing::correlated_gradient(n, 300 + step, 4000 + 7 * step + rank);
}

// EF-SignSGD's compressor (Karimireddy et al. 2019): c = mean|acc| x sign(acc), one float per
// entry exchanged here by an allreduce of c (a real one would send bits). It only forms acc, sends
// and reports the approximation: residual, its save/load and the order are the base's.
class ScaledSign final : public comm::ErrorFeedbackSync {
 public:
  ScaledSign(Communicator& comm, int64_t n) : ErrorFeedbackSync(n), comm_(comm), n_(n), c_(n) {}
  std::string name() const override { return "scaled_sign"; }
  std::string describe() const override { return "scaled sign"; }

 private:
  comm::SyncStats compress(comm::SyncBuffers& b, int64_t, comm::ErrorFeedback::Step& ef) override {
    const float* acc = ef.materialize(0, n_);
    double l1 = 0;
    for (int64_t i = 0; i < n_; ++i) l1 += std::fabs(acc[i]);
    const auto scale = static_cast<float>(l1 / n_);
    for (int64_t i = 0; i < n_; ++i) c_[i] = acc[i] > 0 ? scale : (acc[i] < 0 ? -scale : 0.f);
    ef.sent_approximately(0, c_.data(), n_);
    std::memcpy(b.grads, c_.data(), n_ * sizeof(float));
    comm_.allreduce(b.grads, n_, comm::DType::kF32, comm::ReduceOp::kSum, "TEST");
    for (int64_t i = 0; i < n_; ++i) b.grads[i] /= static_cast<float>(comm_.size());
    ++steps_;
    return {comm::Phase::kCompressed, 1.0};
  }
  void save_state(std::ostream& out) const override {
    comm::write_sync_header(out, "scaled_sign", 1);
    comm::write_pod(out, steps_);
  }
  void load_state(std::istream& in) override {
    comm::read_sync_header(in, "scaled_sign", 1);
    const auto steps = comm::read_pod<int64_t>(in);
    if (!in) throw std::runtime_error("scaled_sign state: truncated");
    steps_ = steps;
  }

  Communicator& comm_;
  int64_t n_;
  std::vector<float> c_;
  int64_t steps_ = 0;
};

// A compressor that breaks the order in the way `mode` says.
class Careless final : public comm::ErrorFeedbackSync {
 public:
  Careless(int64_t n, int mode) : ErrorFeedbackSync(n), mode_(mode) {}
  std::string name() const override { return "careless"; }
  std::string describe() const override { return ""; }

 private:
  comm::SyncStats compress(comm::SyncBuffers&, int64_t, comm::ErrorFeedback::Step& ef) override {
    const int32_t first = 0;
    if (mode_ == 1) ef.sent(&first, 1);  // reports before forming acc
    if (mode_ == 2) {                     // forms acc twice
      ef.in_place();
      ef.fused();
    }
    return {};  // mode 0: never forms acc
  }
  void save_state(std::ostream&) const override {}
  void load_state(std::istream&) override {}
  int mode_;
};

}  // namespace

TEST_CASE("A third compressor gets error feedback from the base: conservation and bit-exact resume",
          "[error_feedback][mpi]") {
  Communicator& comm = comm::world();
  const int64_t n = 4099;
  ScaledSign sync(comm, n);
  std::vector<double> applied(n, 0.0), grads(n, 0.0);
  const int steps = 6;
  std::stringstream middle;
  std::vector<float> last;
  for (int s = 0; s < steps; ++s) {
    if (s == 3) sync.save(middle);
    auto g = gradient(s, comm.rank(), n);
    for (int64_t i = 0; i < n; ++i) grads[i] += g[i];
    comm::SyncBuffers b{nullptr, g.data(), n};
    sync.reduce(b, s);
    for (int64_t i = 0; i < n; ++i) applied[i] += g[i];
    last = g;
  }
  // Sum over ranks: P x everything applied + every residual = every gradient.
  std::vector<double> e(sync.error_feedback().residual(), sync.error_feedback().residual() + n);
  const testing::Conservation c = testing::conservation(comm, applied, e, grads);
  CHECK(c.worst < 1e-4);
  CHECK(c.residual_norm > 0.1);  // a sign is lossy: something was left behind
  // The residual came back with the state: steps 3..5 again give bitwise the same output.
  ScaledSign resumed(comm, n);
  resumed.load(middle);
  std::vector<float> again;
  for (int s = 3; s < steps; ++s) {
    again = gradient(s, comm.rank(), n);
    comm::SyncBuffers b{nullptr, again.data(), n};
    resumed.reduce(b, s);
  }
  CHECK(std::memcmp(again.data(), last.data(), n * sizeof(float)) == 0);
}

TEST_CASE("The error-feedback step refuses calls out of order", "[error_feedback][mpi]") {
  const int64_t n = 64;
  std::vector<float> g(n, 1.f);
  comm::SyncBuffers b{nullptr, g.data(), n};
  for (int mode : {0, 1, 2}) {
    INFO("mode " << mode);
    Careless sync(n, mode);
    CHECK_THROWS_AS(sync.reduce(b, 0), std::logic_error);
  }
  comm::SyncBuffers wrong{nullptr, g.data(), n - 1};
  Careless sync(n, 0);
  CHECK_THROWS_WITH(sync.reduce(wrong, 0), Catch::Matchers::Contains("careless") && Catch::Matchers::Contains("63"));
}

TEST_CASE("A failed load leaves the method as it was", "[error_feedback][mpi]") {
  Communicator& comm = comm::world();
  const int64_t n = 20011;
  comm::SyncOptions o;
  o.method = "oktopk";
  o.set("density", 0.01);
  auto step = [&](comm::GradientSync& sync, int s) {
    auto g = gradient(s, comm.rank(), n);
    comm::SyncBuffers b{nullptr, g.data(), n};
    sync.reduce(b, s);
    return g;
  };
  auto saved = comm::make_gradient_sync(o, comm, n);
  for (int s = 0; s < 2; ++s) step(*saved, s);
  std::stringstream state;
  saved->save(state);
  const std::string cut = state.str().substr(0, state.str().size() - 100);  // the residual cut short
  // Two methods three steps on (thresholds and residual moved past the saved ones); one of them
  // fails to load the cut state, then both go on.
  auto straight = comm::make_gradient_sync(o, comm, n);
  auto failed = comm::make_gradient_sync(o, comm, n);
  for (int s = 0; s < 3; ++s) step(*straight, s), step(*failed, s);
  std::stringstream in(cut);
  CHECK_THROWS_WITH(failed->load(in), Catch::Matchers::Contains("truncated"));
  for (int s = 3; s < 6; ++s) {
    const auto want = step(*straight, s), got = step(*failed, s);
    CHECK(std::memcmp(want.data(), got.data(), n * sizeof(float)) == 0);
  }
}

TEST_CASE("Without error feedback a step's output depends on its own gradient alone", "[error_feedback][mpi]") {
  Communicator& comm = comm::world();
  const int64_t n = 20011;
  auto run = [&](const std::string& method, bool feedback, int first, int last) {
    comm::SyncOptions o;
    o.method = method;
    o.set("density", 0.01);
    o.set("error_feedback", feedback);
    auto sync = comm::make_gradient_sync(o, comm, n);
    std::vector<float> g;
    for (int s = first; s <= last; ++s) {
      g = gradient(s, comm.rank(), n);
      comm::SyncBuffers b{nullptr, g.data(), n};
      sync->reduce(b, s);
      comm::ErrorFeedback& ef = dynamic_cast<comm::ErrorFeedbackSync&>(*sync).error_feedback();
      if (!feedback) {
        const float* r = ef.residual();
        CHECK(std::all_of(r, r + n, [](float v) { return v == 0.f; }));
      }
    }
    return g;
  };
  for (const std::string method : {"topka", "gaussiank"}) {
    INFO(method);
    // Three steps without error feedback end where one step on the third gradient alone does; with
    // it, the residual of the first two changes the third output.
    const auto alone = run(method, false, 2, 2);
    CHECK(std::memcmp(run(method, false, 0, 2).data(), alone.data(), n * sizeof(float)) == 0);
    CHECK(std::memcmp(run(method, true, 0, 2).data(), alone.data(), n * sizeof(float)) != 0);
  }
}
