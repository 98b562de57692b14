// The staged communicator (comm/staged_communicator.h) over host memory, under mpiexec with 2 to 4
// ranks: every call of the Communicator interface gives the same results and the same log records
// (op tags, kinds, sizes, peers, collective order; times aside) as the MPI communicator it wraps,
// and moves its data through copies to and from its staging buffer. The memory is host memory
// that counts its copies (tests/counting_memory.h), so a staged call that handed the caller's
// (device) buffer to MPI directly would show no copies. The training runs over it are in sync_test.
// Also the choice of communicator (comm/device_communicator.h) where no GPU is involved.
#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include <catch2/catch.hpp>

#include "comm/comm_log.h"
#include "comm/communicator.h"
#include "comm/device_communicator.h"
#include "comm/staged_communicator.h"
#include "tests/counting_memory.h"
#include "tests/skip.h"
#ifdef TRAINER_HAS_CUDA
#include <cuda_runtime.h>

#include "comm/cuda/nccl_communicator.h"
#include "comm/cuda/pinned_host.h"
#include "models/cuda/cuda_device.h"
#endif

using namespace trainer;
using namespace trainer::comm;

namespace {

// Everything the log kept of a script: each call in order, the per-op statistics and the totals.
struct LogCopy {
  std::vector<TracedCall> calls;
  std::vector<OpStats> ops;
  int64_t sent = 0, received = 0;
};

LogCopy logged(const std::function<void()>& run) {
  Communicator& w = world();
  CommLogOptions options;
  options.enabled = true;
  options.trace_first_step = 0;  // every call kept in memory, with its record
  options.trace_last_step = int64_t(1) << 40;
  w.log().open(options, w.rank(), w.size());
  w.log().set_step(3, Phase::kCompressed);
  run();
  LogCopy copy{w.log().traced(), w.log().op_stats()};
  w.log().take_totals(copy.sent, copy.received);
  w.log().open(CommLogOptions{}, w.rank(), w.size());
  return copy;
}

// Collectives in call order, then sends and receives in a fixed order: requests waited on together
// complete (and are logged) in whichever order the network finishes them, with or without staging.
std::vector<TracedCall> canonical(std::vector<TracedCall> calls) {
  const auto p2p = [](const TracedCall& c) { return c.kind == OpKind::kPointToPoint; };
  std::stable_partition(calls.begin(), calls.end(), [&](const TracedCall& c) { return !p2p(c); });
  const auto first_p2p = std::find_if(calls.begin(), calls.end(), p2p);
  std::sort(first_p2p, calls.end(), [](const TracedCall& a, const TracedCall& b) {
    const int op = std::strcmp(a.record.op, b.record.op);
    if (op != 0) return op < 0;
    return std::tie(a.record.peer, a.record.bytes, a.record.bytes_recv) <
           std::tie(b.record.peer, b.record.bytes, b.record.bytes_recv);
  });
  return calls;
}

void check_same_log(const LogCopy& plain_log, const LogCopy& staged_log) {
  const std::vector<TracedCall> plain = canonical(plain_log.calls), staged = canonical(staged_log.calls);
  CHECK(staged.size() == plain.size());
  for (size_t i = 0; i < std::min(plain.size(), staged.size()); ++i) {
    const TracedCall &a = plain[i], &b = staged[i];
    INFO("call " << i << ": " << a.record.op);
    CHECK(std::strcmp(a.record.op, b.record.op) == 0);
    CHECK(a.kind == b.kind);
    CHECK(a.collective == b.collective);
    CHECK(a.record.step == b.record.step);
    CHECK(a.record.phase == b.record.phase);
    CHECK(a.record.bytes == b.record.bytes);
    CHECK(a.record.bytes_recv == b.record.bytes_recv);
    CHECK(a.record.peer == b.record.peer);
    CHECK(b.record.t_end_us >= b.record.t_start_us);
  }
  const std::vector<OpStats>&a = plain_log.ops, &b = staged_log.ops;
  CHECK(b.size() == a.size());
  for (const OpStats& s : a) {
    INFO(s.op);
    const auto t = std::find_if(b.begin(), b.end(), [&](const OpStats& x) { return x.op == s.op; });
    REQUIRE(t != b.end());
    CHECK(t->kind == s.kind);
    CHECK(t->calls == s.calls);
    CHECK(t->bytes == s.bytes);
    CHECK(t->bytes_recv == s.bytes_recv);
    CHECK(t->sizes == s.sizes);
  }
  CHECK(staged_log.sent == plain_log.sent);
  CHECK(staged_log.received == plain_log.received);
}

template <typename T>
void append(std::vector<unsigned char>& out, const std::vector<T>& v) {
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  out.insert(out.end(), p, p + v.size() * sizeof(T));
}

// Every call of the interface, with results that depend on every rank's data; returns all that
// arrived, byte for byte, and what the waits reported.
std::vector<unsigned char> script(Communicator& c) {
  const int p = c.size(), me = c.rank();
  std::vector<unsigned char> out;
  // Sums in an order MPI chooses: fractional values, so a different order could show.
  std::vector<float> f(1000);
  for (size_t i = 0; i < f.size(); ++i) f[i] = 0.1f * static_cast<float>((me * 7 + i * 3) % 11) - 0.37f * me;
  c.allreduce(f.data(), 1000, DType::kF32, ReduceOp::kSum, "ALLREDUCE_DENSE");
  append(out, f);
  std::vector<float> m = {1.5f * me, -2.f * me, 3.f - me};
  c.allreduce(m.data(), 3, DType::kF32, ReduceOp::kMax, "ALLREDUCE_MAX");
  append(out, m);
  std::vector<int64_t> lo = {me - 5, 7 * me, int64_t(1) << 40};
  c.allreduce(lo.data(), 3, DType::kI64, ReduceOp::kMin, "ALLREDUCE_MIN");
  append(out, lo);
  std::vector<double> d = {0.1 * me, 1e300, -3.25};
  c.allreduce(d.data(), 3, DType::kF64, ReduceOp::kSum, "ALLREDUCE_F64");
  append(out, d);

  std::vector<int32_t> mine = {me, 10 * me, -me}, all(3 * p, -1);
  c.allgather(mine.data(), 3, all.data(), DType::kI32, "ALLGATHER_COUNTS");
  append(out, all);
  std::vector<float> in_place(5 * p, -1.f);
  for (int i = 0; i < 5; ++i) in_place[me * 5 + i] = me + 0.25f * i;
  c.allgather(in_place.data() + me * 5, 5, in_place.data(), DType::kF32, "ALLGATHER_IN_PLACE");
  append(out, in_place);

  std::vector<int64_t> counts(p);
  int64_t total = 0, offset = 0;
  for (int r = 0; r < p; ++r) {
    counts[r] = r % 3;  // rank 0 (and 3) contribute nothing
    if (r == me) offset = total;
    total += counts[r];
  }
  std::vector<float> vs(counts[me], 0.5f + me), vr(total + 2, -9.f);  // two past the end stay untouched
  c.allgatherv(vs.data(), counts[me], vr.data(), counts, DType::kF32, "ALLGATHERV_FINAL");
  append(out, vr);
  std::vector<float> vr2(total, -1.f);
  for (int64_t i = 0; i < counts[me]; ++i) vr2[offset + i] = 3.f * me + i;
  c.allgatherv(vr2.data() + offset, counts[me], vr2.data(), counts, DType::kF32, "ALLGATHERV_IN_PLACE");
  append(out, vr2);

  std::vector<int64_t> a(2 * p), b(2 * p, -1);
  for (int r = 0; r < p; ++r) a[2 * r] = 100 * me + r, a[2 * r + 1] = -r;
  c.alltoall(a.data(), 2, b.data(), DType::kI64, "ALLTOALL_COUNTS");
  append(out, b);

  std::vector<double> bc(7, -1.0);
  if (me == p - 1)
    for (int i = 0; i < 7; ++i) bc[i] = 1.0 / (i + 1);
  c.broadcast(bc.data(), 7, DType::kF64, p - 1, "BROADCAST_PARAMS");
  append(out, bc);
  c.barrier("BARRIER");

  // A ring: room for 10, 7 arrive; the last 3 keep what they held.
  std::vector<float> send(7), recv(10, -7.f);
  for (int i = 0; i < 7; ++i) send[i] = me * 100.f + i;
  std::vector<Request> rq = {c.irecv(recv.data(), 10, DType::kF32, (me - 1 + p) % p, 5, "IRECV_VALUE"),
                             c.isend(send.data(), 7, DType::kF32, (me + 1) % p, 5, "ISEND_VALUE")};
  c.wait_all(rq);
  append(out, recv);
  // Any source, completed one at a time: who sent and how much.
  std::vector<int32_t> got(4, -1), put = {me, me, me};
  Request r = c.irecv(got.data(), 4, DType::kI32, kAnySource, 6, "IRECV_ANY");
  Request s = c.isend(put.data(), 3, DType::kI32, (me + 1) % p, 6, "ISEND_ANY");
  const Completion from = c.wait_completion(r);
  const Completion sent = c.wait_completion(s);
  append(out, got);
  append(out, std::vector<int64_t>{from.peer, from.count, sent.peer, sent.count});

  // A split: the last rank alone, the others together; records go to the one log.
  std::unique_ptr<Communicator> sub = c.split(me == p - 1 ? 1 : 0, me);
  std::vector<float> s1 = {1.f + me, 2.f};
  sub->allreduce(s1.data(), 2, DType::kF32, ReduceOp::kSum, "ALLREDUCE_SUB");
  sub->broadcast(s1.data(), 1, DType::kF32, 0, "BROADCAST_SUB");
  append(out, s1);

  // Messages cut into pieces by the host communicator.
  const int64_t previous = set_message_piece_bytes(64);
  std::vector<float> big(100);
  for (int i = 0; i < 100; ++i) big[i] = i * 0.5f + me;
  c.allreduce(big.data(), 100, DType::kF32, ReduceOp::kSum, "ALLREDUCE_PIECES");
  std::vector<float> gathered(40 * p);
  c.allgather(big.data(), 40, gathered.data(), DType::kF32, "ALLGATHER_PIECES");
  set_message_piece_bytes(previous);
  append(out, big);
  append(out, gathered);
  return out;
}

}  // namespace

