// The low-bit codec of DiLoCo's outer allreduce on the GPU (models/cuda/low_bit.cu) against the
// CPU's loops (models/cpu/low_bit_ops.cpp), byte for byte: each op (quantize_blocks,
// sum_quantized_blocks, dequantize_blocks) in every format on random inputs and the edge blocks of
// low_bit_inputs.h (zeros, subnormals, NaN and Inf, saturation at 448 and 127, ties, the scale's
// flush to zero, sums that overflow), outputs poisoned first so that a byte left unwritten (or one
// written past the end) shows; then the whole device sum (comm::allreduce_sum_quantized with the
// GPU backend, through the staged MPI communicator) against the host overload, value for value and
// with the same bytes in the comm log. The one allowed difference: a NaN's sign and payload
// (low_bit.cu's header), in the blocks whose scale is NaN and in bf16's NaN codes. Under mpiexec
// (scripts/gpu_check.sh: P = 2, 3 sharing the GPU) the exchanges are real.
// Needs a GPU: without one the binary prints why and exits 77 (ctest: skipped).
#ifdef TRAINER_HAS_CUDA
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstring>

#include "comm/comm_log.h"
#include "comm/communicator.h"
#include "comm/quantized_allreduce.h"
#include "comm/staged_communicator.h"
#include "tests/cuda_parity.h"
#include "tests/low_bit_inputs.h"

using namespace trainer;
using namespace trainer::cuda_testing;
using models::LowBitFormat;

namespace {

constexpr int64_t B = models::kQuantBlock;
constexpr uint8_t kPoison = 0xa5;
const LowBitFormat kFormats[] = {LowBitFormat::kBF16, LowBitFormat::kFP8, LowBitFormat::kInt8};
const char* name_of(LowBitFormat f) { return f == LowBitFormat::kBF16 ? "bf16" : f == LowBitFormat::kFP8 ? "fp8" : "int8"; }

// Raw bytes on the GPU, poisoned (or uploaded).
struct GpuBytes {
  models::DeviceBuffer buffer;
  int64_t bytes;
  explicit GpuBytes(int64_t n, const uint8_t* from = nullptr) : buffer(gpu(), std::max<int64_t>(1, (n + 3) / 4)), bytes(n) {
    std::vector<uint8_t> host(static_cast<size_t>(n), kPoison);
    gpu().copy_to_device(buffer.data(), from ? from : host.data(), static_cast<size_t>(n));
    gpu().synchronize();
  }
  uint8_t* data() { return reinterpret_cast<uint8_t*>(buffer.data()); }
  std::vector<uint8_t> host() {
    std::vector<uint8_t> h(static_cast<size_t>(bytes));
    gpu().copy_to_host(h.data(), buffer.data(), static_cast<size_t>(bytes));
    gpu().synchronize();
    return h;
  }
};

float poison_float() {
  float f;
  std::memset(&f, kPoison, sizeof f);
  return f;
}

bool same_or_both_nan(float a, float b) {
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y || (std::isnan(a) && std::isnan(b));
}

// Elements that differ (bits, or NaN on one side only); the first one's index in `first`.
int64_t float_differences(const std::vector<float>& want, const std::vector<float>& got, int64_t& first) {
  int64_t differ = 0;
  first = -1;
  for (size_t i = 0; i < want.size(); ++i)
    if (!same_or_both_nan(want[i], got[i])) differ += 1, first = first < 0 ? static_cast<int64_t>(i) : first;
  return differ;
}

// Bytes of two chunks (the total buffers, padding past the chunk included) that differ, but for a
// NaN code against a NaN code: fp8 S.1111.111 with either sign where the block's scale is NaN,
// bf16 any NaN pattern.
int64_t chunk_differences(LowBitFormat f, const std::vector<uint8_t>& want, const std::vector<uint8_t>& got,
                          int64_t blocks, int64_t& first) {
  const int64_t scale_bytes = models::low_bit_scale_bytes(f) * blocks, chunk = models::low_bit_chunk_bytes(f, blocks);
  int64_t differ = 0;
  first = -1;
  for (int64_t i = 0; i < static_cast<int64_t>(want.size()); ++i) {
    if (want[i] == got[i]) continue;
    bool nan_codes = false;
    if (i >= scale_bytes && i < chunk) {
      if (f == LowBitFormat::kFP8) {
        float scale;
        std::memcpy(&scale, want.data() + 4 * ((i - scale_bytes) / B), 4);
        nan_codes = std::isnan(scale) && (want[i] & 0x7f) == 0x7f && (got[i] & 0x7f) == 0x7f;
      } else if (f == LowBitFormat::kBF16) {
        const int64_t at = i & ~int64_t(1);
        uint16_t a, b;
        std::memcpy(&a, want.data() + at, 2);
        std::memcpy(&b, got.data() + at, 2);
        nan_codes = (a & 0x7fff) > 0x7f80 && (b & 0x7fff) > 0x7f80;
      }
    }
    if (!nan_codes) differ += 1, first = first < 0 ? i : first;
  }
  return differ;
}

// (count, blocks): whole blocks; a partial last block; blocks wholly past count; one element.
const std::vector<std::pair<int64_t, int64_t>> kShapes{{12 * B, 12}, {20 * B + 17, 21}, {5 * B + 3, 9}, {1, 1},
                                                       {70001, 274}};

}  // namespace

