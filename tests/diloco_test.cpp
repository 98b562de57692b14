// DiLoCo and Streaming DiLoCo (comm/sync/diloco.h) under mpiexec (P = 2 and 3):
//   - every value torchft's regression test recorded (tests/fixtures/torchft_diloco.json, made by
//     scripts/make_diloco_fixtures.py) for 2 replicas, 2 fragments, delays 0 and 1, mixing 0, 0.5
//     and 1, straight and resumed from a checkpoint after every step (inside a delay too), and the
//     run with a failed and healed replica as far as our whole-job resume expresses it (P = 2 only);
//   - outer SGD at lr 1 without momentum is local_sgd bit for bit (parameters and BN statistics,
//     after a dense warmup);
//   - a model-sized Streaming DiLoCo resumes bit for bit from inside a delay, and the comm log holds
//     exactly the fragments' bytes under ALLREDUCE_OUTER;
//   - the fragment plan and the schedule's errors;
//   - a delayed fragment's allreduce really runs during the steps after its send (it can only
//     finish after rank 0's send step returned: the other ranks join it only then), with torchft's
//     values, the same bits as the inline transfer, and an error on its thread comes back.
// MPI_THREAD_MULTIPLE, as the trainer asks for it in such runs: every delayed case above runs its
// transfers on their thread (comm/sync/outer_transfer.h).
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "comm/comm_log.h"
#include "comm/communicator.h"
#include "comm/sync/diloco.h"
#include "comm/sync/fragments.h"
#include "comm/sync/gradient_sync.h"
#include "models/layers/batch_norm.h"
#include "models/layers/conv2d.h"
#include "models/layers/flatten.h"
#include "models/layers/linear.h"
#include "models/layers/pool2d.h"
#include "models/layers/relu.h"
#include "models/model.h"
#include "optim/sgd.h"

using namespace trainer;
using Catch::Matchers::Contains;

namespace {

// Before main, so before MPI_Init (comm::world() on first use).
const bool kConcurrentCalls = (comm::request_concurrent_calls(), true);

// ---- torchft's mocked model: two 1x1 weights at 1, gradient 2, inner p -= 1 * g, outer SGD lr 2.

comm::SyncOptions torchft_options(int64_t delay, double mixing) {
  comm::SyncOptions o;
  o.method = "diloco";
  o.period = 6;  // sync_every
  o.fragments = 2;
  o.sync_delay = delay;
  o.mixing = mixing;
  o.outer_optimizer = "sgd";  // torchft's MockOptimizer: p -= lr * grad
  o.outer_lr = 2;
  o.outer_momentum = 0;
  return o;
}

// One replica of torchft's DiLoCoMockedUpdateTest, driven through the GradientSync interface as
// the trainer drives it. Row k of a record: the weights before inner step k + 1.
struct MockedReplica {
  std::vector<models::ParamView> views{{"layers.0.weight", 0, {1, 1}}, {"layers.1.weight", 1, {1, 1}}};
  std::vector<float> params{1.f, 1.f};
  std::vector<float> grads{2.f, 2.f};
  comm::SyncBuffers b{params.data(), grads.data(), 2, nullptr, 0, &views};
  std::unique_ptr<comm::GradientSync> sync;
  int64_t steps = 0;     // inner steps taken
  int64_t reduced = -1;  // the step whose reduce ran

  explicit MockedReplica(const comm::SyncOptions& o) : sync(comm::make_gradient_sync(o, comm::world(), 2, &views)) {}
  const comm::Diloco& diloco() const { return dynamic_cast<const comm::Diloco&>(*sync); }

