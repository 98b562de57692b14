// The sparse gradient-sync passes of the CUDA backend (backend.h, "Sparse gradient sync"): the
// passes over the gradient, error feedback's residual and the dense output that the sparse methods
// (comm/sync/methods/sparse/sparse_passes.h) make on the device, so that only their k-entry lists cross to the host.
//
// - acc = grad + residual is formed in the first pass that reads acc (one float add per entry: the
//   host's bits).
// - The radix select's histogram counts with integer atomics, so its counts are exact and
//   repeatable: each warp into its own copy in shared memory (a magnitude's top digit is its
//   exponent, so most entries hit a handful of bins, and one copy per block would serialize on
//   them), then one add per bin and block into the device histogram, from a bounded number of
//   blocks (kHistogramBlocks) that stride over the gradient.
// - Selection is a stream compaction in index order: each block owns a fixed chunk of entries;
//   pass 1 counts per block, one block scans the counts into offsets, pass 2 re-reads the chunk tile
//   by tile and writes each tile's selected entries at their rank (a warp ballot for the lanes
//   before, per-warp counts for the warps before). No atomics decide an order, so the list is the
//   same every run and on every device.
// - GaussianK's moments sum in double over fixed element blocks in block order.
#include <cstring>

#include "models/cuda/block_sum.cuh"
#include "models/cuda/kernels.h"
#include "models/cuda/launch.cuh"

namespace trainer::models::cuda {
namespace {

constexpr uint32_t kInfinityKey = 0x7f800000u;
constexpr int kSelectThreads = 256;
// Entries per block of the compaction: 16 tiles of one entry per thread.
constexpr int64_t kSelectChunk = int64_t{kSelectThreads} * 16;
constexpr int kScanThreads = 1024;
constexpr int64_t kMomentsBlock = 1 << 16;
constexpr int kMomentsThreads = 256;
constexpr int kHistogramThreads = 256, kHistogramWarps = kHistogramThreads / 32;
constexpr unsigned kHistogramBlocks = 1024;

__device__ inline uint32_t magnitude_key(float v) {
  uint32_t bits;
  memcpy(&bits, &v, sizeof bits);
  return bits & 0x7fffffffu;
}

// acc[i], formed as grad[i] + acc[i] (and stored) when grad is given.
__device__ inline float accumulated(const float* grad, float* acc, int64_t i) {
  if (!grad) return acc[i];
  const float a = grad[i] + acc[i];
  acc[i] = a;
  return a;
}

__global__ void zero_ints_kernel(int64_t n, int32_t* x) {
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) x[i] = 0;
}

__global__ void magnitude_histogram_kernel(int64_t n, const float* grad, float* acc, uint32_t min_key, uint32_t mask,
                                           uint32_t prefix, int shift, int32_t* histogram) {
  __shared__ int32_t local[kHistogramWarps][256];
  for (int d = threadIdx.x; d < kHistogramWarps * 256; d += kHistogramThreads) local[d / 256][d % 256] = 0;
  __syncthreads();
  int32_t* mine = local[threadIdx.x / 32];
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const uint32_t key = magnitude_key(accumulated(grad, acc, i));
    if (key >= min_key && key <= kInfinityKey && (key & mask) == prefix) atomicAdd(&mine[(key >> shift) & 255], 1);
  }
  __syncthreads();
  for (int d = threadIdx.x; d < 256; d += kHistogramThreads) {
    int32_t sum = 0;
    for (int w = 0; w < kHistogramWarps; ++w) sum += local[w][d];
    if (sum != 0) atomicAdd(&histogram[d], sum);
  }
}

// Exclusive prefix sums of one value per thread of a block of kThreadsPerBlock threads
// (Hillis-Steele in shared memory); `total` gets the block's sum.
template <int kThreadsPerBlock>
__device__ int64_t block_exclusive_scan(int64_t v, int64_t& total) {
  __shared__ int64_t scan[kThreadsPerBlock];
  scan[threadIdx.x] = v;
  __syncthreads();
  for (int offset = 1; offset < kThreadsPerBlock; offset *= 2) {
    const int64_t add = threadIdx.x >= offset ? scan[threadIdx.x - offset] : 0;
    __syncthreads();
    scan[threadIdx.x] += add;
    __syncthreads();
  }
  total = scan[kThreadsPerBlock - 1];
  const int64_t inclusive = scan[threadIdx.x];
  __syncthreads();  // the next call reuses the array
  return inclusive - v;
}