TEST_CASE("staged over host memory: every call's results and records equal the MPI communicator's") {
  Communicator& w = world();
  testing::CountingMemory memory;
  StagedCommunicator staged(w, memory);
  std::vector<unsigned char> plain_out, staged_out;
  const LogCopy plain_log = logged([&] { plain_out = script(w); });
  const LogCopy staged_log = logged([&] { staged_out = script(staged); });
  CHECK(staged_out.size() == plain_out.size());
  CHECK(staged_out == plain_out);
  check_same_log(plain_log, staged_log);
  CHECK(memory.to_host > 0);
  CHECK(memory.to_device > 0);
}

TEST_CASE("a staged collective copies exactly its data out and its result back") {
  Communicator& w = world();
  const int p = w.size(), me = w.rank();
  testing::CountingMemory memory;
  StagedCommunicator staged(w, memory);
  std::vector<float> g(1000, 1.f);
  staged.allreduce(g.data(), 1000, DType::kF32, ReduceOp::kSum, "ALLREDUCE_DENSE");
  CHECK(g[999] == static_cast<float>(p));
  CHECK(memory.to_host == 4000);
  CHECK(memory.to_device == 4000);

  memory.to_host = memory.to_device = 0;
  std::vector<float> one(3, 1.f), all(3 * p);
  staged.allgather(one.data(), 3, all.data(), DType::kF32, "ALLGATHER_COUNTS");
  CHECK(memory.to_host == 12);
  CHECK(memory.to_device == 12 * p);

  // The root's buffer already holds the data: nothing comes back to it.
  memory.to_host = memory.to_device = 0;
  staged.broadcast(g.data(), 10, DType::kF32, 0, "BROADCAST_PARAMS");
  CHECK(memory.to_host == (me == 0 ? 40 : 0));
  CHECK(memory.to_device == (me == 0 ? 0 : 40));

  // The staging buffer only grows: the 4000-byte allreduce sized it, the smaller calls reused it.
  CHECK(staged.staging_bytes() == 4000);
}

