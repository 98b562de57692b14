// The number format gradients travel in (sync.wire_dtype; docs/architecture.md section 4, "Wire
// formats"): fp32, or one of the two 16-bit formats that halve the bytes of a dense allreduce,
// bfloat16 (fp32's 8-bit exponent, 8 significant bits) and IEEE binary16 "fp16" (5-bit exponent,
// 11 significant bits, largest finite 65504). Used by dense gradient sync (and every method's dense
// warmup) and by PowerSGD's P and Q allreduces; parameters, BN statistics and the parameter server
// stay fp32.
//
// The precision of a sum through a 16-bit wire: the cast into the format rounds once (to nearest,
// ties to even); MPI then sums the 16-bit numbers with our reduction (comm/mpi_communicator.cpp),
// which widens each pair to fp32, adds, and rounds the sum back to the 16-bit format, so every add
// of the reduction is one 16-bit rounding (the same as an IEEE 16-bit add: the fp32 sum of two
// 16-bit numbers rounded again to 16 bits equals their exact sum rounded once, because fp32's 24
// bits are at least 2p + 2 for p = 8 and 11, Figueroa's condition for innocuous double rounding).
// That is how NCCL and gloo reduce half and bfloat16 too: no wider accumulator spans the whole
// reduction, since partial sums travel between ranks in the wire format. An element of a P-rank sum
// sees at most P roundings (the cast and up to P - 1 adds; the widening back to fp32 is exact), so
// |result - exact sum| <= gamma_P sum_r |x_r| with gamma_P = P u / (1 - P u) and unit roundoff
// u = 2^-8 (bf16) or 2^-11 (fp16), plus, for values in the subnormal range, half a subnormal step
// per rounding.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "models/half_cast.h"

namespace trainer::comm {

enum class WireDType { kF32, kBF16, kF16 };

// The names sync.wire_dtype accepts, in enum order: the one list the config's choices, parsing and
// the error message read. Header-only, so that the config fuzzer needs no comm library.
inline const std::vector<std::string>& wire_dtype_names() {
  static const std::vector<std::string> names{"fp32", "bf16", "fp16"};
  return names;
}
// Throws std::invalid_argument naming the accepted names.
inline WireDType parse_wire_dtype(const std::string& name) {
  const auto& names = wire_dtype_names();
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return static_cast<WireDType>(i);
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown sync.wire_dtype '" + name + "' (available: " + list + ")");
}
std::string wire_dtype_name(WireDType wire);
// Bytes one element takes on the wire: 4, 2, 2.
int64_t wire_bytes(WireDType wire);
// The communicator's element type for the format (kF32, kBF16, kF16).
DType wire_comm_dtype(WireDType wire);

// The backend's name for a 16-bit format (Backend::to_half / from_half, models/half_cast.h);
// std::invalid_argument for kF32.
models::HalfFormat half_format(WireDType wire);

// The factor a method applies before the cast when it wants the average of P ranks' values: fp16
// divides by P first, as PyTorch's fp16_compress_hook does, so that the sum stays below 65504 when
// the average does (its range, not its precision, is fp16's weak side); fp32 and bf16 return 1 and
// the caller divides the widened sum by P in fp32, as the fp32 path always has. bf16 has fp32's
// exponent range, so dividing first would buy no range; dividing afterwards keeps the bf16 path
// equal to the fp32 one up to the 16-bit roundings (PyTorch's bf16_compress_hook divides first,
// in bf16 after the cast, which for P not a power of two is one more bf16 rounding). Either way
// the number of 16-bit roundings an element sees is the same.
float wire_pre_scale(WireDType wire, int world_size);

// Scalar conversions, the definition the array loops below (and every backend's to_half) match bit
// for bit: models/half_cast.h's. Narrowing rounds to nearest, ties to even; NaN stays NaN (quiet,
// sign and top payload bits kept), Inf stays Inf, subnormals are rounded, not flushed; fp16 overflow
// (|x| >= 65520, halfway past 65504) gives Inf. Widening is exact (a NaN comes back quiet).
uint16_t float_to_bf16(float x);
float bf16_to_float(uint16_t h);
uint16_t float_to_fp16(float x);
float fp16_to_float(uint16_t h);

// Array forms. narrow: out[i] = the format's rounding of (in[i] * scale), the scale applied in fp32
// and fused into the same pass (scale 1 is exact). widen: out[i] = in[i] as fp32. kF32 is not a
// 16-bit format: both throw std::invalid_argument for it. The loops are models/half_cast.h's (F16C
// where the build has it).
void narrow(WireDType wire, const float* in, int64_t count, float scale, uint16_t* out);
void widen(WireDType wire, const uint16_t* in, int64_t count, float* out);

// The element-wise reduction of a 16-bit wire: inout[i] = in[i] + inout[i], each widened to fp32,
// added, and rounded back (the MPI reduction is this function).
void wire_add(WireDType wire, const uint16_t* in, uint16_t* inout, int64_t count);

// Allreduce (sum) of `count` host floats through the wire format, tagged `tag`: the values times
// `pre_scale` are cast into `scratch` (grown to `count` if smaller, never shrunk: reused call after
// call), the 16-bit buffer is allreduced, and the sum is widened back into `data`. The comm log
// records wire_bytes(wire) bytes per element, what actually went out. kF32 allreduces `data`
// itself (scaled first when pre_scale is not 1), so it may be device memory the communicator moves
// when pre_scale is 1; the 16-bit formats need host memory: the cast runs on the host (dense sync
// casts device buckets with the backend's to_half / from_half instead: comm/sync/methods/dense/dense.h).
void allreduce_sum_through_wire(Communicator& comm, float* data, int64_t count, WireDType wire, float pre_scale,
                                std::vector<uint16_t>& scratch, const char* tag);

}  // namespace trainer::comm