// Pass 1: counts[b] = entries of block b's chunk with |acc| >= t (acc formed on the way).
__global__ void count_at_least_kernel(int64_t n, const float* grad, float* acc, float t, int64_t* counts) {
  const int64_t begin = blockIdx.x * kSelectChunk;
  const int64_t end = begin + kSelectChunk < n ? begin + kSelectChunk : n;
  int64_t c = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += kSelectThreads) c += fabsf(accumulated(grad, acc, i)) >= t;
  int64_t total = 0;
  block_exclusive_scan<kSelectThreads>(c, total);
  if (threadIdx.x == 0) counts[blockIdx.x] = total;
}

// counts[0, blocks) becomes their exclusive prefix sums and counts[blocks] the total (one block:
// each thread sums a contiguous run of blocks, the runs are scanned, then written back).
__global__ void scan_counts_kernel(int64_t blocks, int64_t* counts) {
  const int64_t per = (blocks + kScanThreads - 1) / kScanThreads;
  const int64_t begin = threadIdx.x * per;
  const int64_t end = begin + per < blocks ? begin + per : blocks;
  int64_t sum = 0;
  for (int64_t b = begin; b < end; ++b) sum += counts[b];
  int64_t total = 0;
  int64_t running = block_exclusive_scan<kScanThreads>(sum, total);
  for (int64_t b = begin; b < end; ++b) {
    const int64_t c = counts[b];
    counts[b] = running;
    running += c;
  }
  if (threadIdx.x == 0) counts[blocks] = total;
}

// Pass 2: block b writes its chunk's selected entries from offsets[b] on, in index order, a tile
// of one entry per thread at a time: a thread's rank in its tile is the selected lanes before it in
// its warp (a ballot) plus the selected entries of the warps before (one count per warp).
__global__ void write_at_least_kernel(int64_t n, const float* acc, float t, const int64_t* offsets, int32_t* index,
                                      float* value) {
  constexpr int kWarps = kSelectThreads / 32;
  __shared__ int warp_counts[kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t begin = blockIdx.x * kSelectChunk;
  const int64_t end = begin + kSelectChunk < n ? begin + kSelectChunk : n;
  int64_t at = offsets[blockIdx.x];
  for (int64_t tile = begin; tile < end; tile += kSelectThreads) {
    const int64_t i = tile + threadIdx.x;
    const float v = i < end ? acc[i] : 0.f;
    const bool selected = i < end && fabsf(v) >= t;
    const unsigned ballot = __ballot_sync(0xffffffffu, selected);
    if (lane == 0) warp_counts[warp] = __popc(ballot);
    __syncthreads();
    int64_t before = __popc(ballot & ((1u << lane) - 1u)), tile_count = 0;
    for (int w = 0; w < kWarps; ++w) {
      if (w < warp) before += warp_counts[w];
      tile_count += warp_counts[w];
    }
    if (selected) {
      index[at + before] = static_cast<int32_t>(i);
      value[at + before] = v;
    }
    at += tile_count;
    __syncthreads();  // every warp has read warp_counts before the next tile writes it
  }
}

// Per block of kMomentsBlock entries: the sums of acc and acc^2 in double (acc formed).
__global__ void moments_partial_kernel(int64_t n, const float* grad, float* acc, double* partial) {
  const int64_t begin = blockIdx.x * kMomentsBlock;
  const int64_t end = begin + kMomentsBlock < n ? begin + kMomentsBlock : n;
  double sum = 0, sum_sq = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += kMomentsThreads) {
    const double a = accumulated(grad, acc, i);
    sum += a;
    sum_sq += a * a;
  }
  sum = block_sum<kMomentsThreads>(sum);
  sum_sq = block_sum<kMomentsThreads>(sum_sq);
  if (threadIdx.x == 0) {
    partial[2 * blockIdx.x] = sum;
    partial[2 * blockIdx.x + 1] = sum_sq;
  }
}

// The blocks' partials in block order (one thread: a few hundred blocks for the largest gradients).
__global__ void moments_finish_kernel(int64_t blocks, const double* partial, double* sums) {
  double sum = 0, sum_sq = 0;
  for (int64_t b = 0; b < blocks; ++b) sum += partial[2 * b], sum_sq += partial[2 * b + 1];
  sums[0] = sum;
  sums[1] = sum_sq;
}

__global__ void fill_kernel(int64_t n, float value, float* y) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = value;
}

__global__ void scatter_divided_kernel(int64_t count, const int32_t* index, const float* value, float divisor,
                                       float* y) {
  for (int64_t j = first_index(); j < count; j += grid_stride()) y[index[j]] = value[j] / divisor;
}

