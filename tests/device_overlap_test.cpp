// Dense sync on device buffers, overlapped or not, in every wire format: the CPU backend dressed as
// a device (device_like_backend.h, whose second stream is synchronous) runs the device branches of
// DenseSync and BucketReducer (comm/sync/methods/dense/bucket_reducer.h, OnDevice), and every step must give the
// host path's bits, the same comm log bytes, and the same verdict on a non-finite tensor.
//   - host staging (StagedCommunicator): the communication thread runs each bucket's allreduce;
//   - an "enqueuing" communicator (the staged one, saying enqueues() as NCCL does): the training
//     thread runs each bucket's job as backward hands it over, no thread, as with NCCL on a GPU.
// The 16-bit casts are the backend's to_half / from_half. Run under mpiexec with P = 2 and 3.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>

#include "comm/comm_log.h"
#include "comm/communicator.h"
#include "comm/staged_communicator.h"
#include "comm/sync/methods/dense/dense.h"
#include "tests/device_like_backend.h"

using namespace trainer;

namespace {

// A communicator that forwards every call and says that its collectives only enqueue (as NCCL's
// do): DenseSync then runs its overlapped buckets on the training thread (BucketReducer's NCCL path).
class Enqueuing final : public comm::Communicator {
 public:
  explicit Enqueuing(std::unique_ptr<comm::Communicator> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  int local_size() const override { return inner_->local_size(); }
  int local_rank() const override { return inner_->local_rank(); }
  comm::CommLog& log() override { return inner_->log(); }
  void allreduce(void* buffer, int64_t count, comm::DType type, comm::ReduceOp op, const char* tag) override {
    inner_->allreduce(buffer, count, type, op, tag);
  }
  void allgather(const void* send, int64_t count, void* recv, comm::DType type, const char* tag) override {
    inner_->allgather(send, count, recv, type, tag);
  }
  void allgatherv(const void* send, int64_t send_count, void* recv, const std::vector<int64_t>& recv_counts,
                  comm::DType type, const char* tag) override {
    inner_->allgatherv(send, send_count, recv, recv_counts, type, tag);
  }
  void alltoall(const void* send, int64_t count, void* recv, comm::DType type, const char* tag) override {
    inner_->alltoall(send, count, recv, type, tag);
  }
  void broadcast(void* buffer, int64_t count, comm::DType type, int root, const char* tag) override {
    inner_->broadcast(buffer, count, type, root, tag);
  }
  void barrier(const char* tag) override { inner_->barrier(tag); }
  std::unique_ptr<comm::Communicator> split(int color, int key) override { return inner_->split(color, key); }
  comm::Request isend(const void* buffer, int64_t count, comm::DType type, int peer, int channel,
                      const char* tag) override {
    return inner_->isend(buffer, count, type, peer, channel, tag);
  }
  comm::Request irecv(void* buffer, int64_t count, comm::DType type, int peer, int channel, const char* tag) override {
    return inner_->irecv(buffer, count, type, peer, channel, tag);
  }
  void wait(comm::Request& request) override { inner_->wait(request); }
  comm::Completion wait_completion(comm::Request& request) override { return inner_->wait_completion(request); }
  void wait_all(std::vector<comm::Request>& requests) override { inner_->wait_all(requests); }
  comm::Communicator& host_side() override { return inner_->host_side(); }
  std::unique_ptr<comm::Communicator> on_stream(models::DeviceStream& stream) override {
    auto inner = inner_->on_stream(stream);
    return inner ? std::make_unique<Enqueuing>(std::move(inner)) : nullptr;
  }
  bool enqueues() const override { return true; }
  [[noreturn]] void abort(int exit_code) override {
    inner_->abort(exit_code);
    std::abort();  // the inner abort does not return
  }

 private:
  std::unique_ptr<comm::Communicator> inner_;
};

// Four tensors of odd sizes; buckets small enough that there are several.
std::vector<models::ParamView> make_views(int64_t& n) {
  std::vector<models::ParamView> views;
  n = 0;
  for (int64_t size : {1201, 3001, 17, 2503}) {
    views.push_back({"t" + std::to_string(views.size()), n, models::Shape{size}});
    n += size;
  }
  return views;
}

// Values that need rounding in bf16 and fp16, subnormals of both, and large ones (fp16 divides
// by P first, so these stay finite).
std::vector<float> gradient(int64_t n, int step) {
  std::mt19937 rng(7919 * step + 31 * comm::world().rank() + 5);
  std::normal_distribution<float> normal;
  std::vector<float> g(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const float v = normal(rng);
    g[i] = i % 13 == 0 ? v * 1e-6f : i % 17 == 0 ? v * 3e-8f : i % 29 == 0 ? v * 9000.f : v;
  }
  return g;
}

struct Outcome {
  std::vector<std::vector<float>> outputs;
  std::vector<int> nonfinite;  // finish_early_sends per step (-1 without overlap)
  int64_t sent = 0;
};

// Steps of dense sync, backward simulated: the gradient lands, then each tensor is reported final
// from the last one to the first (gradients_ready), as the models do.
Outcome run(comm::Communicator& comm, models::Backend& backend, comm::WireDType wire, bool overlap,
            const std::vector<models::ParamView>& views, int64_t n, int nan_step = -1) {
  comm::DenseSync sync(comm, n, /*bucket_mb=*/0.016, backend, wire, comm::DenseBuckets{0.006, overlap, &views});
  Outcome out;
  std::vector<float> params(static_cast<size_t>(n), 0.f);
  float* grads = static_cast<float*>(backend.allocate(sizeof(float) * n));
  int64_t sent = 0, received = 0;
  comm.log().take_totals(sent, received);
  for (int step = 0; step < 4; ++step) {
    std::vector<float> g = gradient(n, step);
    if (step == nan_step && comm.rank() == comm.size() - 1) g[views[2].offset + 3] = std::nanf("");
    comm::SyncBuffers b{params.data(), grads, n, nullptr, 0, &views};
    const bool early = sync.begin_step(b, step);
    models::copy_to_device(backend, g.data(), n, grads);
    for (size_t t = views.size(); t-- > 0;) sync.gradients_ready(views[t].offset);
    out.nonfinite.push_back(early ? sync.finish_early_sends() : -1);
    sync.reduce(b, step);
    out.outputs.emplace_back(static_cast<size_t>(n));
    models::copy_to_host(backend, grads, n, out.outputs.back().data());
  }
  comm.log().take_totals(sent, received);
  out.sent = sent;
  backend.free(grads);
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
}

}  // namespace

TEST_CASE("dense sync on device buffers gives the host's bits, overlapped or not, in every wire format",
          "[dense][overlap][device]") {
  comm::Communicator& world = comm::world();
  int64_t n = 0;
  const auto views = make_views(n);
  models::DeviceLikeCpu device;
  for (const comm::WireDType wire : {comm::WireDType::kF32, comm::WireDType::kBF16, comm::WireDType::kF16}) {
    const Outcome host = run(world, models::cpu_backend(), wire, false, views, n);
    for (const bool enqueuing : {false, true}) {
      for (const bool overlap : {false, true}) {
        INFO("wire " << comm::wire_dtype_name(wire) << (enqueuing ? ", enqueuing" : ", staged")
                     << (overlap ? ", overlapped" : ", after backward"));
        std::unique_ptr<comm::Communicator> comm = std::make_unique<comm::StagedCommunicator>(world, device);
        if (enqueuing) comm = std::make_unique<Enqueuing>(std::move(comm));
        const Outcome got = run(*comm, device, wire, overlap, views, n);
        for (size_t s = 0; s < host.outputs.size(); ++s) CHECK(same_bits(got.outputs[s], host.outputs[s]));
        CHECK(got.sent == host.sent);
      }
    }
  }
}

TEST_CASE("an overlapped device step names the non-finite tensor as the host's does", "[dense][overlap][device]") {
  comm::Communicator& world = comm::world();
  int64_t n = 0;
  const auto views = make_views(n);
  models::DeviceLikeCpu device;
  const Outcome host = run(world, models::cpu_backend(), comm::WireDType::kBF16, true, views, n, 2);
  for (const bool enqueuing : {false, true}) {
    std::unique_ptr<comm::Communicator> comm = std::make_unique<comm::StagedCommunicator>(world, device);
    if (enqueuing) comm = std::make_unique<Enqueuing>(std::move(comm));
    const Outcome got = run(*comm, device, comm::WireDType::kBF16, true, views, n, 2);
    CHECK(got.nonfinite == host.nonfinite);
    const bool last = world.rank() == world.size() - 1;
    CHECK(got.nonfinite[2] == (last ? 2 : -1));
    CHECK(got.nonfinite[1] == -1);
  }
}

TEST_CASE("dense says where its overlap runs", "[dense][overlap][device]") {
  comm::Communicator& world = comm::world();
  int64_t n = 0;
  const auto views = make_views(n);
  models::DeviceLikeCpu device;
  comm::StagedCommunicator staged(world, device);
  comm::DenseSync on_device(staged, n, 0.016, device, comm::WireDType::kF16, comm::DenseBuckets{0.006, true, &views});
  CHECK(on_device.overlap_plan().find("second stream") != std::string::npos);
  CHECK(on_device.overlap_plan().find("communication thread") != std::string::npos);
  Enqueuing enqueuing(std::make_unique<comm::StagedCommunicator>(world, device));
  comm::DenseSync enqueued(enqueuing, n, 0.016, device, comm::WireDType::kF32, comm::DenseBuckets{0.006, true, &views});
  CHECK(enqueued.overlap_plan().find("enqueued") != std::string::npos);
  // A communicator that cannot run on a second stream (MPI on host memory): overlap off, saying why.
  comm::DenseSync no_stream(world, n, 0.016, device, comm::WireDType::kF32, comm::DenseBuckets{0.006, true, &views});
  CHECK(no_stream.overlap_plan().find("off (the communicator cannot run on a second stream)") == 0);
}
