// The low-bit codec of the outer allreduce on the GPU (backend.h, "Low-bit outer gradients";
// comm/quantized_allreduce.h): quantize, the owner's sum, dequantize, writing the CPU loops' bytes
// (models/cpu/low_bit_ops.cpp). The conversions are models/low_bit_blocks.h's, the same functions
// the CPU calls; the float arithmetic around them is written with the intrinsics that round as the
// CPU's operators do and that nvcc never contracts: __fmul_rn for x * inverse and decode(q) * s,
// __fmaf_rn for the owner's fma, __float2int_rn for int8's nearbyint (ties to even).
//
// - quantize: one CUDA block of kQuantBlock threads per quantization block (grid-striding over the
//   blocks), the block's max |x| as the max of the float bits (NaN above Inf, so one integer max
//   finds either) reduced in shared memory, then one element per thread.
// - the sum and dequantize: one thread per element, the ranks in order.
//
// Where a block holds a NaN or an Inf, its scale is NaN and every value that comes out of it is
// NaN on both sides, but a NaN's sign and payload may differ: x86 propagates an operand's NaN (and
// makes Inf * 0 its negative default NaN), a GPU writes its canonical one. So an fp8 code there may
// be S.1111.111 with the other sign, and a bf16 code of a NaN another NaN; no other byte differs.
#include <type_traits>

#include "models/cuda/kernels.h"
#include "models/cuda/launch.cuh"
#include "models/low_bit_blocks.h"

