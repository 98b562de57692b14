// Multi-rank tests of the gradient-sync stage (run under mpiexec with P = 1, 2, 3, 4): dense data
// parallelism is, step by step, the exact mean of the ranks' gradients within the float32 rounding
// bound of any summation order, and that mean is the whole batch's gradient in one process; local
// SGD with period 1 equals dense; with a longer period ranks agree right after averaging and differ
// in between; the comm log holds exactly what dense must send; through the staged communicator
// (device buffers via host memory) dense and warmup + local SGD train bit for bit as over MPI.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>

#include "rank_agreement.h"
#include "comm/comm_log.h"
#include "comm/communicator.h"
#include "comm/staged_communicator.h"
#include "comm/sync/gradient_sync.h"
#include "models/layers/batch_norm.h"
#include "models/layers/conv2d.h"
#include "models/layers/flatten.h"
#include "models/layers/linear.h"
#include "models/layers/pool2d.h"
#include "models/layers/relu.h"
#include "models/model.h"
#include "optim/sgd.h"
#include "tests/counting_memory.h"

using namespace trainer;
using namespace trainer::models;

namespace {

// A method with the stage's dense warmup and buckets, and local_sgd's period.
comm::SyncOptions options(const std::string& method, int64_t dense_warmup_steps, double bucket_mb, int64_t period) {
  comm::SyncOptions o;
  o.method = method;
  o.dense_warmup_steps = dense_warmup_steps;
  o.bucket_mb = bucket_mb;
  if (method == "local_sgd") o.set("period", period);
  return o;
}

// A small CNN without batch norm: its gradient over a batch is the mean of per-sample gradients,
// so P ranks with b samples each must reproduce one process with P*b samples.
std::unique_ptr<ImageClassifier> small_cnn(uint64_t seed) {
  auto m = std::make_unique<ImageClassifier>(cpu_backend(), "small_cnn", 0.f);
  LayerContext ctx = m->context();
  m->add(std::make_unique<Conv2d>(ctx, "conv", Conv2dOptions{3, 8, 3, 3, 1, 1, 1, 1, true}));
  m->add(std::make_unique<ReLU>(ctx));
  m->add(std::make_unique<Pool2d>(ctx, Pool2dOptions{PoolKind::kMax, 2, 2, 0, false}));
  m->add(std::make_unique<Flatten>(ctx));
  m->add(std::make_unique<Linear>(ctx, "fc", 8 * 4 * 4, 10));
  m->finish(seed);
  return m;
}

// The global batch of step `step`: `global` samples of 8x8x3 channels-last images and labels,
// the same on every rank.
void global_batch(int64_t step, int64_t global, std::vector<float>& x, std::vector<int32_t>& labels) {
  std::mt19937_64 rng(1000 + step);
  std::normal_distribution<float> normal;
  x.resize(global * 8 * 8 * 3);
  labels.resize(global);
  for (auto& v : x) v = normal(rng);
  for (auto& l : labels) l = static_cast<int32_t>(rng() % 10);
}

// Trains `steps` steps of SGD with momentum; each rank takes its contiguous slice of every global
// batch of `per_rank * ranks` samples. ranks = 1 with per_rank = P*b is the single-process reference.
using ModelFactory = std::unique_ptr<ImageClassifier> (*)(uint64_t);

// ResNet-20 with frozen batch norm (running statistics made non-trivial): the BN model for which
// P ranks with b samples equal one process with P*b samples.
std::unique_ptr<ImageClassifier> frozen_bn_resnet20(uint64_t seed) {
  ModelOptions options{"resnet20", 10, 0.f, /*freeze_batchnorm=*/true};
  auto m = make_image_model(options, cpu_backend(), seed);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0.5f, 1.5f);
  for (const auto& v : m->buffers().views())
    for (int64_t i = 0; i < v.numel(); ++i)
      m->buffers().values()[v.offset + i] = v.name.find("running_var") != std::string::npos ? u(rng) : u(rng) - 1.f;
  return m;
}

