// DiLoCo and the async parameter server's worker on device buffers: the CPU backend dressed as a
// device (device_like_backend.h) runs every device branch, and each must give the host path's
// bits. DiLoCo (comm/sync/methods/outer/diloco.h): theta_outer, its outer optimizer and the pseudo-gradient in
// "device" memory, the subtraction, the outer step and the mixing as backend ops, and the outer
// allreduce either on the device communicator (inline, the low-bit codec as backend ops) or on a
// host copy (an overlapped transfer: outer_transfer.h). Per step the parameters, the BN
// statistics and the bytes sent and received equal the host run's, and so does the saved state; a
// checkpoint taken with a fragment in flight resumes across the two. The async_ps worker stages its
// push and pull (async_ps.h): against a server on the last rank, the parameters it pulls equal the
// host worker's, with only the gradient and the statistics copied out. SparseLoCo keeps its state on
// the device and stages only each synced fragment for its codec. Run under mpiexec with P = 1, 2 and 3.
#include <catch2/catch.hpp>

#include <random>
#include <sstream>
#include <thread>
#include <tuple>
#include <vector>

#include "comm/communicator.h"
#include "comm/staged_communicator.h"
#include "comm/sync/methods/async_ps/async_ps.h"
#include "comm/sync/methods/async_ps/async_ps_server.h"
#include "models/parameters.h"
#include "comm/sync/methods/outer/diloco.h"
#include "comm/sync/registry.h"
#include "comm/sync/methods/outer/sparseloco.h"
#include "tests/device_like_backend.h"
#include "tests/device_like_communicator.h"
#include "tests/tiny_views.h"

using namespace trainer;
using models::ParamView;

namespace {

// The overlapped transfers need MPI_THREAD_MULTIPLE, as the trainer asks for it in such runs.
const bool kConcurrentCalls = (comm::request_concurrent_calls(), true);


// One rank's model as the host sees it after each step: parameters and BN statistics, and the bytes
// the step sent and received.
struct Trace {
  std::vector<std::vector<float>> params, state;
  std::vector<int64_t> sent, received;
};

// Steps [from, to) of `sync`, whose buffers live in `memory`: each step the "inner optimizer" (plain
// SGD on a gradient drawn from (step, rank)) runs on the host, and the buffers go to `memory` and
// back around the method's calls, so both runs see the same values. `params`, `state`: the rank's
// model, carried from call to call.
Trace train(comm::GradientSync& sync, models::DeviceMemory& memory, const std::vector<ParamView>& views, int from,
            int to, std::vector<float>& params, std::vector<float>& state) {
  const int64_t n = static_cast<int64_t>(params.size()), n_state = static_cast<int64_t>(state.size());
  const int rank = comm::world().rank();
  auto* d_params = static_cast<float*>(memory.allocate(n * sizeof(float)));
  auto* d_grads = static_cast<float*>(memory.allocate(n * sizeof(float)));
  auto* d_state = static_cast<float*>(memory.allocate(n_state * sizeof(float)));
  std::vector<float> grads(static_cast<size_t>(n));
  Trace trace;
  int64_t sent = 0, received = 0;
  comm::world().log().take_totals(sent, received);
  for (int step = from; step < to; ++step) {
    std::mt19937 rng(1000 * step + rank);
    std::normal_distribution<float> normal;
    for (float& g : grads) g = normal(rng);
    for (float& s : state) s += 0.25f * normal(rng);
    models::copy_to_device(memory, params.data(), n, d_params);
    models::copy_to_device(memory, grads.data(), n, d_grads);
    models::copy_to_device(memory, state.data(), n_state, d_state);
    comm::SyncBuffers b{d_params, d_grads, n, d_state, n_state, &views};
    sync.reduce(b, step);
    models::copy_to_host(memory, d_grads, n, grads.data());
    models::copy_to_host(memory, d_params, n, params.data());
    for (int64_t i = 0; i < n; ++i) params[i] -= 0.1f * grads[i];
    models::copy_to_device(memory, params.data(), n, d_params);
    sync.after_step(b, step);
    models::copy_to_host(memory, d_params, n, params.data());
    models::copy_to_host(memory, d_state, n_state, state.data());
    comm::world().log().take_totals(sent, received);
    trace.params.push_back(params);
    trace.state.push_back(state);
    trace.sent.push_back(sent);
    trace.received.push_back(received);
  }
  memory.free(d_params);
  memory.free(d_grads);
  memory.free(d_state);
  return trace;
}

void check_same_steps(const Trace& a, const Trace& b) {
  REQUIRE(a.params.size() == b.params.size());
  for (size_t step = 0; step < a.params.size(); ++step) {
    INFO("step " << step);
    CHECK(a.params[step] == b.params[step]);
    CHECK(a.state[step] == b.state[step]);
    CHECK(a.sent[step] == b.sent[step]);
    CHECK(a.received[step] == b.received[step]);
  }
}

std::string saved(const comm::GradientSync& sync) {
  std::ostringstream out;
  sync.save(out);
  return out.str();
}

struct Variant {
  const char* name;
  int64_t fragments, delay;
  double mixing;
  comm::OuterDType dtype;
  bool overlap;
  comm::WireDType wire = comm::WireDType::kF32;  // the dense warmup's buckets
};

// Period 4 with a dense warmup of 2: outer steps from step 5 on, fragments in flight at odd steps
// with a delay.
comm::SyncOptions diloco_options(const Variant& v, models::Backend* backend) {
  comm::SyncOptions o;
  o.method = "diloco";
  o.dense_warmup_steps = 2;
  o.set("period", 4);
  o.set("fragments", v.fragments);
  o.set("sync_delay", v.delay);
  o.set("mixing", v.mixing);
  o.set("outer_momentum", 0.5);
  o.set("outer_dtype", comm::outer_dtype_name(v.dtype));
  o.overlap = v.overlap;
  o.wire_dtype = comm::wire_dtype_name(v.wire);
  o.backend = backend;
  return o;
}

const Variant kVariants[] = {
    {"plain, fp32 on the device communicator", 1, 0, 0.0, comm::OuterDType::kF32, false},
    {"streaming, overlapped fp32 on a host copy", 2, 1, 0.5, comm::OuterDType::kF32, true},
    {"streaming, fp8", 2, 1, 0.25, comm::OuterDType::kFP8, true},
    {"two fragments, int8 inline on the device", 2, 0, 0.0, comm::OuterDType::kInt8, false},
    {"delayed bf16 inline", 2, 1, 1.0, comm::OuterDType::kBF16, false},
    {"a warmup through bf16 on the device", 1, 0, 0.0, comm::OuterDType::kF32, false, comm::WireDType::kBF16},
};

}  // namespace