TEST_CASE("the sync communicator: MPI itself for host memory, staged MPI for device memory without NCCL") {
  Communicator& w = world();
  // Host memory: the plain communicator serves (no wrapper, no copies, no collective).
  SyncCommunicator host = make_sync_communicator("auto", w, models::host_memory());
  CHECK(host.device == nullptr);
  CHECK_THROWS_WITH(make_sync_communicator("nccl", w, models::host_memory()),
                    Catch::Matchers::Contains("runtime.communicator = \"nccl\""));
  CHECK_THROWS_WITH(make_sync_communicator("gloo", w, models::host_memory()),
                    Catch::Matchers::Contains("runtime.communicator"));
  // Device memory (here one that has no CUDA stream, so NCCL is out in any build): staged, and it
  // moves data through the memory's copies.
  testing::CountingMemory memory;
  for (const char* choice : {"auto", "mpi"}) {
    INFO(choice);
    SyncCommunicator device = make_sync_communicator(choice, w, memory);
    REQUIRE(device.device != nullptr);
    // "mpi through host staging"; a CUDA build stages through pinned host memory and says so.
    CHECK_THAT(device.description,
               Catch::Matchers::StartsWith("mpi through") && Catch::Matchers::Contains("host staging"));
    memory.to_host = 0;
    std::vector<float> g(10, 1.f);
    device.device->allreduce(g.data(), 10, DType::kF32, ReduceOp::kSum, "ALLREDUCE_DENSE");
    CHECK(g[9] == static_cast<float>(w.size()));
    CHECK(memory.to_host == 40);
  }
  CHECK_THROWS_WITH(make_sync_communicator("nccl", w, memory), Catch::Matchers::Contains("runtime.communicator = \"nccl\""));
}

