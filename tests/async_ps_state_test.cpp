// The async_ps servers' state cut again for another number of servers (comm/sync/methods/async_ps/async_ps_state.h),
// against one server that never was cut: 3 servers' shards of a model joined and split for 2 hold,
// bit for bit, the optimizer state, gap-aware averages and parameters of a single optimizer that ran
// the same updates on the whole model, and the 2 new servers' next update is that optimizer's next
// update. Every update is element-wise, so cutting the model changes no bit (the e2e test "two
// servers apply the same updates as one" relies on the same fact).
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <sstream>
#include <vector>

#include "comm/sync/methods/async_ps/async_ps_state.h"
#include "models/backend.h"
#include "optim/optimizer.h"

namespace comm = trainer::comm;
namespace optim = trainer::optim;
using Catch::Matchers::Contains;

namespace {

constexpr int64_t kN = 1001;  // divisible by neither 3 nor 2: shards of unequal sizes

std::vector<float> random_floats(std::mt19937& rng, int64_t n, float scale) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<float> slice(const std::vector<float>& v, int64_t begin, int64_t end) {
  return std::vector<float>(v.begin() + begin, v.begin() + end);
}

std::string bytes_of(const comm::GapAwareDamping& g) {
  std::ostringstream out;
  g.save(out);
  return out.str();
}

// One model's run on its own: `steps` updates of the whole, observed by the gap-aware average.
struct Whole {
  std::unique_ptr<optim::Optimizer> optimizer;
  comm::GapAwareDamping gap{kN};
  std::vector<float> params;
};

}  // namespace

