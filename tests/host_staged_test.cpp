// A method that computes on the host, run on a device's buffers through host copies
// (comm/sync/wrappers/host_staged.h): host memory that counts its copies stands in for the device, so the
// test sees that every value the method reads went through copy_to_host and every value it wrote
// came back through copy_to_device. Over 12 steps (a dense warmup of 3, then the method) the
// parameters, gradients and BN statistics equal the same method run on host buffers bit for bit,
// and so does the saved state. Run under mpiexec with P = 2 and 3.
#include <catch2/catch.hpp>

#include <random>
#include <sstream>

#include "comm/communicator.h"
#include "comm/sync/wrappers/host_staged.h"
#include "comm/sync/registry.h"
#include "tests/counting_memory.h"
#include "tests/tiny_views.h"
#include "tests/method_keys.h"

using namespace trainer;
using models::ParamView;

namespace {


// One rank's model: parameters, gradient and BN statistics, each step's gradient drawn from
// (step, rank), the same for both runs; the "optimizer" is plain SGD so parameters move.
struct Replica {
  std::vector<float> params, grads, state;
  comm::SyncBuffers buffers(const std::vector<ParamView>& views) {
    return {params.data(), grads.data(), static_cast<int64_t>(params.size()), state.data(),
            static_cast<int64_t>(state.size()), &views};
  }
};

Replica train(comm::GradientSync& sync, const std::vector<ParamView>& views, int steps) {
  const int64_t n = views.back().offset + views.back().numel();
  const int rank = comm::world().rank();
  Replica r{std::vector<float>(n, 0.5f), std::vector<float>(n), std::vector<float>(6, 1.f + rank)};
  for (int step = 0; step < steps; ++step) {
    std::mt19937 rng(1000 * step + rank);
    std::normal_distribution<float> normal;
    for (float& g : r.grads) g = normal(rng);
    for (float& s : r.state) s += 0.25f * normal(rng);
    comm::SyncBuffers b = r.buffers(views);
    sync.reduce(b, step);
    for (int64_t i = 0; i < n; ++i) r.params[i] -= 0.1f * r.grads[i];
    sync.after_step(b, step);
  }
  return r;
}

std::string saved(const comm::GradientSync& sync) {
  std::ostringstream out;
  sync.save(out);
  return out.str();
}

}  // namespace

TEST_CASE("every host method through host copies equals the method on host buffers, bit for bit", "[staged]") {
  const auto views = testing::tiny_views();
  const int64_t n = views.back().offset + views.back().numel();
  constexpr int kSteps = 12;
  for (const char* name : {"oktopk", "topka", "gaussiank", "powersgd", "local_sgd", "diloco"}) {
    SECTION(name) {
      comm::SyncOptions o;
      o.method = name;
      testing::set_if_own(o, "density", 0.1);
      o.dense_warmup_steps = 3;
      testing::set_if_own(o, "period", 4);
      testing::set_if_own(o, "outer_momentum", 0.5);
      const comm::SyncMethod& spec = comm::sync_method(name);
      auto plain = comm::make_gradient_sync(o, comm::world(), n, &views);
      testing::CountingMemory device;
      const bool moves_parameters = !spec.can.keeps_parameters_equal;
      comm::HostStagedSync staged(comm::make_gradient_sync(o, comm::world(), n, &views), device, moves_parameters);

      const Replica a = train(*plain, views, kSteps);
      const Replica b = train(staged, views, kSteps);
      CHECK(a.grads == b.grads);
      CHECK(a.params == b.params);
      CHECK(a.state == b.state);
      CHECK(saved(*plain) == saved(staged));

      // What crossed: the gradient each way every step; a method that syncs parameters also moved
      // the parameters and BN statistics in reduce() and again in after_step().
      const int64_t floats = n + (moves_parameters ? 2 * (n + 6) : 0);
      CHECK(staged.bytes_to_host() == kSteps * floats * 4);
      CHECK(staged.bytes_to_device() == kSteps * floats * 4);
      CHECK(device.to_host == staged.bytes_to_host());
      CHECK(device.to_device == staged.bytes_to_device());
      CHECK_THAT(staged.describe(), Catch::Contains("through host memory (runtime.device = \"counting\""));
    }
  }
}