#ifdef TRAINER_HAS_CUDA
// The [cuda] cases are hidden from the world-size runs and run on their own (ctest's
// staged_comm_test_cuda_P2, scripts/gpu_check.sh): without a usable GPU on some rank, every rank
// ends the run as skipped together (exit 77; MPI is finalized by the world's destructor).
namespace {
models::DeviceMemory* this_ranks_gpu_or_skip(Communicator& w) {
  models::DeviceMemory* gpu = nullptr;
  int32_t state[2] = {1, 0};  // {every rank has a GPU (min), some rank failed otherwise (max)}
  std::string why;
  try {
    gpu = &models::cuda::cuda_device(w.local_rank());
  } catch (const std::runtime_error& e) {
    why = e.what();
    state[0] = 0;
    state[1] = why.find("no usable GPU") == std::string::npos;
  }
  w.allreduce(&state[0], 1, DType::kI32, ReduceOp::kMin, "TEST");  // every rank skips, or none
  w.allreduce(&state[1], 1, DType::kI32, ReduceOp::kMax, "TEST");
  // An error other than a missing GPU fails on every rank (a skip would hide it).
  if (state[1]) FAIL("a rank could not open its GPU: " << (why.empty() ? "(another rank)" : why));
  if (!state[0]) trainer::testing::skip_test(why.empty() ? "another rank has no usable GPU" : why);
  return gpu;
}
}  // namespace

// The same contract over real GPU memory, pinned staging and the CUDA device's stream: what the
// lent one-GPU machines run with several ranks on their one GPU (skips without a GPU).
TEST_CASE("staged over CUDA memory: results and records equal MPI's on host copies", "[.][cuda]") {
  Communicator& w = world();
  const int p = w.size(), me = w.rank();
  models::DeviceMemory* gpu = this_ranks_gpu_or_skip(w);
  StagedCommunicator staged(w, *gpu, pinned_host_allocator());
  // Runs `call` on host vectors with `c`; for the staged communicator, through device copies of them.
  struct Buffers {
    std::vector<float> send, recv;
  };
  auto run = [&](Communicator& c, Buffers b, bool device, const std::function<void(Communicator&, float*, float*)>& call) {
    if (!device) {
      call(c, b.send.data(), b.recv.data());
      return b;
    }
    auto* ds = static_cast<float*>(gpu->allocate(b.send.size() * 4 + 4));
    auto* dr = static_cast<float*>(gpu->allocate(b.recv.size() * 4 + 4));
    models::copy_to_device(*gpu, b.send.data(), static_cast<int64_t>(b.send.size()), ds);
    models::copy_to_device(*gpu, b.recv.data(), static_cast<int64_t>(b.recv.size()), dr);
    call(c, ds, dr);
    models::copy_to_host(*gpu, ds, static_cast<int64_t>(b.send.size()), b.send.data());
    models::copy_to_host(*gpu, dr, static_cast<int64_t>(b.recv.size()), b.recv.data());
    gpu->free(ds);
    gpu->free(dr);
    return b;
  };
  Buffers in;
  in.send.resize(4 * p);
  in.recv.assign(4 * p + 3, -7.f);
  for (int i = 0; i < 4 * p; ++i) in.send[i] = 0.1f * ((me * 7 + i * 3) % 11) - 0.37f * me;
  std::vector<int64_t> counts(p);
  for (int r = 0; r < p; ++r) counts[r] = r % 3;
  int64_t offset = 0;
  for (int r = 0; r < me; ++r) offset += counts[r];
  const std::vector<std::function<void(Communicator&, float*, float*)>> calls = {
      [](Communicator& c, float* s, float*) { c.allreduce(s, 4 * c.size(), DType::kF32, ReduceOp::kSum, "ALLREDUCE_DENSE"); },
      [](Communicator& c, float* s, float*) { c.allreduce(s, 4, DType::kF32, ReduceOp::kMax, "ALLREDUCE_MAX"); },
      [](Communicator& c, float* s, float* r) { c.allgather(s, 4, r, DType::kF32, "ALLGATHER_COUNTS"); },
      [&](Communicator& c, float* s, float* r) { c.allgatherv(s, counts[me], r, counts, DType::kF32, "ALLGATHERV_FINAL"); },
      [](Communicator& c, float* s, float* r) { c.alltoall(s, 4, r, DType::kF32, "ALLTOALL_COUNTS"); },
      [](Communicator& c, float* s, float*) { c.broadcast(s, 4, DType::kF32, c.size() - 1, "BROADCAST_PARAMS"); },
      [](Communicator& c, float* s, float* r) {
        const int n = c.size(), i = c.rank();
        std::vector<Request> rq = {c.irecv(r, 4 * n + 3, DType::kF32, (i - 1 + n) % n, 5, "IRECV_VALUE"),
                                   c.isend(s, 3, DType::kF32, (i + 1) % n, 5, "ISEND_VALUE")};
        c.wait_all(rq);
      },
  };
  for (size_t k = 0; k < calls.size(); ++k) {
    INFO("call " << k);
    Buffers plain, through_gpu;
    const LogCopy plain_log = logged([&] { plain = run(w, in, false, calls[k]); });
    const LogCopy staged_log = logged([&] { through_gpu = run(staged, in, true, calls[k]); });
    CHECK(through_gpu.send == plain.send);
    CHECK(through_gpu.recv == plain.recv);
    check_same_log(plain_log, staged_log);
  }
}
#endif

