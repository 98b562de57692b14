// The speech models' sequence moves (backend.h, "Sequences"): gathering (masking, reversing and
// moving one LSTM direction in or out of the concatenated features), packing, Hardtanh, the
// image <-> sequence reorder of the convolutional front end, the width mask, and the batched
// transpose. The CPU loops they match are models/cpu/sequence_ops.cpp.
//
// Lengths arrive as HostInts (host_ints.h): kernel parameters, read from the constant bank.
#include <cstdint>

#include "models/cuda/kernels.h"
#include "models/cuda/launch.cuh"

namespace trainer::models::cuda {
namespace {

// Index i runs over dst's (t, n, col), col fastest, so consecutive threads touch consecutive
// floats of one row on both sides.
__global__ void sequence_gather_kernel(int64_t steps, int64_t batch, int64_t cols, HostInts lengths, bool reverse,
                                       const float* src, int64_t src_ld, float* dst, int64_t dst_ld) {
  const int64_t total = steps * batch * cols;
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t col = i % cols, row = i / cols, t = row / batch, n = row % batch;
    const int64_t length = lengths.v[n];
    float value = 0.f;
    if (t < length) {
      const int64_t from = reverse ? length - 1 - t : t;
      value = src[(from * batch + n) * src_ld + col];
    }
    dst[row * dst_ld + col] = value;
  }
}

// One block per padded row (t, n) at a time, its threads across the row's `cols` floats.
// to_packed: x -> packed (padding rows skipped); else packed -> x (padding rows zeroed).
// The packed row of a valid (t, n) is the number of valid rows before it in (t, n) order: the
// steps before t hold sum_m min(length_m, t) of them, step t those of m < n. That is O(batch)
// reads of the constant bank (one address for the whole block) once per row, never per element;
// written in the kernel body so the parameter is indexed in place, never copied.
__global__ void pack_kernel(int64_t steps, int64_t batch, int64_t cols, HostInts lengths, float* x, float* packed,
                            bool to_packed) {
  for (int64_t row = blockIdx.x; row < steps * batch; row += gridDim.x) {
    const int64_t t = row / batch, n = row % batch;
    float* padded = x + row * cols;
    if (t >= lengths.v[n]) {
      if (!to_packed)
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) padded[c] = 0.f;
      continue;
    }
    int64_t dense_row = 0;
    for (int64_t m = 0; m < batch; ++m) {
      const int64_t length = lengths.v[m] > 0 ? lengths.v[m] : 0;
      dense_row += length < t ? length : t;
      if (m < n && length > t) ++dense_row;
    }
    float* dense = packed + dense_row * cols;
    if (to_packed)
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) dense[c] = padded[c];
    else
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) padded[c] = dense[c];
  }
}

// std::min(std::max(x, lo), hi) as the CPU writes it: a NaN stays NaN (fminf/fmaxf would drop it).
__global__ void hardtanh_forward_kernel(int64_t n, float lo, float hi, const float* x, float* y) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float above = x[i] < lo ? lo : x[i];
    y[i] = hi < above ? hi : above;
  }
}

__global__ void hardtanh_backward_kernel(int64_t n, float lo, float hi, const float* y, const float* dy, float* dx) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) dx[i] = y[i] > lo && y[i] < hi ? dy[i] : 0.f;
}

// Index i runs over the sequence {W, N, C*H} (feature c*H + h), so the sequence side is contiguous;
// the image side goes through element_offset (any layout).
__global__ void image_sequence_kernel(ActivationDims d, float* image, float* sequence, bool to_sequence) {
  const int64_t total = d.n * d.c * d.h * d.w;
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t h = i % d.h, c = (i / d.h) % d.c, n = (i / (d.h * d.c)) % d.n, w = i / (d.h * d.c * d.n);
    const int64_t o = element_offset(d, n, c, h, w);
    if (to_sequence) sequence[i] = image[o];
    else image[o] = sequence[i];
  }
}

// Index i runs over (n, h, w, c), c fastest (contiguous in channels-last); only the columns
// w >= lengths[n] are written (a negative length masks the whole image, one past W nothing: the
// CPU's clamp to [0, W]).
__global__ void mask_width_kernel(ActivationDims d, float* x, HostInts lengths) {
  const int64_t total = d.n * d.c * d.h * d.w;
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t c = i % d.c, w = (i / d.c) % d.w, h = (i / (d.c * d.w)) % d.h, n = i / (d.c * d.w * d.h);
    if (w >= lengths.v[n]) x[element_offset(d, n, c, h, w)] = 0.f;
  }
}

// 32 x 32 tiles through shared memory, so both the reads of x and the writes of y are coalesced;
// the extra column keeps the transposed reads off a single bank. Blocks walk the tiles of every
// matrix in a grid-stride loop (the tile index depends on the block only, so the __syncthreads
// inside the loop are reached by the whole block).
constexpr int kTile = 32, kTileRows = 8;