  // Up to the point where torchft records row `steps` (after the sync stage's reduce, before the
  // inner optimizer step), then the step's rest.
  void record_point() {
    if (reduced == steps) return;
    sync->reduce(b, steps);
    reduced = steps;
  }
  void finish_step() {
    for (float& p : params) p -= 1.f * 2.f;
    sync->after_step(b, steps);
    ++steps;
  }
};

using Row = std::vector<double>;  // [k, layers.0.weight, layers.1.weight]

const nlohmann::json& torchft_fixture() {
  static const nlohmann::json fixture = [] {
    std::ifstream in(std::string(TRAINER_FIXTURES) + "/torchft_diloco.json");
    REQUIRE(in);
    return nlohmann::json::parse(in);
  }();
  return fixture;
}

// Replays `replica` from its current step up to the last row of `history`/`outer` (rows with k
// below the replica's step are skipped: they were checked before a resume), checking every row
// whose k, shifted by `offset`, is a step of this run: the weights exactly, and the outer weights
// where torchft recorded them. Returns the rows checked.
int replay_and_check(MockedReplica& replica, const std::vector<Row>& history, const std::vector<Row>& outer,
                     int64_t offset = 0) {
  std::map<int64_t, Row> outer_at;
  for (const Row& r : outer) outer_at[static_cast<int64_t>(r[0]) + offset] = r;
  const int64_t last = static_cast<int64_t>(history.back()[0]) + offset;
  int checked = 0;
  for (const Row& row : history) {
    const int64_t k = static_cast<int64_t>(row[0]) + offset;
    if (k < replica.steps) continue;
    while (replica.steps < k) {
      replica.record_point();
      replica.finish_step();
    }
    replica.record_point();
    INFO("torchft row " << row[0] << " (our step " << k << ")");
    CHECK(replica.params[0] == row[1]);
    CHECK(replica.params[1] == row[2]);
    if (outer_at.count(k)) {
      const auto& theta = replica.diloco().outer_parameters();
      CHECK(theta[0] == outer_at[k][1]);
      CHECK(theta[1] == outer_at[k][2]);
    }
    ++checked;
    if (k == last) break;
  }
  return checked;
}

std::vector<Row> rows(const nlohmann::json& j) { return j.get<std::vector<Row>>(); }

// A replica's whole state as a checkpoint holds it: the weights and the sync state.
std::unique_ptr<MockedReplica> checkpoint_and_resume(const MockedReplica& from, const comm::SyncOptions& o) {
  std::stringstream state;
  from.sync->save(state);
  auto resumed = std::make_unique<MockedReplica>(o);
  resumed->sync->load(state);
  resumed->params = from.params;
  resumed->steps = from.steps;
  return resumed;
}

}  // namespace

TEST_CASE("Streaming DiLoCo reproduces every value torchft's regression test recorded", "[diloco][mpi]") {
  comm::Communicator& comm = comm::world();
  if (comm.size() != 2) return;  // torchft recorded 2 replicas
  const auto& fixture = torchft_fixture();
  int checked = 0;
  for (const auto& run : fixture.at("runs")) {
    const std::string name = run.at("name");
    if (name.find("failure") != std::string::npos) continue;
    INFO(name << ": delay " << run.at("sync_delay") << ", mixing " << run.at("mixing"));
    const auto o = torchft_options(run.at("sync_delay"), run.at("mixing"));
    const auto& mine = run.at("replicas").at(static_cast<size_t>(comm.rank()));
    const auto history = rows(mine.at("history")), outer = rows(mine.at("outer"));
    {
      MockedReplica replica(o);
      checked += replay_and_check(replica, history, outer);
    }
    // Resumed from a checkpoint after each step c (after step 2 of delay 1, fragment 0 is in flight).
    for (int64_t c = 1; c < static_cast<int64_t>(history.size()) - 1; ++c) {
      INFO("checkpoint after step " << c);
      MockedReplica first(o);
      while (first.steps < c) {
        first.record_point();
        first.finish_step();
      }
      auto resumed = checkpoint_and_resume(first, o);
      replay_and_check(*resumed, history, outer);
    }
  }
  CHECK(checked == 6 * 16);  // six runs of rows 0..15
}