#ifdef TRAINER_HAS_CUDA
// NCCL where the lent machines allow it: with several ranks on their one GPU the probe must say
// so (and auto must pick the staged path); with one rank, NCCL's calls are the identity and are
// logged as MPI logs them. Skips without a GPU, and the one-rank part while the CUDA device has no
// stream for NCCL (DeviceMemory::stream_handle).
TEST_CASE("NCCL: ranks sharing a GPU are refused; one rank's calls are logged like MPI's", "[.][cuda]") {
  Communicator& w = world();
  models::DeviceMemory* gpu = this_ranks_gpu_or_skip(w);
  const std::string reason = nccl_unavailable_reason(w, *gpu);
  INFO(reason);
  if (w.size() > 1 && w.local_size() == w.size()) {
    int gpus = 0;
    cudaGetDeviceCount(&gpus);
    if (gpus < w.size()) CHECK_THAT(reason, Catch::Matchers::Contains("share a GPU"));
  }
  if (w.size() > 1 || gpu->stream_handle() == nullptr) {
    SyncCommunicator chosen = make_sync_communicator("auto", w, *gpu);
    if (!reason.empty()) CHECK_THAT(chosen.description, Catch::Matchers::StartsWith("mpi through pinned host staging"));
    return;
  }
  REQUIRE(reason.empty());
  std::unique_ptr<Communicator> nccl = make_nccl_communicator(w, *gpu);
  std::vector<float> host = {1.5f, -2.f, 3.25f, 0.f};
  auto* d = static_cast<float*>(gpu->allocate(8 * sizeof(float)));
  models::copy_to_device(*gpu, host.data(), 4, d);
  auto script = [&](Communicator& c, float* x) {
    c.allreduce(x, 4, DType::kF32, ReduceOp::kSum, "ALLREDUCE_DENSE");
    c.allgather(x, 4, x + 4, DType::kF32, "ALLGATHER_COUNTS");
    c.broadcast(x, 4, DType::kF32, 0, "BROADCAST_PARAMS");
  };
  std::vector<float> plain_x(8, 0.f);
  std::copy(host.begin(), host.end(), plain_x.begin());
  const LogCopy plain_log = logged([&] { script(w, plain_x.data()); });
  const LogCopy nccl_log = logged([&] { script(*nccl, d); });
  std::vector<float> back(8);
  models::copy_to_host(*gpu, d, 8, back.data());
  gpu->free(d);
  CHECK(back == plain_x);
  check_same_log(plain_log, nccl_log);
}
#endif