TEST_CASE("DiLoCo on device buffers gives the host path's bits", "[diloco][device]") {
  REQUIRE(kConcurrentCalls);
  const auto views = testing::tiny_views();
  const int64_t n = views.back().offset + views.back().numel();
  constexpr int kSteps = 14;
  for (const Variant& v : kVariants) {
    SECTION(v.name) {
      models::DeviceLikeCpu device;
      auto device_comm = testing::device_like_communicator(device);
      auto host = comm::make_gradient_sync(diloco_options(v, nullptr), comm::world(), n, &views);
      auto on_device = comm::make_gradient_sync(diloco_options(v, &device), *device_comm, n, &views);
      std::vector<float> host_params(n, 0.5f), host_state(6, 1.f), device_params = host_params,
                                                                     device_state = host_state;
      const Trace a = train(*host, models::host_memory(), views, 0, kSteps, host_params, host_state);
      const Trace b = train(*on_device, device, views, 0, kSteps, device_params, device_state);
      check_same_steps(a, b);
      // What the method itself copied, beyond the harness's 3n + 6 floats each way per step: nothing
      // when the allreduce runs inline on the device communicator (the low-bit codec as backend
      // ops), else the fragments' pseudo-gradients for the overlapped transfer's host copy.
      const int64_t harness = kSteps * (3 * n + 6) * 4;
      const int64_t to_host = device.memory.to_host - harness, to_device = device.memory.to_device - harness;
      CHECK(to_host == to_device);
      if (!v.overlap) CHECK(to_host == 0);
      else CHECK((to_host > 0 && to_host < kSteps * n));
      CHECK(saved(*host) == saved(*on_device));  // theta_outer, the outer momentum, a fragment in flight
    }
  }
}