namespace trainer::models::cuda {
namespace {

using namespace low_bit;
static_assert(kThreads == kQuantBlock, "one thread per element of a quantization block");

template <LowBitFormat F>
struct Code {
  using type = uint16_t;
};
template <>
struct Code<LowBitFormat::kFP8> {
  using type = uint8_t;
};
template <>
struct Code<LowBitFormat::kInt8> {
  using type = int8_t;
};

// int8_from (low_bit_blocks.h) with the GPU's rounding instruction.
__device__ inline int8_t int8_code(float x) {
  return static_cast<int8_t>(x == x ? __float2int_rn(int8_saturated(x)) : 0);
}

template <LowBitFormat F>
__device__ inline typename Code<F>::type encode(float x) {
  if constexpr (F == LowBitFormat::kBF16) return bf16_from(x);
  else if constexpr (F == LowBitFormat::kFP8) return e4m3_from(x);
  else return int8_code(x);
}

template <LowBitFormat F>
__device__ inline float decode(typename Code<F>::type q) {
  if constexpr (F == LowBitFormat::kBF16) return bf16_to(q);
  else if constexpr (F == LowBitFormat::kFP8) return e4m3_to(q);
  else return static_cast<float>(q);
}

// A chunk's scale of block k (bf16: none, 1) and its codes.
template <LowBitFormat F>
__device__ inline float scale_of(const uint8_t* chunk, int64_t k) {
  if constexpr (F == LowBitFormat::kBF16) return 1.f;
  else return reinterpret_cast<const float*>(chunk)[k];
}
template <LowBitFormat F>
__device__ inline const typename Code<F>::type* codes_of(const uint8_t* chunk, int64_t blocks) {
  return reinterpret_cast<const typename Code<F>::type*>(chunk + blocks * low_bit_scale_bytes(F));
}

// fp8 and int8: block k of the chunk from x[k * kQuantBlock, ...) (zeros past count; scale 0 for a
// block wholly past it).
template <LowBitFormat F>
__global__ void quantize_scaled_kernel(const float* x, int64_t count, int64_t blocks, uint8_t* chunk) {
  using C = typename Code<F>::type;
  __shared__ uint32_t max_bits[kQuantBlock];
  auto* scales = reinterpret_cast<float*>(chunk);
  auto* codes = reinterpret_cast<C*>(chunk + blocks * low_bit_scale_bytes(F));
  for (int64_t k = blockIdx.x; k < blocks; k += gridDim.x) {
    const int64_t i = k * kQuantBlock + threadIdx.x;
    const bool valid = i < count;
    const float v = valid ? x[i] : 0.f;
    max_bits[threadIdx.x] = bits_of(v) & 0x7fffffffu;
    __syncthreads();
    for (int half = kQuantBlock / 2; half > 0; half /= 2) {
      if (threadIdx.x < half && max_bits[threadIdx.x + half] > max_bits[threadIdx.x])
        max_bits[threadIdx.x] = max_bits[threadIdx.x + half];
      __syncthreads();
    }
    const Scale s = k * kQuantBlock < count ? block_scale(F, float_of(max_bits[0])) : Scale{0.f, 0.f};
    __syncthreads();  // every thread has read max_bits[0] before the next block writes it
    if (threadIdx.x == 0) scales[k] = s.scale;
    codes[i] = valid ? encode<F>(__fmul_rn(v, s.inverse)) : C{0};
  }
}

// bf16: no scales, one code per element (zeros past count).
__global__ void quantize_bf16_kernel(const float* x, int64_t count, int64_t elements, uint16_t* codes) {
  for (int64_t i = first_index(); i < elements; i += grid_stride()) codes[i] = i < count ? bf16_from(x[i]) : 0;
}

template <LowBitFormat F>
__global__ void sum_kernel(const uint8_t* received, int64_t chunk_bytes, int ranks, int64_t blocks, float* acc) {
  const int64_t elements = blocks * kQuantBlock;
  for (int64_t i = first_index(); i < elements; i += grid_stride()) {
    const int64_t k = i / kQuantBlock;
    float a = 0.f;
    for (int r = 0; r < ranks; ++r) {
      const uint8_t* chunk = received + r * chunk_bytes;
      a = __fmaf_rn(decode<F>(codes_of<F>(chunk, blocks)[i]), scale_of<F>(chunk, k), a);
    }
    acc[i] = a;
  }
}

template <LowBitFormat F>
__global__ void dequantize_kernel(const uint8_t* chunk, int64_t blocks, int64_t count, float* out) {
  const auto* codes = codes_of<F>(chunk, blocks);
  for (int64_t i = first_index(); i < count; i += grid_stride())
    out[i] = __fmul_rn(decode<F>(codes[i]), scale_of<F>(chunk, i / kQuantBlock));
}

// Runs launch(std::integral_constant<LowBitFormat, F>{}) for the format's F: each format's kernel
// is a template instance.
template <class Launch>
cudaError_t for_format(LowBitFormat format, Launch launch) {
  switch (format) {
    case LowBitFormat::kBF16: launch(std::integral_constant<LowBitFormat, LowBitFormat::kBF16>{}); break;
    case LowBitFormat::kFP8: launch(std::integral_constant<LowBitFormat, LowBitFormat::kFP8>{}); break;
    case LowBitFormat::kInt8: launch(std::integral_constant<LowBitFormat, LowBitFormat::kInt8>{}); break;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_quantize_blocks(LowBitFormat format, const float* x, int64_t count, int64_t blocks,
                                   uint8_t* chunk, cudaStream_t stream) {
  if (blocks <= 0) return cudaSuccess;
  const unsigned grid = grid_for(blocks * kQuantBlock);  // one CUDA block per quantization block, capped
  return for_format(format, [&](auto f) {
    if constexpr (decltype(f)::value == LowBitFormat::kBF16)
      quantize_bf16_kernel<<<grid, kThreads, 0, stream>>>(x, count, blocks * kQuantBlock,
                                                          reinterpret_cast<uint16_t*>(chunk));
    else
      quantize_scaled_kernel<decltype(f)::value><<<grid, kThreads, 0, stream>>>(x, count, blocks, chunk);
  });
}

cudaError_t launch_sum_quantized_blocks(LowBitFormat format, const uint8_t* received, int64_t chunk_bytes, int ranks,
                                        int64_t blocks, float* acc, cudaStream_t stream) {
  if (blocks <= 0) return cudaSuccess;
  return for_format(format, [&](auto f) {
    sum_kernel<decltype(f)::value><<<grid_for(blocks * kQuantBlock), kThreads, 0, stream>>>(received, chunk_bytes,
                                                                                           ranks, blocks, acc);
  });
}

cudaError_t launch_dequantize_blocks(LowBitFormat format, const uint8_t* chunk, int64_t blocks, int64_t count,
                                     float* out, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  return for_format(format, [&](auto f) {
    dequantize_kernel<decltype(f)::value><<<grid_for(count), kThreads, 0, stream>>>(chunk, blocks, count, out);
  });
}

}  // namespace trainer::models::cuda
