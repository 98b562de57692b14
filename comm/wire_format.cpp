#include "comm/wire_format.h"

#include <algorithm>
#include <stdexcept>

#include "models/half_cast.h"

namespace trainer::comm {

namespace {

// The conversions are models/half_cast.h's (the backends' to_half / from_half run the same loops).
inline uint16_t bf16_from(float x) { return models::round_to_bf16(x); }
inline float bf16_to(uint16_t h) { return models::widen_bf16(h); }

constexpr int64_t kChunk = 1024;  // wire_add's fp16 chunk (through fp32 on the stack)

[[noreturn]] void not_16_bit(const char* what) {
  throw std::invalid_argument(std::string(what) + ": fp32 is not a 16-bit wire format");
}

}  // namespace

models::HalfFormat half_format(WireDType wire) {
  if (wire == WireDType::kF32) not_16_bit("half_format");
  return wire == WireDType::kBF16 ? models::HalfFormat::kBf16 : models::HalfFormat::kFp16;
}

std::string wire_dtype_name(WireDType wire) { return wire_dtype_names().at(static_cast<size_t>(wire)); }

int64_t wire_bytes(WireDType wire) { return wire == WireDType::kF32 ? 4 : 2; }

DType wire_comm_dtype(WireDType wire) {
  switch (wire) {
    case WireDType::kF32: return DType::kF32;
    case WireDType::kBF16: return DType::kBF16;
    case WireDType::kF16: return DType::kF16;
  }
  return DType::kF32;
}

float wire_pre_scale(WireDType wire, int world_size) {
  return wire == WireDType::kF16 ? 1.f / static_cast<float>(world_size) : 1.f;
}

uint16_t float_to_bf16(float x) { return bf16_from(x); }
float bf16_to_float(uint16_t h) { return bf16_to(h); }
uint16_t float_to_fp16(float x) { return models::round_to_fp16(x); }
float fp16_to_float(uint16_t h) { return models::widen_fp16(h); }

void narrow(WireDType wire, const float* in, int64_t count, float scale, uint16_t* out) {
  models::narrow_half(half_format(wire), in, count, scale, out);
}

void widen(WireDType wire, const uint16_t* in, int64_t count, float* out) {
  models::widen_half(half_format(wire), in, count, out);
}

void wire_add(WireDType wire, const uint16_t* in, uint16_t* inout, int64_t count) {
  if (wire == WireDType::kBF16) {
#pragma omp simd
    for (int64_t i = 0; i < count; ++i) inout[i] = bf16_from(bf16_to(in[i]) + bf16_to(inout[i]));
    return;
  }
  if (wire != WireDType::kF16) not_16_bit("wire_add");
  // Through fp32 in blocks, so the F16C paths of widen and narrow serve the reduction too.
  float a[kChunk], b[kChunk];
  for (int64_t begin = 0; begin < count; begin += kChunk) {
    const int64_t n = std::min(kChunk, count - begin);
    models::widen_half_here(models::HalfFormat::kFp16, in + begin, n, a);
    models::widen_half_here(models::HalfFormat::kFp16, inout + begin, n, b);
    for (int64_t i = 0; i < n; ++i) a[i] += b[i];
    models::narrow_half_here(models::HalfFormat::kFp16, a, n, 1.f, inout + begin);
  }
}

void allreduce_sum_through_wire(Communicator& comm, float* data, int64_t count, WireDType wire, float pre_scale,
                                std::vector<uint16_t>& scratch, const char* tag) {
  if (wire == WireDType::kF32) {
    if (pre_scale != 1.f)
      for (int64_t i = 0; i < count; ++i) data[i] *= pre_scale;
    comm.allreduce(data, count, DType::kF32, ReduceOp::kSum, tag);
    return;
  }
  if (static_cast<int64_t>(scratch.size()) < count) scratch.resize(static_cast<size_t>(count));
  narrow(wire, data, count, pre_scale, scratch.data());
  comm.allreduce(scratch.data(), count, wire_comm_dtype(wire), ReduceOp::kSum, tag);
  widen(wire, scratch.data(), count, data);
}

}  // namespace trainer::comm
