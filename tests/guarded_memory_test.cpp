// The device-like CPU's guarded memory (tests/guarded_memory.h): host code that touches a device
// buffer outside the backend's calls dies of SIGSEGV, while the backend's own ops and copies work
// on it. Each touch runs in a forked child, so that the fault ends the child and the parent sees
// how it ended; a child that does the same through a copy must exit normally, so that a fork or
// harness failure cannot pass for the guard working.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <cstdint>
#include <functional>
#include <vector>

#include "device_like_backend.h"

using trainer::models::DeviceLikeCpu;

namespace {

// How a child running `body` ended: its signal, or 0 when it exited with status 0 (-1 otherwise).
int run_child(const std::function<void()>& body) {
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    body();
    _exit(0);  // no Catch2 teardown or static destructors in the child
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  if (WIFSIGNALED(status)) return WTERMSIG(status);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

// Keeps a read from being optimized away.
volatile float sink;

}  // namespace

TEST_CASE("guarded memory: a host read or write of a device buffer faults, a copy does not", "[guard]") {
  DeviceLikeCpu device;
  const std::vector<float> host = {1, 2, 3, 4};
  auto* x = static_cast<float*>(device.allocate(host.size() * sizeof(float)));
  device.copy_to_device(x, host.data(), host.size() * sizeof(float));

  CHECK(run_child([&] { sink = x[2]; }) == SIGSEGV);
  CHECK(run_child([&] { x[0] = 5; }) == SIGSEGV);
  CHECK(run_child([&] {
          std::vector<float> back(host.size());
          device.copy_to_host(back.data(), x, back.size() * sizeof(float));
          if (back != host) _exit(1);
        }) == 0);
  // A freed buffer's addresses are never handed out again: a use after free faults too.
  device.free(x);
  CHECK(run_child([&] { sink = x[0]; }) == SIGSEGV);
}

TEST_CASE("guarded memory: the backend's ops and the ops it makes run on device buffers", "[guard]") {
  DeviceLikeCpu device;
  const int64_t n = 3000;  // more than a page: the ops open every page of every buffer
  std::vector<float> a(n), b(n), y(n);
  for (int64_t i = 0; i < n; ++i) {
    a[i] = static_cast<float>(i) - 1000;
    b[i] = 0.5f * static_cast<float>(i);
  }
  auto* da = static_cast<float*>(device.allocate(n * sizeof(float)));
  auto* db = static_cast<float*>(device.allocate(n * sizeof(float)));
  auto* dy = static_cast<float*>(device.allocate(n * sizeof(float)));
  trainer::models::copy_to_device(device, a.data(), n, da);
  trainer::models::copy_to_device(device, b.data(), n, db);
  device.add(n, da, db, dy);  // a forwarded op (ForwardingBackend::enter opens the memory)
  device.relu_forward(n, dy, dy);
  trainer::models::copy_to_host(device, dy, n, y.data());
  for (int64_t i = 0; i < n; ++i) REQUIRE(y[i] == std::max(0.f, a[i] + b[i]));

  // An op the backend makes runs later, outside the call that made it: it opens the memory itself.
  trainer::models::PoolGeometry g;
  g.batch = 1;
  g.channels = 1;
  g.in_h = 2;
  g.in_w = 2;
  g.kernel_h = g.kernel_w = g.stride_h = g.stride_w = 2;
  g.layout = trainer::models::Layout::kChannelsLast;
  auto pool = device.make_pool(g);
  pool->forward(da, dy, false);  // max of a[0..3] = a[3]
  float max = 0;
  trainer::models::copy_to_host(device, dy, 1, &max);
  CHECK(max == a[3]);
  // And outside every call the buffers are closed again.
  CHECK(run_child([&] { sink = dy[0]; }) == SIGSEGV);
  device.free(da);
  device.free(db);
  device.free(dy);
}