// torchft heals a restarted replica live from a surviving one's state. Our jobs resume as a whole
// from a checkpoint (same world size), so the healed replica's record is reproduced as what it is:
// its first rows (0-2) are a fresh start, and from row 3 on it holds the job's state 6 steps further
// (it loaded replica 0's state during replica 0's step 9): a job checkpointed after step 8 (no
// fragment in flight with delay 0), resumed into new objects, reproduces rows 3-15 from its step 9.
// Replica 0 never saw the failure in its values (both replicas send the same pseudo-gradient, so the
// average over one or two is the same): its 22 rows are a plain run.
TEST_CASE("torchft's failure-recovery record: a fresh start, then the resumed job's state", "[diloco][mpi]") {
  comm::Communicator& comm = comm::world();
  if (comm.size() != 2) return;
  const nlohmann::json* run = nullptr;
  for (const auto& r : torchft_fixture().at("runs"))
    if (r.at("name").get<std::string>().find("failure") != std::string::npos) run = &r;
  REQUIRE(run);
  const auto o = torchft_options(0, 0.0);
  const auto& replicas = run->at("replicas");
  const auto history0 = rows(replicas.at(0).at("history")), outer0 = rows(replicas.at(0).at("outer"));
  const auto history1 = rows(replicas.at(1).at("history")), outer1 = rows(replicas.at(1).at("outer"));
  REQUIRE(history0.size() == 22);
  REQUIRE(history1.size() == 16);

  MockedReplica survivor(o);
  CHECK(replay_and_check(survivor, history0, outer0) == 22);

  // Replica 1 before its failure: rows 0-2 and the outer weights of row 0, a fresh start.
  const std::vector<Row> before(history1.begin(), history1.begin() + 3);
  MockedReplica fresh(o);
  CHECK(replay_and_check(fresh, before, {outer1.front()}) == 3);
  // After healing: row j is the job's step j + 6.
  MockedReplica job(o);
  while (job.steps < 8) {
    job.record_point();
    job.finish_step();
  }
  auto resumed = checkpoint_and_resume(job, o);
  const std::vector<Row> healed(history1.begin() + 3, history1.end());
  const std::vector<Row> healed_outer(outer1.begin() + 1, outer1.end());
  CHECK(replay_and_check(*resumed, healed, healed_outer, 6) == 13);
}

namespace {

// ---- A small CNN with batch norm (running statistics to average) on per-rank data.

std::unique_ptr<models::ImageClassifier> small_bn_cnn() {
  using namespace models;
  auto m = std::make_unique<ImageClassifier>(cpu_backend(), "small_bn_cnn", 0.f);
  LayerContext ctx = m->context();
  m->add(std::make_unique<Conv2d>(ctx, "conv", Conv2dOptions{3, 8, 3, 3, 1, 1, 1, 1, false}));
  m->add(std::make_unique<BatchNorm2d>(ctx, "bn", BatchNormOptions{8}));
  m->add(std::make_unique<ReLU>(ctx));
  m->add(std::make_unique<Pool2d>(ctx, Pool2dOptions{PoolKind::kMax, 2, 2, 0, false}));
  m->add(std::make_unique<Flatten>(ctx));
  m->add(std::make_unique<Linear>(ctx, "fc", 8 * 4 * 4, 10));
  m->finish(7);
  return m;
}

// Everything one rank trains with; step() is the trainer's order (reduce, optimizer, after_step).
struct Trainee {
  std::unique_ptr<models::ImageClassifier> model = small_bn_cnn();
  models::ParameterStore& p = model->parameters();
  optim::Sgd sgd{models::cpu_backend(), p.size(), {0.9, true, 1e-4, false}};
  comm::SyncBuffers b{p.values(), p.grads(), p.size(), model->buffers().values(), model->buffers().size(), &p.views()};
  std::unique_ptr<comm::GradientSync> sync;
  int64_t steps = 0;

  explicit Trainee(const comm::SyncOptions& o)
      : sync(comm::make_gradient_sync(o, comm::world(), p.size(), &p.views())) {}