__global__ void scatter_fill_kernel(int64_t count, const int32_t* index, float value, float* y) {
  for (int64_t j = first_index(); j < count; j += grid_stride()) y[index[j]] = value;
}

// dgc.h's update in backend.h's rounding: the roundings spelled out so nothing is contracted otherwise.
__global__ void momentum_correction_kernel(int64_t n, float momentum, bool nesterov, float* velocity, float* grad) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    if (nesterov) {
      const float t = __fadd_rn(velocity[i], grad[i]);
      velocity[i] = __fmul_rn(momentum, t);
      grad[i] = __fmaf_rn(momentum, t, grad[i]);
    } else {
      grad[i] = velocity[i] = __fmaf_rn(momentum, velocity[i], grad[i]);
    }
  }
}

}  // namespace

cudaError_t launch_magnitude_histogram(int64_t n, const float* grad, float* acc, uint32_t min_key, uint32_t mask,
                                       uint32_t prefix, int shift, int32_t* histogram, cudaStream_t stream) {
  zero_ints_kernel<<<1, kThreads, 0, stream>>>(256, histogram);
  cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess || n == 0) return status;
  const unsigned blocks = grid_for(n) < kHistogramBlocks ? grid_for(n) : kHistogramBlocks;
  magnitude_histogram_kernel<<<blocks, kHistogramThreads, 0, stream>>>(n, grad, acc, min_key, mask, prefix, shift,
                                                                       histogram);
  return cudaGetLastError();
}

int64_t select_blocks(int64_t n) { return (n + kSelectChunk - 1) / kSelectChunk; }

cudaError_t launch_count_at_least(int64_t n, const float* grad, float* acc, float t, int64_t* counts,
                                  cudaStream_t stream) {
  const int64_t blocks = select_blocks(n);
  if (blocks > 0) {
    count_at_least_kernel<<<static_cast<unsigned>(blocks), kSelectThreads, 0, stream>>>(n, grad, acc, t, counts);
    const cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) return status;
  }
  scan_counts_kernel<<<1, kScanThreads, 0, stream>>>(blocks, counts);
  return cudaGetLastError();
}

cudaError_t launch_write_at_least(int64_t n, const float* acc, float t, const int64_t* offsets, int32_t* index,
                                  float* value, cudaStream_t stream) {
  const int64_t blocks = select_blocks(n);
  if (blocks == 0) return cudaSuccess;
  write_at_least_kernel<<<static_cast<unsigned>(blocks), kSelectThreads, 0, stream>>>(n, acc, t, offsets, index,
                                                                                       value);
  return cudaGetLastError();
}

int64_t moments_partials(int64_t n) { return n > 0 ? (n + kMomentsBlock - 1) / kMomentsBlock : 0; }

cudaError_t launch_accumulate_moments(int64_t n, const float* grad, float* acc, double* partial, double* sums,
                                      cudaStream_t stream) {
  const int64_t blocks = moments_partials(n);
  if (blocks > 0) {
    moments_partial_kernel<<<static_cast<unsigned>(blocks), kMomentsThreads, 0, stream>>>(n, grad, acc, partial);
    const cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) return status;
  }
  moments_finish_kernel<<<1, 1, 0, stream>>>(blocks, partial, sums);
  return cudaGetLastError();
}

cudaError_t launch_sparse_to_dense(int64_t n, int64_t count, const int32_t* index, const float* value, float divisor,
                                   float* y, cudaStream_t stream) {
  if (n > 0) {
    fill_kernel<<<grid_for(n), kThreads, 0, stream>>>(n, 0.f, y);
    const cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) return status;
  }
  if (count == 0) return cudaSuccess;
  scatter_divided_kernel<<<grid_for(count), kThreads, 0, stream>>>(count, index, value, divisor, y);
  return cudaGetLastError();
}

cudaError_t launch_scatter_fill(int64_t count, const int32_t* index, float value, float* y, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  scatter_fill_kernel<<<grid_for(count), kThreads, 0, stream>>>(count, index, value, y);
  return cudaGetLastError();
}

cudaError_t launch_momentum_correction(int64_t n, float momentum, bool nesterov, float* velocity, float* grad,
                                       cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  momentum_correction_kernel<<<grid_for(n), kThreads, 0, stream>>>(n, momentum, nesterov, velocity, grad);
  return cudaGetLastError();
}

}  // namespace trainer::models::cuda
