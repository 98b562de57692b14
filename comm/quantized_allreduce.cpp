#include "comm/quantized_allreduce.h"

#include <algorithm>
#include <stdexcept>

#include "models/backend.h"

namespace trainer::comm {

namespace {

// The chunk buffers of one call, in the memory of the backend that runs the codec.
struct Chunks {
  uint8_t* send;  // P chunks: the quantized input, then (in place) the gathered reduced chunks
  uint8_t* recv;  // P chunks: every rank's copy of this rank's chunk
  float* sum;     // the owner's fp32 sum of its chunk
};

// Steps 1-6 of the header for one format, the codec on `backend` (whose memory holds data and the
// chunks) and the chunks moved by `comm`.
void allreduce_chunks(Communicator& comm, models::Backend& backend, float* data, int64_t n, models::LowBitFormat format,
                      const QuantizedVolume& v, const Chunks& c, const char* tag) {
  const int p = comm.size(), rank = comm.rank();
  const int64_t blocks = v.chunk_blocks, chunk_elements = blocks * kQuantBlock, bytes = v.chunk_bytes;
  // Chunk j of data: its start (only formed where the chunk holds elements) and its element count.
  auto count = [&](int j) { return std::clamp<int64_t>(n - j * chunk_elements, 0, chunk_elements); };
  auto start = [&](int j) { return count(j) > 0 ? data + j * chunk_elements : data; };

  // 1-2. Every chunk quantized into its slot; slot j goes to rank j, which gets chunk `rank` of all.
  for (int j = 0; j < p; ++j) backend.quantize_blocks(format, start(j), count(j), blocks, c.send + j * bytes);
  comm.alltoall(c.send, bytes, c.recv, DType::kU8, tag);
  // 3-4. Summed in fp32 in rank order, quantized again into this rank's slot of the gather buffer.
  backend.sum_quantized_blocks(format, c.recv, bytes, p, blocks, c.sum);
  backend.quantize_blocks(format, c.sum, chunk_elements, blocks, c.send + rank * bytes);
  // 5-6. Every rank's reduced chunk to every rank (in place), decoded into data.
  comm.allgather(c.send + rank * bytes, bytes, c.send, DType::kU8, tag);
  for (int j = 0; j < p; ++j) backend.dequantize_blocks(format, c.send + j * bytes, blocks, count(j), start(j));
}

// What both overloads check and do before any buffer: true when the call is done (n = 0, or fp32's
// plain allreduce of data).
bool trivial_sum(Communicator& comm, float* data, int64_t n, OuterDType dtype, const char* tag) {
  if (n < 0) throw std::invalid_argument(std::string("allreduce_sum_quantized ") + tag + ": negative count");
  if (n == 0) return true;
  if (dtype != OuterDType::kF32) return false;
  comm.allreduce(data, n, DType::kF32, ReduceOp::kSum, tag);
  return true;
}

// `bytes` of `buffer` in `backend`'s memory (grown only; bound to the backend first).
void* reserve_bytes(models::DeviceBuffer& buffer, models::Backend& backend, int64_t bytes) {
  if (buffer.memory() != &backend) buffer = models::DeviceBuffer(backend);
  return buffer.reserve((bytes + 3) / 4);
}

}  // namespace

std::string outer_dtype_name(OuterDType dtype) { return outer_dtype_names().at(static_cast<size_t>(dtype)); }

models::LowBitFormat low_bit_format(OuterDType dtype) {
  switch (dtype) {
    case OuterDType::kBF16: return models::LowBitFormat::kBF16;
    case OuterDType::kFP8: return models::LowBitFormat::kFP8;
    case OuterDType::kInt8: return models::LowBitFormat::kInt8;
    case OuterDType::kF32: break;
  }
  throw std::invalid_argument("low_bit_format: fp32 is not a low-bit format");
}

int64_t outer_element_bytes(OuterDType dtype) {
  return dtype == OuterDType::kF32 ? 4 : models::low_bit_element_bytes(low_bit_format(dtype));
}

int64_t outer_scale_bytes(OuterDType dtype) {
  return dtype == OuterDType::kF32 ? 0 : models::low_bit_scale_bytes(low_bit_format(dtype));
}

QuantizedVolume quantized_volume(OuterDType dtype, int64_t n, int world_size) {
  if (n < 0 || world_size < 1) throw std::invalid_argument("quantized_volume: n must be >= 0 and world_size >= 1");
  QuantizedVolume v;
  if (n == 0) return v;
  if (dtype == OuterDType::kF32) {
    v.bytes_sent = v.bytes_received = 4 * n;
    return v;
  }
  v.blocks = (n + kQuantBlock - 1) / kQuantBlock;
  v.chunk_blocks = (v.blocks + world_size - 1) / world_size;
  v.chunk_bytes = models::low_bit_chunk_bytes(low_bit_format(dtype), v.chunk_blocks);
  v.bytes_sent = (world_size - 1) * v.chunk_bytes + v.chunk_bytes;       // alltoall + allgather
  v.bytes_received = (world_size - 1) * v.chunk_bytes * 2;
  return v;
}

uint8_t float_to_e4m3(float x) { return models::low_bit::e4m3_from(x); }
float e4m3_to_float(uint8_t q) { return models::low_bit::e4m3_to(q); }
int8_t float_to_int8(float x) { return models::low_bit::int8_from(x); }

BlockScale block_scale(OuterDType dtype, float max_abs) {
  if (dtype == OuterDType::kF32 || dtype == OuterDType::kBF16) return {};
  const models::low_bit::Scale s = models::low_bit::block_scale(low_bit_format(dtype), max_abs);
  return {s.scale, s.inverse};
}

void allreduce_sum_quantized(Communicator& comm, float* data, int64_t n, OuterDType dtype,
                             QuantizedScratch& scratch, const char* tag) {
  if (trivial_sum(comm, data, n, dtype, tag)) return;
  const QuantizedVolume v = quantized_volume(dtype, n, comm.size());
  const auto all = static_cast<size_t>(comm.size() * v.chunk_bytes);
  const auto chunk_elements = static_cast<size_t>(v.chunk_blocks * kQuantBlock);
  if (scratch.send.size() < all) scratch.send.resize(all);
  if (scratch.recv.size() < all) scratch.recv.resize(all);
  if (scratch.sum.size() < chunk_elements) scratch.sum.resize(chunk_elements);
  allreduce_chunks(comm, models::cpu_backend(), data, n, low_bit_format(dtype), v,
                   {scratch.send.data(), scratch.recv.data(), scratch.sum.data()}, tag);
}

void allreduce_sum_quantized(Communicator& comm, models::Backend& backend, float* data, int64_t n, OuterDType dtype,
                             DeviceQuantizedScratch& scratch, const char* tag) {
  if (trivial_sum(comm, data, n, dtype, tag)) return;
  const QuantizedVolume v = quantized_volume(dtype, n, comm.size());
  const int64_t all = comm.size() * v.chunk_bytes;
  auto* send = static_cast<uint8_t*>(reserve_bytes(scratch.send, backend, all));
  auto* recv = static_cast<uint8_t*>(reserve_bytes(scratch.recv, backend, all));
  auto* sum = static_cast<float*>(reserve_bytes(scratch.sum, backend, 4 * v.chunk_blocks * kQuantBlock));
  allreduce_chunks(comm, backend, data, n, low_bit_format(dtype), v, {send, recv, sum}, tag);
}

}  // namespace trainer::comm
