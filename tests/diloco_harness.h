// The pieces the DiLoCo tests (diloco_test.cpp, diloco_transfer_test.cpp) share: torchft's mocked
// replica and its recorded values (tests/fixtures/torchft_diloco.json), and a small batch-norm CNN
// trained one rank's way through a GradientSync.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <istream>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "comm/sync/methods/outer/diloco.h"
#include "comm/sync/gradient_sync.h"
#include "models/layers/batch_norm.h"
#include "models/layers/conv2d.h"
#include "models/layers/flatten.h"
#include "models/layers/linear.h"
#include "models/layers/pool2d.h"
#include "models/layers/relu.h"
#include "models/model.h"
#include "optim/sgd.h"

namespace trainer::testing {

// ---- torchft's mocked model: two 1x1 weights at 1, gradient 2, inner p -= 1 * g, outer SGD lr 2.

inline comm::SyncOptions torchft_options(int64_t delay, double mixing) {
  comm::SyncOptions o;
  o.method = "diloco";
  o.set("period", 6);  // sync_every
  o.set("fragments", 2);
  o.set("sync_delay", delay);
  o.set("mixing", mixing);
  o.set("outer_optimizer", "sgd");  // torchft's MockOptimizer: p -= lr * grad
  o.set("outer_lr", 2);
  o.set("outer_momentum", 0);
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

inline const nlohmann::json& torchft_fixture() {
  static const nlohmann::json fixture = [] {
    std::ifstream in(std::string(TRAINER_FIXTURES) + "/torchft_diloco.json");
    REQUIRE(in);
    return nlohmann::json::parse(in);
  }();
  return fixture;
}

inline std::vector<Row> rows(const nlohmann::json& j) { return j.get<std::vector<Row>>(); }

// ---- A small CNN with batch norm (running statistics to average) on per-rank data.

inline std::unique_ptr<models::ImageClassifier> small_bn_cnn() {
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

  // g++ 12 at -O3, inlining this into a range-for over a braced list (for (int64_t c : {1, 3})
  // { Trainee t(o); ... }), reports -Wdangling-pointer against the list's backing array (C.<n>),
  // which lives for the whole loop: a false positive of g++ 12's new warning, silenced here only.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdangling-pointer"
#endif
  explicit Trainee(const comm::SyncOptions& o)
      : sync(comm::make_gradient_sync(o, comm::world(), p.size(), &p.views())) {}
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic pop
#endif

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

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline comm::SyncOptions diloco_options(int64_t period, int64_t fragments, int64_t delay, double mixing) {
  comm::SyncOptions o;
  o.method = "diloco";
  o.set("period", period);
  o.set("fragments", fragments);
  o.set("sync_delay", delay);
  o.set("mixing", mixing);
  return o;
}

}  // namespace trainer::testing
