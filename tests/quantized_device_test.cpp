// The device overload of the low-bit sum (comm/quantized_allreduce.h) on the CPU backend dressed as
// a device (device_like_backend.h), through the staged communicator over its memory, under mpiexec
// at P = 1, 2, 3: the device path (codec as backend ops on "device" buffers, chunks handed to the
// communicator in that memory) gives the host overload's bytes in every format, on random inputs
// and low_bit_inputs.h's edge blocks, with the same calls and bytes in the comm log; what crosses
// to the host is the staged communicator's chunks only (never `data`); the scratch is reused
// across sizes and formats, and moves to another backend when called with one.
#include <catch2/catch.hpp>

#include <cstring>
#include <functional>
#include <vector>

#include "comm/comm_log.h"
#include "comm/communicator.h"
#include "comm/quantized_allreduce.h"
#include "comm/staged_communicator.h"
#include "tests/device_like_backend.h"
#include "tests/low_bit_inputs.h"

using namespace trainer;
using comm::OuterDType;

namespace {

// The log's records of one call, by op: calls, bytes sent and received.
std::vector<std::vector<int64_t>> logged(comm::Communicator& comm, const std::function<void()>& run) {
  comm::CommLogOptions on;
  on.enabled = true;
  comm.log().open(on, comm.rank(), comm.size());
  run();
  std::vector<std::vector<int64_t>> ops;
  for (const auto& op : comm.log().op_stats()) ops.push_back({op.calls, op.bytes, op.bytes_recv});
  comm.log().open(comm::CommLogOptions{}, comm.rank(), comm.size());
  return ops;
}

}  // namespace

TEST_CASE("Low-bit sums on device buffers give the host overload's bytes", "[quant][device]") {
  comm::Communicator& world = comm::world();
  const int p = world.size();
  models::DeviceLikeCpu device;
  comm::StagedCommunicator staged(world, device);
  comm::QuantizedScratch host_scratch;
  comm::DeviceQuantizedScratch device_scratch;
  for (const int64_t n : {int64_t(100003), int64_t(1), int64_t(3 * 256 * p), int64_t(12 * 256 + 5)}) {
    const std::vector<float> input = testing::low_bit_input(n, 31 * world.rank() + n);
    for (const OuterDType d : {OuterDType::kF32, OuterDType::kBF16, OuterDType::kFP8, OuterDType::kInt8}) {
      INFO(comm::outer_dtype_name(d) << ", n = " << n << ", P = " << p);
      std::vector<float> want = input;
      const auto host_ops = logged(world, [&] {
        comm::allreduce_sum_quantized(world, want.data(), n, d, host_scratch, "ALLREDUCE_OUTER");
      });
      float* data = static_cast<float*>(device.allocate(n * sizeof(float)));
      models::copy_to_device(device, input.data(), n, data);
      const int64_t to_host_before = device.memory.to_host;
      const auto device_ops = logged(world, [&] {
        comm::allreduce_sum_quantized(staged, device, data, n, d, device_scratch, "ALLREDUCE_OUTER");
      });
      // Only the staged calls' buffers came to the host: fp32's allreduce of data, or the alltoall's
      // P chunks and the allgather's own chunk.
      const comm::QuantizedVolume v = comm::quantized_volume(d, n, p);
      CHECK(device.memory.to_host - to_host_before == (d == OuterDType::kF32 ? 4 * n : (p + 1) * v.chunk_bytes));
      std::vector<float> got(n);
      models::copy_to_host(device, data, n, got.data());
      device.free(data);
      CHECK(std::memcmp(got.data(), want.data(), n * sizeof(float)) == 0);
      CHECK(device_ops == host_ops);
      // The scratch is the device's.
      if (d != OuterDType::kF32) CHECK(device_scratch.send.memory() == &device);
    }
  }
  // Called with another backend, the scratch moves there.
  std::vector<float> x = testing::low_bit_input(5000, 3 + world.rank()), y = x;
  comm::allreduce_sum_quantized(world, models::cpu_backend(), x.data(), 5000, OuterDType::kFP8, device_scratch,
                                "ALLREDUCE_OUTER");
  comm::allreduce_sum_quantized(world, y.data(), 5000, OuterDType::kFP8, host_scratch, "ALLREDUCE_OUTER");
  CHECK(device_scratch.send.memory() == &models::cpu_backend());
  CHECK(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
}
