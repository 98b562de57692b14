// DiLoCo and Streaming DiLoCo (comm/sync/methods/outer/diloco.h) under mpiexec (P = 2 and 3):
//   - every value torchft's regression test recorded (tests/fixtures/torchft_diloco.json, made by
//     scripts/make_diloco_fixtures.py) for 2 replicas, 2 fragments, delays 0 and 1, mixing 0, 0.5
//     and 1, straight and resumed from a checkpoint after every step (inside a delay too), and the
//     run with a failed and healed replica as far as our whole-job resume expresses it (P = 2 only);
//   - outer SGD at lr 1 without momentum is local_sgd bit for bit (parameters and BN statistics,
//     after a dense warmup);
//   - a model-sized Streaming DiLoCo resumes bit for bit from inside a delay, and the comm log holds
//     exactly the fragments' bytes under ALLREDUCE_OUTER;
//   - low-bit outer gradients: the comm log's quantized bytes, and a run near fp32's;
//   - the fragment plan and the schedule's errors.
// The delayed transfer's thread itself is diloco_transfer_test.cpp's. MPI_THREAD_MULTIPLE, as the
// trainer asks for it in such runs: every delayed case above runs its transfers on their thread
// (comm/sync/methods/outer/outer_transfer.h).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "comm/comm_log.h"
#include "comm/communicator.h"
#include "comm/sync/methods/outer/diloco.h"
#include "comm/sync/methods/outer/fragments.h"
#include "comm/sync/gradient_sync.h"
#include "diloco_harness.h"
#include "optim/optimizer.h"

using namespace trainer;
using namespace trainer::testing;
using Catch::Matchers::Contains;

namespace {

// Before main, so before MPI_Init (comm::world() on first use).
const bool kConcurrentCalls = (comm::request_concurrent_calls(), true);

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

TEST_CASE("Streaming DiLoCo reproduces every value torchft's regression test recorded",
          "[diloco][mpi][some_world_sizes][P2]") {
  comm::Communicator& comm = comm::world();
  REQUIRE(comm.size() == 2);  // torchft recorded 2 replicas
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
TEST_CASE("torchft's failure-recovery record: a fresh start, then the resumed job's state",
          "[diloco][mpi][some_world_sizes][P2]") {
  comm::Communicator& comm = comm::world();
  REQUIRE(comm.size() == 2);  // torchft recorded 2 replicas
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

TEST_CASE("DiLoCo with outer SGD at lr 1 and no momentum is local SGD, bit for bit", "[diloco][mpi]") {
  comm::Communicator& comm = comm::world();
  // With one rank local_sgd leaves the weights alone, while the outer step computes
  // theta - (theta - theta_local), which is not theta_local in floating point: the claim is for P > 1.
  REQUIRE(comm.size() >= 2);
  comm::SyncOptions local;
  local.method = "local_sgd";
  local.set("period", 3);
  local.dense_warmup_steps = 3;
  comm::SyncOptions diloco = diloco_options(3, 1, 0, 0.0);
  diloco.dense_warmup_steps = 3;
  diloco.set("outer_optimizer", "sgd");
  diloco.set("outer_lr", 1);
  diloco.set("outer_momentum", 0);
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
    o.set("outer_dtype", comm::outer_dtype_name(dtype));
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
  CHECK_THROWS_WITH(comm::plan_fragments(n, &views, 6), Contains("fragments = 6"));
  CHECK_THROWS_WITH(comm::plan_fragments(n, nullptr, 2), Contains("fragments"));

  CHECK_THROWS_WITH(comm::FragmentSchedule(4, 5, 0), Contains("fragments = 5") && Contains("period = 4"));
  CHECK_THROWS_WITH(comm::FragmentSchedule(6, 2, 3), Contains("sync_delay = 3"));
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
  CHECK_THROWS_WITH(comm::make_gradient_sync(bad, comm::world(), n, &views), Contains("mixing"));
  bad = diloco_options(4, 1, 0, 0);
  bad.set("outer_momentum", 0);
  CHECK_THROWS_WITH(comm::make_gradient_sync(bad, comm::world(), n, &views), Contains("outer_momentum"));

  // A state saved under another schedule is refused, naming the key.
  auto saved = comm::make_gradient_sync(diloco_options(4, 2, 0, 0), comm::world(), n, &views);
  std::stringstream state;
  saved->save(state);
  auto other = comm::make_gradient_sync(diloco_options(4, 1, 0, 0), comm::world(), n, &views);
  CHECK_THROWS_WITH(other->load(state), Contains("fragments"));
  CHECK_THAT(saved->describe(), Contains("ALLREDUCE_OUTER") && Contains("MB of fp32 per sync") && Contains("MB sent per rank"));
}

TEST_CASE("Outer Adam steps theta_outer as optim's Adam does with the averaged pseudo-gradient", "[diloco][mpi]") {
  // Two syncs at H = 2 of three parameters, each rank moving its own way between them; the outer step
  // must be exactly Adam's (optim/adam.h, itself checked against torch.optim.Adam) on the mean of
  // theta_outer - theta_local, and with mixing 0 the local parameters become theta_outer.
  comm::Communicator& world = comm::world();
  const int p = world.size(), rank = world.rank();
  const std::vector<models::ParamView> views{{"w", 0, {3}}};
  comm::SyncOptions o;
  o.method = "diloco";
  o.set("period", 2);
  o.set("outer_optimizer", "adam");
  o.set("outer_lr", 0.1);
  auto sync = comm::make_gradient_sync(o, world, 3, &views);
  CHECK_THAT(sync->describe(), Contains("outer adam (lr 0.1)") && Contains("Adam's two moments"));
  std::vector<float> params{1.f, -2.f, 0.5f}, grads(3, 0.f);
  std::vector<float> outer = params;
  optim::OptimizerOptions adam;
  adam.name = "adam";
  auto reference = optim::make_optimizer(models::cpu_backend(), adam, 3);
  comm::SyncBuffers b{params.data(), grads.data(), 3, nullptr, 0, &views};
  for (int step = 0; step < 4; ++step) {
    sync->reduce(b, step);
    for (int i = 0; i < 3; ++i) params[i] -= 0.25f * static_cast<float>((rank + 1) * (i + 1) * (step + 1));
    if (step % 2 == 1) {
      // The mean over ranks of outer - local, summed in rank order as the allreduce of P <= 3 does.
      std::vector<float> mean(3, 0.f);
      for (int r = 0; r < p; ++r)
        for (int i = 0; i < 3; ++i) {
          float local = outer[i];
          for (int s = step - 1; s <= step; ++s) local -= 0.25f * static_cast<float>((r + 1) * (i + 1) * (s + 1));
          mean[i] += outer[i] - local;
        }
      for (float& m : mean) m *= 1.f / static_cast<float>(p);
      reference->step(outer.data(), mean.data(), 0.1);
    }
    sync->after_step(b, step);
  }
  const auto& diloco = dynamic_cast<const comm::Diloco&>(*sync);
  CHECK(diloco.outer_parameters() == outer);  // every difference above is a small multiple of 1/4: exact
  CHECK(params == diloco.outer_parameters());
  // Its state saves and names its optimizer: a run with another outer optimizer refuses it.
  std::stringstream saved;
  sync->save(saved);
  o.set("outer_optimizer", "nesterov");
  o.set("outer_momentum", 0.9);
  auto nesterov = comm::make_gradient_sync(o, world, 3, &views);
  CHECK_THROWS_WITH(nesterov->load(saved), Contains("outer_optimizer = \"adam\""));
}