// SparseLoCo (comm/sync/methods/outer/sparseloco.h) on device buffers: theta_outer, the accumulator and the
// element-wise steps on the "device", the codec on a host copy of each synced fragment. Period 4
// after a dense warmup of 2, 2% of each chunk in 2 bits; plain, and streaming with an overlapped delay.
TEST_CASE("SparseLoCo on device buffers gives the host path's bits, copying only the synced fragments",
          "[sparseloco][device]") {
  REQUIRE(kConcurrentCalls);
  const auto views = testing::tiny_views();
  const int64_t n = views.back().offset + views.back().numel();
  constexpr int kSteps = 14;
  for (const auto& [fragments, delay, overlap] : std::vector<std::tuple<int64_t, int64_t, bool>>{{1, 0, false}, {2, 1, true}}) {
    DYNAMIC_SECTION("fragments " << fragments << ", delay " << delay) {
      auto options = [&](models::Backend* backend) {
        comm::SyncOptions o;
        o.method = "sparseloco";
        o.dense_warmup_steps = 2;
        o.set("period", 4);
        o.set("fragments", fragments);
        o.set("sync_delay", delay);
        o.set("density", 0.02);
        o.set("outer_lr", 1.0);
        o.overlap = overlap;
        o.backend = backend;
        return o;
      };
      models::DeviceLikeCpu device;
      auto device_comm = testing::device_like_communicator(device);
      auto host = comm::make_gradient_sync(options(nullptr), comm::world(), n, &views);
      auto on_device = comm::make_gradient_sync(options(&device), *device_comm, n, &views);
      std::vector<float> host_params(n, 0.5f), host_state(6, 1.f), device_params = host_params,
                                                                     device_state = host_state;
      const Trace a = train(*host, models::host_memory(), views, 0, kSteps, host_params, host_state);
      const Trace b = train(*on_device, device, views, 0, kSteps, device_params, device_state);
      check_same_steps(a, b);
      // Beyond the harness's copies: per sync of a fragment, its accumulator out and back and its
      // sum in; three rounds of syncs here, so under 3 x 2n floats in and 3 x n out.
      const int64_t harness = kSteps * (3 * n + 6) * 4;
      const int64_t to_host = device.memory.to_host - harness, to_device = device.memory.to_device - harness;
      CHECK(to_host > 0);
      CHECK(to_host <= 3 * n * 4);
      CHECK(to_device == 2 * to_host);
      CHECK(saved(*host) == saved(*on_device));  // theta_outer, the accumulator, payloads in flight
    }
  }
}

TEST_CASE("on a device communicator a delayed transfer still overlaps, on MPI beside it", "[diloco][device]") {
  // The trainer hands a device method the device's communicator (NCCL, or MPI staged as here); the
  // transfer's thread runs on its MPI side, so it is MPI's thread level that decides.
  const auto views = testing::tiny_views();
  const int64_t n = views.back().offset + views.back().numel();
  models::DeviceLikeCpu device;
  comm::StagedCommunicator staged(comm::world(), device);
  comm::SyncOptions o = diloco_options(kVariants[1], &device);
  o.dense_warmup_steps = 0;
  auto sync = comm::make_gradient_sync(o, staged, n, &views);
  CHECK(dynamic_cast<const comm::Diloco&>(*sync).overlapped());
  CHECK_THAT(sync->describe(), Catch::Contains("the transfer runs on a communication thread"));
}

TEST_CASE("a DiLoCo checkpoint with a fragment in flight resumes across host and device", "[diloco][device]") {
  const auto views = testing::tiny_views();
  const int64_t n = views.back().offset + views.back().numel();
  const Variant v = kVariants[2];  // streaming fp8: after step 6 fragment 0 is in flight
  models::DeviceLikeCpu device;
  for (const bool device_first : {true, false}) {
    INFO("first half on the " << (device_first ? "device" : "host"));
    models::Backend* first_backend = device_first ? &device : nullptr;
    models::Backend* second_backend = device_first ? nullptr : &device;
    models::DeviceMemory& first_memory = device_first ? static_cast<models::DeviceMemory&>(device) : models::host_memory();
    models::DeviceMemory& second_memory = device_first ? models::host_memory() : static_cast<models::DeviceMemory&>(device);

    auto straight = comm::make_gradient_sync(diloco_options(v, nullptr), comm::world(), n, &views);
    std::vector<float> params(n, 0.5f), state(6, 1.f);
    const Trace whole = train(*straight, models::host_memory(), views, 0, 12, params, state);

    auto device_comm = testing::device_like_communicator(device);
    comm::Communicator& first_comm = device_first ? *device_comm : comm::world();
    comm::Communicator& second_comm = device_first ? comm::world() : *device_comm;
    auto first = comm::make_gradient_sync(diloco_options(v, first_backend), first_comm, n, &views);
    std::vector<float> resumed_params(n, 0.5f), resumed_state(6, 1.f);
    train(*first, first_memory, views, 0, 6, resumed_params, resumed_state);
    const std::string checkpoint = saved(*first);
    auto second = comm::make_gradient_sync(diloco_options(v, second_backend), second_comm, n, &views);
    std::istringstream in(checkpoint);
    second->load(in);
    const Trace rest = train(*second, second_memory, views, 6, 12, resumed_params, resumed_state);
    CHECK(rest.params.back() == whole.params.back());
    CHECK(rest.state.back() == whole.state.back());
    CHECK(saved(*second) == saved(*straight));
  }
}