std::vector<float> train(comm::GradientSync* sync, int rank, int ranks, int64_t per_rank, int steps,
                         ModelFactory make_model = small_cnn) {
  auto model = make_model(7);
  auto& p = model->parameters();
  optim::Sgd sgd(models::cpu_backend(), p.size(), {0.9, false, 1e-4, false});
  comm::SyncBuffers b{p.values(), p.grads(), p.size(), model->buffers().values(), model->buffers().size(), &p.views()};
  std::vector<float> x;
  std::vector<int32_t> labels;
  for (int step = 0; step < steps; ++step) {
    global_batch(step, per_rank * ranks, x, labels);
    const int64_t image = 8 * 8 * 3;
    model->forward(Tensor{x.data() + rank * per_rank * image, {per_rank, 3, 8, 8}}, labels.data() + rank * per_rank,
                   Mode::kTrain);
    model->backward();
    if (sync) sync->reduce(b, step);
    sgd.step(p.values(), p.grads(), 0.05);
    if (sync) sync->after_step(b, step);
  }
  return std::vector<float>(p.values(), p.values() + p.size());
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(double(a[i]) - b[i]));
  return d;
}

using trainer::testing::identical_on_all_ranks;

// What a data-parallel dense run is checked against, step by step (worst over steps and elements).
struct DenseDeviation {
  // max over elements of |synced - exact mean| / bound, where bound is what float32 can produce
  // when P per-rank gradients are summed in any order and scaled by 1/P: Higham's
  // |fl(sum) - sum| <= gamma_{P-1} sum |g_r| with gamma_m = m u / (1 - m u), u = 2^-24, plus two
  // roundings for the scaling. Any reduction order the MPI library picks stays at or below 1.
  double worst_ratio_to_rounding_bound = 0;
  // max over steps of ||mean of the ranks' gradients - whole-batch gradient|| / ||whole-batch||.
  // The two are the same number in exact arithmetic (a mean loss, no batch statistics), but they
  // come from convolutions over different batch sizes, for which oneDNN may pick different
  // algorithms (direct, Winograd) depending on the CPU: their float32 errors are around 1e-6 of
  // the norm, while averaging mistakes (a sum instead of a mean, batch statistics per rank) are of
  // order 1.
  double worst_relative_to_whole_batch = 0;
};

// Dense data parallelism checked one step at a time from the weights every rank holds: rank r
// trains on its slice of each global batch of `per_rank * P` samples; before the sync every rank's
// gradient is gathered so the synced result can be compared with their exact mean, and a second
// model with the same weights computes the whole global batch in one process. The parallel model
// then takes the SGD step with the synced gradient. Returns its final weights.
std::vector<float> train_dense_checked(comm::GradientSync& sync, comm::Communicator& comm, int64_t per_rank,
                                       int steps, ModelFactory make_model, DenseDeviation& deviation) {
  const int P = comm.size();
  auto model = make_model(7);
  auto whole = make_model(7);
  auto& p = model->parameters();
  const int64_t n = p.size();
  optim::Sgd sgd(models::cpu_backend(), n, {0.9, false, 1e-4, false});
  comm::SyncBuffers b{p.values(), p.grads(), n, model->buffers().values(), model->buffers().size(), &p.views()};
  constexpr double u = 1.0 / (1 << 24);
  const double gamma = (P - 1) * u / (1 - (P - 1) * u);
  const double scaled_bound = gamma * (1 + 3 * u) + 3 * u;
  const int64_t image = 8 * 8 * 3;
  std::vector<float> x, all(n * P);
  std::vector<int32_t> labels;
  for (int step = 0; step < steps; ++step) {
    global_batch(step, per_rank * P, x, labels);
    model->forward(Tensor{x.data() + comm.rank() * per_rank * image, {per_rank, 3, 8, 8}},
                   labels.data() + comm.rank() * per_rank, Mode::kTrain);
    model->backward();
    comm.allgather(p.grads(), n, all.data(), comm::DType::kF32, "TEST");
    sync.reduce(b, step);

    std::copy(p.values(), p.values() + n, whole->parameters().values());
    whole->forward(Tensor{x.data(), {per_rank * P, 3, 8, 8}}, labels.data(), Mode::kTrain);
    whole->backward();
    const float* g_whole = whole->parameters().grads();
    double diff2 = 0, whole2 = 0;
    for (int64_t i = 0; i < n; ++i) {
      double sum = 0, magnitude = 0;
      for (int r = 0; r < P; ++r) {
        sum += all[r * n + i];
        magnitude += std::fabs(all[r * n + i]);
      }
      const double mean = sum / P;
      // The float64 sum of P float32 numbers is exact to 1e-15 of their magnitude.
      const double bound = (scaled_bound + 1e-15) * magnitude / P;
      const double error = std::fabs(p.grads()[i] - mean);
      if (error > 0)
        deviation.worst_ratio_to_rounding_bound =
            std::max(deviation.worst_ratio_to_rounding_bound, bound > 0 ? error / bound : HUGE_VAL);
      diff2 += (mean - g_whole[i]) * (mean - g_whole[i]);
      whole2 += double(g_whole[i]) * g_whole[i];
    }
    deviation.worst_relative_to_whole_batch =
        std::max(deviation.worst_relative_to_whole_batch, std::sqrt(diff2 / whole2));
    sgd.step(p.values(), p.grads(), 0.05);
  }
  return std::vector<float>(p.values(), p.values() + n);
}

}  // namespace