__global__ void transpose_kernel(int64_t batch, int64_t rows, int64_t cols, const float* x, float* y) {
  __shared__ float tile[kTile][kTile + 1];
  const int64_t row_tiles = (rows + kTile - 1) / kTile, col_tiles = (cols + kTile - 1) / kTile;
  const int64_t tiles = batch * row_tiles * col_tiles;
  for (int64_t k = blockIdx.x; k < tiles; k += gridDim.x) {
    const int64_t b = k / (row_tiles * col_tiles), i0 = (k / col_tiles) % row_tiles * kTile,
                  j0 = k % col_tiles * kTile;
    const float* in = x + b * rows * cols;
    float* out = y + b * rows * cols;
    for (int r = threadIdx.y; r < kTile; r += kTileRows) {
      const int64_t i = i0 + r, j = j0 + threadIdx.x;
      if (i < rows && j < cols) tile[r][threadIdx.x] = in[i * cols + j];
    }
    __syncthreads();
    for (int r = threadIdx.y; r < kTile; r += kTileRows) {
      const int64_t j = j0 + r, i = i0 + threadIdx.x;
      if (i < rows && j < cols) out[j * rows + i] = tile[threadIdx.x][r];
    }
    __syncthreads();  // the tile is refilled by the next iteration
  }
}

}  // namespace

cudaError_t launch_sequence_gather(int64_t steps, int64_t batch, int64_t cols, const HostInts& lengths, bool reverse,
                                   const float* src, int64_t src_ld, float* dst, int64_t dst_ld, cudaStream_t stream) {
  const int64_t total = steps * batch * cols;
  if (total <= 0) return cudaSuccess;
  sequence_gather_kernel<<<grid_for(total), kThreads, 0, stream>>>(steps, batch, cols, lengths, reverse, src, src_ld,
                                                                    dst, dst_ld);
  return cudaGetLastError();
}

cudaError_t launch_pack_sequences(int64_t steps, int64_t batch, int64_t cols, const HostInts& lengths, const float* x,
                                  float* packed, cudaStream_t stream) {
  const int64_t rows = steps * batch;
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  // x is only read in this direction; the kernel's shared signature takes it non-const.
  pack_kernel<<<static_cast<unsigned>(rows < 65535 ? rows : 65535), kThreads, 0, stream>>>(
      steps, batch, cols, lengths, const_cast<float*>(x), packed, true);
  return cudaGetLastError();
}

cudaError_t launch_unpack_sequences(int64_t steps, int64_t batch, int64_t cols, const HostInts& lengths,
                                    const float* packed, float* x, cudaStream_t stream) {
  const int64_t rows = steps * batch;
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  pack_kernel<<<static_cast<unsigned>(rows < 65535 ? rows : 65535), kThreads, 0, stream>>>(
      steps, batch, cols, lengths, x, const_cast<float*>(packed), false);
  return cudaGetLastError();
}

cudaError_t launch_hardtanh_forward(int64_t n, float lo, float hi, const float* x, float* y, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  hardtanh_forward_kernel<<<grid_for(n), kThreads, 0, stream>>>(n, lo, hi, x, y);
  return cudaGetLastError();
}

cudaError_t launch_hardtanh_backward(int64_t n, float lo, float hi, const float* y, const float* dy, float* dx,
                                     cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  hardtanh_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(n, lo, hi, y, dy, dx);
  return cudaGetLastError();
}

cudaError_t launch_image_to_sequence(const float* image, ActivationDims d, float* sequence, cudaStream_t stream) {
  const int64_t total = d.n * d.c * d.h * d.w;
  if (total <= 0) return cudaSuccess;
  image_sequence_kernel<<<grid_for(total), kThreads, 0, stream>>>(d, const_cast<float*>(image), sequence, true);
  return cudaGetLastError();
}

cudaError_t launch_sequence_to_image(const float* sequence, ActivationDims d, float* image, cudaStream_t stream) {
  const int64_t total = d.n * d.c * d.h * d.w;
  if (total <= 0) return cudaSuccess;
  image_sequence_kernel<<<grid_for(total), kThreads, 0, stream>>>(d, image, const_cast<float*>(sequence), false);
  return cudaGetLastError();
}

cudaError_t launch_mask_width(float* x, ActivationDims d, const HostInts& lengths, cudaStream_t stream) {
  const int64_t total = d.n * d.c * d.h * d.w;
  if (total <= 0) return cudaSuccess;
  mask_width_kernel<<<grid_for(total), kThreads, 0, stream>>>(d, x, lengths);
  return cudaGetLastError();
}

cudaError_t launch_transpose(int64_t batch, int64_t rows, int64_t cols, const float* x, float* y,
                             cudaStream_t stream) {
  if (batch <= 0 || rows <= 0 || cols <= 0) return cudaSuccess;
  const int64_t tiles = batch * ((rows + kTile - 1) / kTile) * ((cols + kTile - 1) / kTile);
  transpose_kernel<<<static_cast<unsigned>(tiles < 65535 ? tiles : 65535), dim3(kTile, kTileRows), 0, stream>>>(
      batch, rows, cols, x, y);
  return cudaGetLastError();
}

}  // namespace trainer::models::cuda
