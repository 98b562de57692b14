// A sum over ranks through a low-bit format (issue 19 part 3; sync.diloco.outer_dtype; docs/architecture.md
// section 4, "Wire formats"): the outer gradients of DiLoCo cross the wire as bf16, fp8 (E4M3) or
// int8 with one fp32 scale per block, and are summed in fp32, as torchft's quantized allreduce does
// (meta-pytorch/torchft, torchft/collectives.py): quantize, exchange chunks by alltoall (rank j gets
// every rank's chunk j: a reduce-scatter done as an all-to-all), dequantize and sum in fp32,
// quantize the reduced chunk, allgather the chunks, dequantize. Unlike a 16-bit allreduce
// (comm/wire_format.h) no partial sum ever travels in the low-bit format: each element is rounded
// twice, once on the way to its chunk's owner and once on the way back, whatever P is.
//
// Scales per block, not per row. torchft scales each row of each 2-D tensor (a 1-D tensor is a
// column: one scale per element); here the input is one flat buffer of many tensors with no shapes,
// so rows do not exist, and fixed blocks of kQuantBlock = 256 consecutive elements are the simplest
// unit that needs none: the layout depends only on n and P. 256 because the fp32 scale then costs
// 4 bytes per 256 one-byte elements (1.6% on top of fp8/int8), while the error, which is relative
// to the largest |x| of the block, is still set by a few hundred neighbours of one tensor; only
// blocks that straddle a tensor boundary (one per boundary) share a scale between two tensors.
//
// Formats (bytes per element, per-block scale bytes):
//   fp32  4, none  a plain fp32 allreduce (Communicator::allreduce), no rounding beyond MPI's sum
//   bf16  2, none  wire_format.h's conversions. bf16 has fp32's exponent range, so a scale would buy
//                  no range, and its rounding is relative to each element already (2^-8 |x|), tighter
//                  than any bound relative to a block's max; a scale would only cost bytes and one
//                  more fp32 rounding.
//   fp8   1, fp32  OCP / NVIDIA E4M3 "e4m3fn": 4 exponent bits (bias 7), 3 mantissa bits, largest
//                  finite 448 (S.1111.110), no Inf, NaN = S.1111.111, subnormals down to 2^-9.
//                  A block is multiplied by 448 / max|x| and rounded to nearest, ties to even,
//                  saturating at +-448.
//   int8  1, fp32  symmetric: multiplied by 127 / max|x| and rounded to the nearest integer (ties to
//                  even), saturating at +-127 (-128 is never produced).
// The block scale is s = max|x| / qmax (qmax = 448 or 127) in fp32 and travels in front of its
// chunk's payload; the value back is decode(q) * s. A block whose s would be below FLT_MIN (all zeros,
// or a max below qmax * 2^-126) is sent as zeros with s = 0, so no scale is ever subnormal.
//
// Error bound (what tests/quantized_allreduce_test.cpp checks against a float64 sum). Per
// quantization of a block with max |x| = A, every element comes back within delta A + tau:
//   fp8   delta = 16/448 + 2^-21 (the top binade [256, 448] has step 32: half a step is 1/28 of 448;
//         2^-21 covers the fp32 roundings of the scale, the multiply and the product), tau = 448 2^-126
//   int8  delta = 0.5/127 + 2^-21, tau = 127 2^-126 (tau: a block flushed to zero, A < qmax 2^-126)
//   bf16  delta = 2^-8 (relative to |x| itself, so to A too), tau = 2^-134 (half a subnormal step)
// The owner sums the P dequantized values in rank order in fp32 (acc = fma(decode(q), s, acc): P
// roundings, gamma_P = P 2^-24 / (1 - P 2^-24)). With M = sum over ranks of each rank's block max
// A_r, an element of the result is within
//   delta M + gamma_P (1 + delta) M + delta (1 + gamma_P)(1 + delta) M + (P + 1) tau
// of the exact sum: the first quantization, the fp32 sum, and the second quantization, whose block
// max is at most (1 + gamma_P)(1 + delta) M. About 2 delta M: 7.1% of M for fp8, 0.79% for int8,
// 0.78% for bf16. fp32: MPI's fp32 sum, gamma_{P-1} sum |x_r|.
//
// Non-finite input: a block that holds a NaN or an Inf on any rank comes out NaN in every element,
// on every rank (its scale travels as NaN; the owner's sum and the second scale stay NaN), so the
// trainer's non-finite guard sees it and a NaN never silently vanishes. An fp32 sum that overflows
// at the owner does the same to its block. bf16 keeps NaN and Inf per element instead (its
// conversions do; a sum within half a bf16 step of FLT_MAX rounds to Inf there). fp32 is MPI's sum.
//
// Where it runs: the conversions and the owner's sum are the backend's codec ops
// (models/backend.h, "Low-bit outer gradients"; the formats and the chunk layout are
// models/low_bit_blocks.h's). The host overload below runs them on the CPU backend; the overload
// taking a backend runs them on that backend's memory (CUDA kernels on a GPU), which writes the
// CPU's bytes, so the two give the same values (a NaN's sign and payload aside: on a GPU it is the
// canonical NaN).
//
// Bit-identical on every rank: each element's result is decoded from the same bytes (its owner's
// reduced chunk) by the same code. P = 1 runs the same path (the calls move nothing across the
// network), so a one-rank run shows the format's rounding as a P-rank run would.
//
// Wire layout: the n elements form ceil(n / 256) blocks (the last one padded with zeros), and rank
// j owns chunk j, the blocks [j c, (j + 1) c) with c = ceil(blocks / P); chunks past the end are
// padding (zeros, scale 0). Every chunk has the same size on the wire,
//   chunk_bytes = c (scale bytes + 256 element bytes),
// laid out as the chunk's c scales, then its c blocks of payload. Padding is at most P - 1 blocks and
// the tail of the last block: small beside any n worth quantizing.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "models/device_buffer.h"
#include "models/low_bit_blocks.h"