TEST_CASE("Dense data parallelism equals one process with the whole batch", "[sync][mpi]") {
  comm::Communicator& comm = comm::world();
  auto probe = small_cnn(7);
  auto sync = comm::make_gradient_sync(options("dense", 0, 0.001, 1), comm, probe->parameters().size());  // tiny buckets
  DenseDeviation deviation;
  const auto parallel = train_dense_checked(*sync, comm, 4, 5, small_cnn, deviation);
  INFO("synced gradient vs exact mean, in units of the float32 rounding bound: "
       << deviation.worst_ratio_to_rounding_bound);
  INFO("relative distance to the whole-batch gradient: " << deviation.worst_relative_to_whole_batch);
  CHECK(deviation.worst_ratio_to_rounding_bound <= 1);
  CHECK(deviation.worst_relative_to_whole_batch < 1e-4);
  CHECK(identical_on_all_ranks(comm, parallel));
}

TEST_CASE("Dense data parallelism with frozen batch norm (ResNet-20) equals one process", "[sync][mpi]") {
  comm::Communicator& comm = comm::world();
  auto sync = comm::make_gradient_sync(options("dense", 0, 25, 1), comm, frozen_bn_resnet20(7)->parameters().size());
  DenseDeviation deviation;
  const auto parallel = train_dense_checked(*sync, comm, 2, 3, frozen_bn_resnet20, deviation);
  INFO("synced gradient vs exact mean, in units of the float32 rounding bound: "
       << deviation.worst_ratio_to_rounding_bound);
  INFO("relative distance to the whole-batch gradient: " << deviation.worst_relative_to_whole_batch);
  CHECK(deviation.worst_ratio_to_rounding_bound <= 1);
  CHECK(deviation.worst_relative_to_whole_batch < 1e-4);
  CHECK(identical_on_all_ranks(comm, parallel));
}

TEST_CASE("Local SGD with period 1 equals dense", "[sync][mpi]") {
  comm::Communicator& comm = comm::world();
  const int64_t n = small_cnn(7)->parameters().size();
  auto dense = comm::make_gradient_sync(options("dense", 0, 25, 1), comm, n);
  auto local = comm::make_gradient_sync(options("local_sgd", 0, 25, 1), comm, n);
  const auto a = train(dense.get(), comm.rank(), comm.size(), 4, 5);
  const auto b = train(local.get(), comm.rank(), comm.size(), 4, 5);
  INFO("max |local - dense| = " << max_abs_diff(a, b));
  CHECK(max_abs_diff(a, b) < 2e-5);
}

TEST_CASE("Local SGD with period 3: identical after averaging, different in between", "[sync][mpi]") {
  comm::Communicator& comm = comm::world();
  const int64_t n = small_cnn(7)->parameters().size();
  auto local = comm::make_gradient_sync(options("local_sgd", 0, 25, 3), comm, n);
  // 6 steps end right after an averaging step (steps 2 and 5 average); 5 steps end in between.
  const auto after_average = train(local.get(), comm.rank(), comm.size(), 4, 6);
  CHECK(identical_on_all_ranks(comm, after_average));
  const auto in_between = train(local.get(), comm.rank(), comm.size(), 4, 5);
  if (comm.size() > 1) CHECK_FALSE(identical_on_all_ranks(comm, in_between));
}

TEST_CASE("Dense warmup then local SGD: synchronous for the warmup steps", "[sync][mpi]") {
  comm::Communicator& comm = comm::world();
  const int64_t n = small_cnn(7)->parameters().size();
  auto warm = comm::make_gradient_sync(options("local_sgd", 4, 25, 100), comm, n);
  CHECK(identical_on_all_ranks(comm, train(warm.get(), comm.rank(), comm.size(), 4, 4)));
  auto warm2 = comm::make_gradient_sync(options("local_sgd", 4, 25, 100), comm, n);
  const auto after = train(warm2.get(), comm.rank(), comm.size(), 4, 6);
  if (comm.size() > 1) CHECK_FALSE(identical_on_all_ranks(comm, after));
}