  void step() {
    comm::Communicator& comm = comm::world();
    std::mt19937_64 rng(1000 + 7919 * steps + comm.rank());  // this rank's own batch
    std::normal_distribution<float> normal;
    std::vector<float> x(4 * 8 * 8 * 3);
    std::vector<int32_t> labels(4);
    for (auto& v : x) v = normal(rng);
    for (auto& l : labels) l = static_cast<int32_t>(rng() % 10);
    model->forward(models::Tensor{x.data(), {4, 3, 8, 8}}, labels.data(), models::Mode::kTrain);
    model->backward();
    sync->reduce(b, steps);
    sgd.step(p.values(), p.grads(), 0.05);
    sync->after_step(b, steps);
    ++steps;
  }
  void run_to(int64_t n) {
    while (steps < n) step();
  }
  // Weights and BN statistics.
  std::vector<float> state() const {
    std::vector<float> all(p.values(), p.values() + p.size());
    all.insert(all.end(), model->buffers().values(), model->buffers().values() + model->buffers().size());
    return all;
  }
  void save(std::ostream& out) const {
    const auto s = state();
    out.write(reinterpret_cast<const char*>(s.data()), static_cast<std::streamsize>(s.size() * sizeof(float)));
    sgd.save(out);
    sync->save(out);
  }
  void load(std::istream& in, int64_t at_step) {
    std::vector<float> s(state().size());
    in.read(reinterpret_cast<char*>(s.data()), static_cast<std::streamsize>(s.size() * sizeof(float)));
    std::copy(s.begin(), s.begin() + p.size(), p.values());
    std::copy(s.begin() + p.size(), s.end(), model->buffers().values());
    sgd.load(in);
    sync->load(in);
    steps = at_step;
  }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

comm::SyncOptions diloco_options(int64_t period, int64_t fragments, int64_t delay, double mixing) {
  comm::SyncOptions o;
  o.method = "diloco";
  o.period = period;
  o.fragments = fragments;
  o.sync_delay = delay;
  o.mixing = mixing;
  return o;
}

}  // namespace

TEST_CASE("DiLoCo with outer SGD at lr 1 and no momentum is local SGD, bit for bit", "[diloco][mpi]") {
  comm::Communicator& comm = comm::world();
  // With one rank local_sgd leaves the weights alone, while the outer step computes
  // theta - (theta - theta_local), which is not theta_local in floating point: the claim is for P > 1.
  if (comm.size() < 2) return;
  comm::SyncOptions local;
  local.method = "local_sgd";
  local.period = 3;
  local.dense_warmup_steps = 3;
  comm::SyncOptions diloco = diloco_options(3, 1, 0, 0.0);
  diloco.dense_warmup_steps = 3;
  diloco.outer_optimizer = "sgd";
  diloco.outer_lr = 1;
  diloco.outer_momentum = 0;
  for (int64_t steps : {12, 13}) {  // the end of a period, and one step into the next
    INFO(steps << " steps");
    Trainee a(local), b(diloco);
    a.run_to(steps);
    b.run_to(steps);
    CHECK(same_bits(a.state(), b.state()));
  }
  // The default outer optimizer (Nesterov, lr 0.7) is another method: the comparison can tell.
  Trainee a(local), c(diloco_options(3, 1, 0, 0.0));
  a.run_to(12);
  c.run_to(12);
  CHECK_FALSE(same_bits(a.state(), c.state()));
}

TEST_CASE("Streaming DiLoCo resumes bit for bit, inside a delay too; the comm log has each fragment's bytes",
          "[diloco][mpi]") {
  comm::Communicator& comm = comm::world();
  // H = 4, F = 2 (offsets 2 and 4), tau = 1: fragment 0 is sent after inner steps 1, 5, 9, fragment 1
  // after 3, 7, 11; each lands one step later. Nesterov outer steps, half of the local state kept.
  const comm::SyncOptions o = diloco_options(4, 2, 1, 0.5);
  comm::CommLogOptions log_options;
  log_options.enabled = true;
  comm.log().open(log_options, comm.rank(), comm.size());
  Trainee straight(o);
  straight.run_to(12);
  const auto ops = comm.log().op_stats();
  comm.log().open(comm::CommLogOptions{}, comm.rank(), comm.size());

  const auto& fragments = dynamic_cast<const comm::Diloco&>(*straight.sync).fragments();
  REQUIRE(fragments.size() == 2);
  const int64_t sizes = fragments[0].size() + fragments[1].size();
  CHECK(sizes == straight.p.size());
  bool outer_seen = false, stats_seen = false;
  for (const auto& op : ops) {
    if (op.op == "ALLREDUCE_OUTER") {
      outer_seen = true;
      CHECK(op.calls == 6);  // 3 syncs of each fragment in 12 steps
      CHECK(op.bytes == 3 * sizes * 4);
      CHECK(op.sizes == std::vector<int64_t>{fragments[0].size() * 4, fragments[1].size() * 4,
                                             fragments[0].size() * 4, fragments[1].size() * 4,
                                             fragments[0].size() * 4, fragments[1].size() * 4});
    }
    if (op.op == "ALLREDUCE_BN_STATS") {
      stats_seen = true;
      CHECK(op.calls == 3);  // with fragment 1's outer steps, after inner steps 4, 8, 12
      CHECK(op.bytes == 3 * straight.model->buffers().size() * 4);
    }
  }
  CHECK(outer_seen);
  CHECK(stats_seen);

  for (int64_t c : {1, 3, 4, 6}) {  // after 1 and 3 a fragment is in flight; 4 and 6: none
    INFO("checkpoint after step " << c);
    Trainee first(o);
    first.run_to(c);
    std::stringstream state;
    first.save(state);
    Trainee resumed(o);
    resumed.load(state, c);
    resumed.run_to(12);
    CHECK(same_bits(resumed.state(), straight.state()));
  }
}

TEST_CASE("Low-bit outer gradients: the comm log has the quantized bytes; the run stays near fp32's",
          "[diloco][mpi]") {
  comm::Communicator& comm = comm::world();
  comm::SyncOptions o = diloco_options(4, 2, 0, 0.0);
  Trainee exact(o);
  exact.run_to(8);
  for (const auto dtype : {comm::OuterDType::kBF16, comm::OuterDType::kFP8, comm::OuterDType::kInt8}) {
    INFO(comm::outer_dtype_name(dtype));
    o.outer_dtype = dtype;
    comm::CommLogOptions log_options;
    log_options.enabled = true;
    comm.log().open(log_options, comm.rank(), comm.size());
    Trainee low(o);
    low.run_to(8);
    const auto ops = comm.log().op_stats();
    comm.log().open(comm::CommLogOptions{}, comm.rank(), comm.size());
    // 2 syncs of each fragment, each the quantized sum's volume (2 calls, 1 at P = 1 none moves).
    const auto& fragments = dynamic_cast<const comm::Diloco&>(*low.sync).fragments();
    int64_t want = 0;
    for (const auto& f : fragments) want += 2 * comm::quantized_volume(dtype, f.size(), comm.size()).bytes_sent;
    const auto outer = std::find_if(ops.begin(), ops.end(), [](const auto& op) { return op.op == "ALLREDUCE_OUTER"; });
    REQUIRE(outer != ops.end());
    CHECK(outer->bytes == want);
    // Rounded, so not fp32's bits, but close: 8 inner steps of lr 0.05 and two Nesterov outer steps
    // on a pseudo-gradient whose every element is within ~7% (fp8) of its block's largest.
    const auto a = exact.state(), b = low.state();
    double worst = 0, scale = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      worst = std::max(worst, std::abs(double(a[i]) - b[i]));
      scale = std::max(scale, std::abs(double(a[i])));
    }
    CHECK(worst > 0);
    CHECK(worst < 0.05 * scale);
  }
}