TEST_CASE("quantize_blocks writes the CPU's chunk", "[low_bit]") {
  for (const LowBitFormat f : kFormats)
    for (const auto& [count, blocks] : kShapes) {
      INFO(name_of(f) << ", count " << count << ", blocks " << blocks);
      const auto x = testing::low_bit_input(count, 11 + count);
      // One block of room past the chunk: neither side may write there.
      const int64_t bytes = models::low_bit_chunk_bytes(f, blocks) + 300;
      std::vector<uint8_t> want(static_cast<size_t>(bytes), kPoison);
      cpu().quantize_blocks(f, x.data(), count, blocks, want.data());
      GpuArray gx(x);
      GpuBytes got(bytes);
      gpu().quantize_blocks(f, gx.data(), count, blocks, got.data());
      int64_t first = 0;
      const int64_t differ = chunk_differences(f, want, got.host(), blocks, first);
      INFO("first differing byte: " << first);
      CHECK(differ == 0);
    }
}

TEST_CASE("sum_quantized_blocks sums the CPU's chunks as the CPU does", "[low_bit]") {
  for (const LowBitFormat f : kFormats)
    for (const int ranks : {1, 2, 3, 5})
      for (const auto& [count, blocks] : kShapes) {
        INFO(name_of(f) << ", " << ranks << " ranks, count " << count << ", blocks " << blocks);
        // Every rank's chunk from its own input (the edge blocks on all of them: block 10 overflows).
        const int64_t chunk_bytes = models::low_bit_chunk_bytes(f, blocks);
        std::vector<uint8_t> received(static_cast<size_t>(ranks * chunk_bytes));
        for (int r = 0; r < ranks; ++r) {
          const auto x = testing::low_bit_input(count, 100 * r + count);
          cpu().quantize_blocks(f, x.data(), count, blocks, received.data() + r * chunk_bytes);
        }
        const int64_t elements = blocks * B;
        std::vector<float> want(static_cast<size_t>(elements + 64), poison_float());
        cpu().sum_quantized_blocks(f, received.data(), chunk_bytes, ranks, blocks, want.data());
        GpuBytes chunks(ranks * chunk_bytes, received.data());
        GpuArray acc(std::vector<float>(want.size(), poison_float()));
        gpu().sum_quantized_blocks(f, chunks.data(), chunk_bytes, ranks, blocks, acc.data());
        int64_t first = 0;
        const int64_t differ = float_differences(want, acc.host(), first);
        INFO("first differing element: " << first);
        CHECK(differ == 0);
        // The poison past the sum is still there (on the CPU too).
        CHECK(same_or_both_nan(acc.host()[elements], poison_float()));
      }
}

TEST_CASE("dequantize_blocks decodes the CPU's chunk as the CPU does", "[low_bit]") {
  for (const LowBitFormat f : kFormats)
    for (const auto& [count, blocks] : kShapes) {
      INFO(name_of(f) << ", count " << count << ", blocks " << blocks);
      const auto x = testing::low_bit_input(count, 7 + count);
      const int64_t chunk_bytes = models::low_bit_chunk_bytes(f, blocks);
      std::vector<uint8_t> chunk(static_cast<size_t>(chunk_bytes));
      cpu().quantize_blocks(f, x.data(), count, blocks, chunk.data());
      std::vector<float> want(static_cast<size_t>(count + 300), poison_float());
      cpu().dequantize_blocks(f, chunk.data(), blocks, count, want.data());
      GpuBytes on_gpu(chunk_bytes, chunk.data());
      GpuArray got(std::vector<float>(want.size(), poison_float()));
      gpu().dequantize_blocks(f, on_gpu.data(), blocks, count, got.data());
      int64_t first = 0;
      const int64_t differ = float_differences(want, got.host(), first);
      INFO("first differing element: " << first);
      CHECK(differ == 0);
    }
}

TEST_CASE("the device sum gives the host overload's values and bytes on the wire", "[low_bit][sum]") {
  comm::Communicator& world = comm::world();
  comm::StagedCommunicator staged(world, gpu());
  comm::QuantizedScratch host_scratch;
  comm::DeviceQuantizedScratch device_scratch;  // reused across sizes and formats, as a caller would
  comm::CommLogOptions on;
  on.enabled = true;
  for (const int64_t n : {int64_t(100003), int64_t(1), int64_t(3 * B * world.size()), int64_t(12 * B + 5)}) {
    const auto input = testing::low_bit_input(n, 1000 * world.rank() + n);
    for (const comm::OuterDType d : {comm::OuterDType::kF32, comm::OuterDType::kBF16, comm::OuterDType::kFP8,
                                     comm::OuterDType::kInt8}) {
      INFO(comm::outer_dtype_name(d) << ", n = " << n << ", P = " << world.size());
      std::vector<float> want = input;
      world.log().open(on, world.rank(), world.size());
      comm::allreduce_sum_quantized(world, want.data(), n, d, host_scratch, "ALLREDUCE_OUTER");
      const auto host_ops = world.log().op_stats();
      GpuArray data(input);
      world.log().open(on, world.rank(), world.size());
      comm::allreduce_sum_quantized(staged, gpu(), data.data(), n, d, device_scratch, "ALLREDUCE_OUTER");
      const auto device_ops = world.log().op_stats();
      world.log().open(comm::CommLogOptions{}, world.rank(), world.size());
      int64_t first = 0;
      const int64_t differ = float_differences(want, data.host(), first);
      INFO("first differing element: " << first);
      CHECK(differ == 0);
      REQUIRE(host_ops.size() == device_ops.size());
      for (size_t i = 0; i < host_ops.size(); ++i) {
        CHECK(host_ops[i].op == device_ops[i].op);
        CHECK(host_ops[i].calls == device_ops[i].calls);
        CHECK(host_ops[i].bytes == device_ops[i].bytes);
        CHECK(host_ops[i].bytes_recv == device_ops[i].bytes_recv);
      }
    }
  }
}

int main(int argc, char** argv) { return trainer::cuda_testing::run_cuda_tests(argc, argv); }

#else
#include <cstdio>
int main() {
  std::puts("skip: built without TRAINER_CUDA");
  return 77;
}
#endif