namespace trainer::models {
class Backend;
}

namespace trainer::comm {

enum class OuterDType { kF32, kBF16, kFP8, kInt8 };

// The names sync.diloco.outer_dtype accepts, in enum order: the one list the config's choices, parsing and
// the error message read. Header-only, so that the config fuzzer needs no comm library.
inline const std::vector<std::string>& outer_dtype_names() {
  static const std::vector<std::string> names{"fp32", "bf16", "fp8", "int8"};
  return names;
}
// Throws std::invalid_argument naming the accepted names.
inline OuterDType parse_outer_dtype(const std::string& name) {
  const auto& names = outer_dtype_names();
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return static_cast<OuterDType>(i);
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown sync.outer_dtype '" + name + "' (available: " + list + ")");
}
std::string outer_dtype_name(OuterDType dtype);

// Elements per scale (the codec's, models/low_bit_blocks.h).
constexpr int64_t kQuantBlock = models::kQuantBlock;
// The backend codec's format for a low-bit dtype (kF32 has none: std::invalid_argument).
models::LowBitFormat low_bit_format(OuterDType dtype);
// Bytes one element takes on the wire (4, 2, 1, 1) and one block's scale (0, 0, 4, 4).
int64_t outer_element_bytes(OuterDType dtype);
int64_t outer_scale_bytes(OuterDType dtype);

// What one allreduce_sum_quantized of n elements at P ranks sends and receives on this rank, as
// the comm log records it (Communicator's conventions): fp32: one allreduce, 4n each way; the others:
// the alltoall ((P - 1) chunk_bytes each way) and the allgather (chunk_bytes sent, (P - 1)
// chunk_bytes received). Every rank's figures are the same. For --dry-run and the tests.
struct QuantizedVolume {
  int64_t blocks = 0;        // ceil(n / kQuantBlock) (0 for fp32)
  int64_t chunk_blocks = 0;  // blocks per rank's chunk, c above (0 for fp32)
  int64_t chunk_bytes = 0;   // one chunk on the wire (0 for fp32)
  int64_t bytes_sent = 0, bytes_received = 0;
};
QuantizedVolume quantized_volume(OuterDType dtype, int64_t n, int world_size);

// Buffers reused call after call (grown, never shrunk): the quantized send and receive sides and
// the owner's fp32 sum.
struct QuantizedScratch {
  std::vector<uint8_t> send, recv;
  std::vector<float> sum;
};

// data[i] <- the sum over ranks of data[i], through `dtype` as described above; every call goes
// through `comm` tagged `tag` (a string literal: one op tag for the alltoall and the allgather
// alike, so the log's total for the tag is the bytes of the sum in any format). `data` is host
// memory (the conversions run on the host: the CPU backend's codec ops). Collective: every rank
// passes the same n and dtype. n = 0 makes no call.
void allreduce_sum_quantized(Communicator& comm, float* data, int64_t n, OuterDType dtype,
                             QuantizedScratch& scratch, const char* tag);

// The device overload's buffers: DeviceBuffers of the backend it is called with (chunks as bytes
// in float-sized slots), bound to that backend at the first call and reused call after call
// (grown, never shrunk); a call with another backend replaces them.
struct DeviceQuantizedScratch {
  models::DeviceBuffer send, recv, sum;
};

// The same sum with `data` in `backend`'s memory: the codec runs as the backend's ops
// (Backend::quantize_blocks, sum_quantized_blocks, dequantize_blocks; CUDA kernels on a GPU) and
// `comm` moves the chunks in that memory (a device communicator: NCCL, or the staged MPI one),
// with the host overload's calls, tags and byte counts. Every backend writes the CPU's bytes, so
// the result is the host overload's, bit for bit (on a GPU a NaN's sign and payload aside, see
// above). fp32 is comm.allreduce of `data`, as there. Like the backend's ops it may return before
// the device is done (NCCL enqueues on the backend's stream): `data` is ready in stream order. The
// scratch must not outlive the backend (its buffers are freed through it).
void allreduce_sum_quantized(Communicator& comm, models::Backend& backend, float* data, int64_t n, OuterDType dtype,
                             DeviceQuantizedScratch& scratch, const char* tag);

// ---- The definitions the array loops match bit for bit (the tests call them) ----
// models/low_bit_blocks.h's scalar conversions, which the backends' codec ops call.
// A block of the array path: A = max |x_i| over the block, {s, inv} = block_scale(A),
// q_i = float_to_e4m3(x_i * inv) (int8: float_to_int8; bf16: float_to_bf16(x_i)), and a value comes
// back as decode(q_i) * s, or, in the owner's sum, acc = fma(decode(q_i), s, acc) over ranks 0..P-1
// from acc = 0.

// fp8 E4M3 (e4m3fn). Narrowing rounds to nearest, ties to even; |x| above 448 (Inf included)
// saturates to +-448; NaN gives S.1111.111 with x's sign; subnormals (below 2^-6) are rounded to
// multiples of 2^-9, not flushed. Widening is exact (NaN gives a quiet NaN with the sign).
uint8_t float_to_e4m3(float x);
float e4m3_to_float(uint8_t q);
// int8: round to nearest, ties to even, saturating at +-127; NaN gives 0 (the block's scale carries
// the NaN, see above).
int8_t float_to_int8(float x);

// A block's scale from its max |x| (A): scale = A / qmax and inverse = qmax / A in fp32; both 0 when
// A / qmax is below FLT_MIN (zeros); scale NaN and inverse 0 when A is not finite. kF32 and kBF16
// have no scale: {1, 1}.
struct BlockScale {
  float scale = 1, inverse = 1;
};
BlockScale block_scale(OuterDType dtype, float max_abs);

}  // namespace trainer::comm