TEST_CASE("Fragments are whole tensors of about equal size; impossible settings name their key", "[diloco]") {
  auto model = small_bn_cnn();  // conv.weight 216, bn.weight 8, bn.bias 8, fc.weight 1280, fc.bias 10
  const auto& views = model->parameters().views();
  const int64_t n = model->parameters().size();
  const auto two = comm::plan_fragments(n, &views, 2);
  REQUIRE(two.size() == 2);
  CHECK(two[0].begin == 0);
  CHECK(two[0].end == two[1].begin);
  CHECK(two[1].end == n);
  CHECK(two[0].tensors == 3);  // 232 elements: the boundary nearest to n / 2 = 761 before fc.weight
  CHECK(two[1].tensors == 2);
  const auto five = comm::plan_fragments(n, &views, 5);
  for (size_t f = 0; f < five.size(); ++f) CHECK(five[f].tensors == 1);
  CHECK_THROWS_WITH(comm::plan_fragments(n, &views, 6), Contains("sync.fragments = 6"));
  CHECK_THROWS_WITH(comm::plan_fragments(n, nullptr, 2), Contains("sync.fragments"));

  CHECK_THROWS_WITH(comm::FragmentSchedule(4, 5, 0), Contains("sync.fragments = 5") && Contains("sync.period = 4"));
  CHECK_THROWS_WITH(comm::FragmentSchedule(6, 2, 3), Contains("sync.sync_delay = 3"));
  const comm::FragmentSchedule s(7, 3, 1);  // offsets 2, 4, 7
  CHECK(s.finishes_after(2) == 0);
  CHECK(s.finishes_after(4) == 1);
  CHECK(s.finishes_after(7) == 2);
  CHECK(s.finishes_after(14) == 2);
  CHECK(s.finishes_after(3) == -1);
  CHECK(s.starts_after(1) == 0);
  CHECK(s.starts_after(6) == 2);
  CHECK(s.starts_after(13) == 2);

  auto bad = diloco_options(4, 1, 0, 1.5);
  CHECK_THROWS_WITH(comm::make_gradient_sync(bad, comm::world(), n, &views), Contains("sync.mixing"));
  bad = diloco_options(4, 1, 0, 0);
  bad.outer_momentum = 0;
  CHECK_THROWS_WITH(comm::make_gradient_sync(bad, comm::world(), n, &views), Contains("sync.outer_momentum"));

  // A state saved under another schedule is refused, naming the key.
  auto saved = comm::make_gradient_sync(diloco_options(4, 2, 0, 0), comm::world(), n, &views);
  std::stringstream state;
  saved->save(state);
  auto other = comm::make_gradient_sync(diloco_options(4, 1, 0, 0), comm::world(), n, &views);
  CHECK_THROWS_WITH(other->load(state), Contains("sync.fragments"));
  CHECK_THAT(saved->describe(), Contains("ALLREDUCE_OUTER") && Contains("MB of fp32 per sync") && Contains("MB sent per rank"));
}

namespace {

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
  [[noreturn]] void abort(int code) override { base_.abort(code); }

 private:
  void fail(const char* tag) const {
    if (fail_) throw std::runtime_error(std::string("injected failure in ") + tag);
  }
  comm::Communicator& base_;
  bool fail_;
};

}  // namespace

TEST_CASE("A delayed fragment's allreduce runs during the next steps, with the blocking values", "[diloco][mpi]") {
  comm::Communicator& comm = comm::world();
  if (comm.size() != 2) return;  // torchft's fixture: 2 replicas
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
    o.outer_dtype = dtype;
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
  o.delay = 1;  // fragment 0 goes out after inner step 1 and lands after step 2
  comm::Diloco diloco(comm, 2, &views, o);
  REQUIRE(diloco.overlapped());
  diloco.reduce(b, 0);
  diloco.after_step(b, 0);  // the send: the error happens on the thread, nothing throws here
  diloco.reduce(b, 1);
  CHECK_THROWS_WITH(diloco.after_step(b, 1), Contains("outer allreduce started at step 0 failed") &&
                                                 Contains("injected failure in ALLREDUCE_OUTER"));
  diloco.complete_in_flight();  // nothing left: no second error, no hang
}