TEST_CASE("async_ps servers re-split: 3 servers' shards joined and cut for 2 keep every bit", "[elastic][async_ps]") {
  for (const char* name : {"sgd", "adam"}) {
    SECTION(name) {
      auto& backend = trainer::models::cpu_backend();
      optim::OptimizerOptions options;
      options.name = name;
      options.momentum = 0.9;
      options.weight_decay = 1e-3;
      std::mt19937 rng(11);
      std::vector<std::vector<float>> grads;
      for (int k = 0; k < 3; ++k) grads.push_back(random_floats(rng, kN, 1.f));
      const double lrs[3] = {0.1, 0.05, 0.02};

      // The reference: one optimizer over the whole model, two updates.
      Whole whole;
      whole.optimizer = optim::make_optimizer(backend, options, kN);
      whole.params = random_floats(rng, kN, 0.5f);
      const std::vector<float> initial = whole.params;
      for (int k = 0; k < 2; ++k) {
        const std::vector<float> before = whole.params;
        whole.optimizer->step(whole.params.data(), grads[k].data(), lrs[k]);
        whole.gap.observe(before.data(), whole.params.data(), lrs[k]);
      }

      // 3 servers, each its shard of the same updates, saved as a checkpoint at global step 4 of 2 workers.
      const int64_t step = 4, version = 9;
      std::vector<comm::PsServerPart> saved(3);
      std::vector<std::vector<float>> server_params(3);
      for (int s = 0; s < 3; ++s) {
        const auto [b, e] = comm::PsLayout::shard(kN, 3, s);
        auto opt = optim::make_optimizer(backend, options, e - b);
        std::vector<float> shard = slice(initial, b, e);
        comm::GapAwareDamping gap(e - b);
        for (int k = 0; k < 2; ++k) {
          const std::vector<float> before = shard;
          opt->step(shard.data(), slice(grads[k], b, e).data(), lrs[k]);
          gap.observe(before.data(), shard.data(), lrs[k]);
        }
        // A server's stores hold the whole model, up to date only in its own shard.
        server_params[s] = random_floats(rng, kN, 3.f);
        std::copy(shard.begin(), shard.end(), server_params[s].begin() + b);
        comm::PsServerState& st = saved[s].state;
        st.workers = 2, st.servers = 3, st.version = version, st.pushes = step * 2;
        st.total_steps = 20, st.steps_per_epoch = 10, st.next = 1, st.clocks = {3, 5};
        st.gap = gap;
        // Through the checkpoint's bytes, as a server reads them back.
        std::ostringstream out;
        st.write(out);
        std::istringstream in(out.str());
        saved[s].state = comm::PsServerState::read(in);
        saved[s].optimizer = opt->element_state();
        saved[s].optimizer_steps = opt->step_count();
      }

      const comm::PsServerPart joined = comm::join_ps_servers(saved);
      CHECK(same_bits(comm::join_shards({&server_params[0], &server_params[1], &server_params[2]}), whole.params));
      const std::vector<std::vector<float>> reference = whole.optimizer->element_state();
      REQUIRE(joined.optimizer.size() == reference.size());
      REQUIRE(joined.optimizer.size() == (std::string(name) == "adam" ? 2u : 1u));
      for (size_t k = 0; k < reference.size(); ++k) CHECK(same_bits(joined.optimizer[k], reference[k]));
      CHECK(joined.optimizer_steps == 2);
      REQUIRE(joined.state.gap);
      CHECK(bytes_of(*joined.state.gap) == bytes_of(whole.gap));

      // Cut for 2 servers of 3 workers (5 processes), through each new optimizer's own bytes; the
      // new shards joined again are the same bits, and their next update is the whole model's.
      const comm::PsLayout layout = comm::PsLayout::make(5, 2);
      std::vector<comm::PsServerPart> again(2);
      std::vector<float> continued;
      for (int s = 0; s < 2; ++s) {
        comm::PsServerPart part = comm::split_ps_servers(joined, kN, layout, s, step);
        const comm::PsServerState& st = part.state;
        CHECK(st.workers == 3);
        CHECK(st.servers == 2);
        CHECK(st.version == version);
        CHECK(st.pushes == step * 3);
        CHECK(st.clocks == std::vector<int64_t>{step, step, step});
        CHECK(st.next == 0);
        CHECK(st.total_steps == 20);
        CHECK(st.steps_per_epoch == 10);
        const auto [b, e] = comm::PsLayout::shard(kN, 2, s);
        auto opt = optim::make_optimizer(backend, options, e - b);
        opt->set_element_state(part.optimizer, part.optimizer_steps);
        std::ostringstream out;
        opt->save(out);
        auto loaded = optim::make_optimizer(backend, options, e - b);
        std::istringstream in(out.str());
        loaded->load(in);
        again[s].optimizer = loaded->element_state();
        again[s].optimizer_steps = loaded->step_count();
        again[s].state = st;
        std::vector<float> shard = slice(whole.params, b, e);
        loaded->step(shard.data(), slice(grads[2], b, e).data(), lrs[2]);
        continued.insert(continued.end(), shard.begin(), shard.end());
      }
      const comm::PsServerPart rejoined = comm::join_ps_servers(again);
      for (size_t k = 0; k < reference.size(); ++k) CHECK(same_bits(rejoined.optimizer[k], reference[k]));
      CHECK(bytes_of(*rejoined.state.gap) == bytes_of(whole.gap));
      whole.optimizer->step(whole.params.data(), grads[2].data(), lrs[2]);
      CHECK(same_bits(continued, whole.params));
    }
  }
}

TEST_CASE("async_ps servers re-split: servers that disagree, or pushes off the global step, are refused",
          "[elastic][async_ps]") {
  std::vector<comm::PsServerPart> saved(2);
  for (comm::PsServerPart& p : saved) {
    p.state.workers = 2, p.state.servers = 2, p.state.version = 6, p.state.pushes = 6;
    p.state.clocks = {3, 3};
    p.optimizer = {std::vector<float>(5, 1.f)};
    p.optimizer_steps = 6;
  }
  saved[1].state.version = 7;
  CHECK_THROWS_WITH(comm::join_ps_servers(saved), Contains("server 1 of 2 saved version 7"));
  saved[1].state.version = 6;
  const comm::PsServerPart joined = comm::join_ps_servers(saved);
  CHECK(joined.optimizer[0].size() == 10);
  // 6 pushes of 2 workers are global step 3, not 4.
  CHECK_THROWS_WITH(comm::split_ps_servers(joined, 10, comm::PsLayout::make(3, 1), 0, 4),
                    Contains("holds 6 pushes of 2 workers, expected 8"));
  CHECK_THROWS_WITH(comm::split_ps_servers(joined, 12, comm::PsLayout::make(3, 1), 0, 3),
                    Contains("covers 10 parameters, the model has 12"));
}