namespace {

// What the log kept of a run: per-op statistics and the bytes sent and received.
struct RunLog {
  std::vector<comm::OpStats> ops;
  int64_t sent = 0, received = 0;
};

std::vector<float> train_logged(comm::GradientSync& sync, comm::Communicator& comm, RunLog& log) {
  comm::CommLogOptions options;
  options.enabled = true;
  comm.log().open(options, comm.rank(), comm.size());
  auto weights = train(&sync, comm.rank(), comm.size(), 4, 5);
  log.ops = comm.log().op_stats();
  comm.log().take_totals(log.sent, log.received);
  comm.log().open(comm::CommLogOptions{}, comm.rank(), comm.size());
  return weights;
}

}  // namespace

TEST_CASE("Dense and warmup + local SGD through the staged communicator equal the MPI runs bit for bit",
          "[sync][mpi]") {
  comm::Communicator& comm = comm::world();
  const int64_t n = small_cnn(7)->parameters().size();
  // Tiny buckets (several allreduces per step); 2 dense warmup steps, then averaging every 2 steps.
  for (const comm::SyncOptions& o : {options("dense", 0, 0.001, 1), options("local_sgd", 2, 0.004, 2)}) {
    INFO(o.method);
    testing::CountingMemory memory;  // host memory standing in for a device's
    comm::StagedCommunicator staged(comm, memory);
    auto plain_sync = comm::make_gradient_sync(o, comm, n);
    auto staged_sync = comm::make_gradient_sync(o, staged, n);
    RunLog plain_log, staged_log;
    const auto plain = train_logged(*plain_sync, comm, plain_log);
    const auto through_host = train_logged(*staged_sync, staged, staged_log);
    CHECK(std::memcmp(plain.data(), through_host.data(), plain.size() * sizeof(float)) == 0);
    CHECK(staged_log.sent == plain_log.sent);
    CHECK(staged_log.received == plain_log.received);
    REQUIRE(staged_log.ops.size() == plain_log.ops.size());
    for (size_t i = 0; i < plain_log.ops.size(); ++i) {
      CHECK(staged_log.ops[i].op == plain_log.ops[i].op);
      CHECK(staged_log.ops[i].calls == plain_log.ops[i].calls);
      CHECK(staged_log.ops[i].bytes_recv == plain_log.ops[i].bytes_recv);
      CHECK(staged_log.ops[i].sizes == plain_log.ops[i].sizes);
    }
    // Every allreduced byte went out of the "device" and came back: the log's bytes, both ways;
    // local SGD's one broadcast of its anchor leaves the root and arrives at the others.
    int64_t broadcast_sent = 0, broadcast_received = 0;
    for (const auto& op : staged_log.ops)
      if (op.op == "BROADCAST_ANCHOR") {
        broadcast_sent += op.bytes;
        broadcast_received += op.bytes_recv;
      }
    CHECK(memory.to_host == staged_log.sent);
    CHECK(memory.to_device == staged_log.sent - broadcast_sent + broadcast_received);
    if (comm.size() > 1) CHECK(staged_log.sent > 0);
  }
}

TEST_CASE("An unknown sync method is a clear error listing the available ones", "[sync]") {
  try {
    comm::make_gradient_sync(options("no_such_method", 0, 25, 1), comm::world(), 10);
    FAIL("expected an error");
  } catch (const std::invalid_argument& e) {
    CHECK_THAT(e.what(), Catch::Matchers::Contains("no_such_method") && Catch::Matchers::Contains("dense, local_sgd"));
  }
}

TEST_CASE("Saved sync state restores, and another method's state is refused", "[sync]") {
  comm::Communicator& comm = comm::world();
  auto local = comm::make_gradient_sync(options("local_sgd", 0, 25, 3), comm, 10);
  std::stringstream state;
  local->save(state);
  auto again = comm::make_gradient_sync(options("local_sgd", 0, 25, 3), comm, 10);
  CHECK_NOTHROW(again->load(state));
  std::stringstream state2;
  local->save(state2);
  auto dense = comm::make_gradient_sync(options("dense", 0, 25, 1), comm, 10);
  CHECK_THROWS_WITH(dense->load(state2), Catch::Matchers::Contains("local_sgd"));
}