namespace {

// One async_ps round of `steps` steps at P ranks: the last rank serves (SGD at lr 0.1 from
// parameters 0.5), the others push gradients drawn from (step, rank) from buffers in `memory`,
// with deterministic service (rank order) so the two rounds apply the same pushes in the same order.
// Returns what each worker pulled after each step (empty on the server).
std::vector<std::vector<float>> async_ps_round(models::DeviceMemory& memory, int steps) {
  comm::Communicator& world = comm::world();
  const int64_t n = 1000, n_state = 6;
  comm::SyncOptions o;
  o.method = "async_ps";
  o.set("servers", 1);
  o.set("deterministic", true);
  o.recipe.total_steps = steps;
  o.recipe.steps_per_epoch = steps;
  std::vector<std::vector<float>> pulled;
  if (world.rank() == world.size() - 1) {
    models::ParameterStore params(true), buffers(false);
    params.declare("w", {n});
    buffers.declare("bn", {n_state});
    params.allocate(models::host_memory());
    buffers.allocate(models::host_memory());
    std::fill(params.values(), params.values() + n, 0.5f);
    std::fill(buffers.values(), buffers.values() + n_state, 1.f);
    comm::PsServerOptions server_options;
    server_options.sync = o;
    server_options.schedule.base_lr = 0.1;
    comm::ParameterServer server(server_options, world, models::cpu_backend(), params, buffers);
    server.serve(0, 0, [](int64_t) {});
    return pulled;
  }
  comm::AsyncPsWorker worker(world, memory, o, n);
  auto* params = static_cast<float*>(memory.allocate(n * sizeof(float)));
  auto* grads = static_cast<float*>(memory.allocate(n * sizeof(float)));
  auto* state = static_cast<float*>(memory.allocate(n_state * sizeof(float)));
  std::vector<float> host(n), host_state(n_state, 1.f);
  models::copy_to_device(memory, host_state.data(), n_state, state);
  for (int step = 0; step < steps; ++step) {
    std::mt19937 rng(77 * step + world.rank());
    std::normal_distribution<float> normal;
    for (float& g : host) g = normal(rng);
    models::copy_to_device(memory, host.data(), n, grads);
    comm::SyncBuffers b{params, grads, n, state, n_state, nullptr};
    worker.reduce(b, step);
    models::copy_to_host(memory, params, n, host.data());
    pulled.push_back(host);
  }
  memory.free(params);
  memory.free(grads);
  memory.free(state);
  return pulled;
}

}  // namespace

TEST_CASE("an async_ps worker on device buffers pulls what the host worker pulls",
          "[async_ps][device][some_world_sizes][P2][P3]") {
  REQUIRE(comm::world().size() >= 2);  // a worker and a server at least
  const auto on_host = async_ps_round(models::host_memory(), 6);
  models::DeviceLikeCpu device;
  const auto on_device = async_ps_round(device, 6);
  CHECK(on_host == on_device);
  if (comm::world().rank() == comm::world().size() - 1) return;
  // What crossed per step beyond the harness's gradient in and parameters out: the gradient and the
  // statistics to the host, the parameters and the statistics back; never the parameters out.
  const int64_t n = 1000, n_state = 6, steps = 6;
  CHECK(device.memory.to_host == steps * (n + (n + n_state)) * 4);
  CHECK(device.memory.to_device == n_state * 4 + steps * (n + (n + n_state)) * 4);
}
