// Deterministic per-column sums over a row-major {rows, cols} matrix (channels-last activations are
// {N*H*W, C}): what sum_rows and batch norm's statistics and gradients need (.cu files only).
//
// Stage 1 gives each block 32 columns and a fixed chunk of rows; its 32 x 8 threads sum in double in
// a fixed order and write one partial per (chunk, column). Stage 2 sums a column's partials in chunk
// order. Chunks depend on the shape only, so the result is the same on every run.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace trainer::models::cuda {

constexpr int kColumnsPerBlock = 32, kRowThreads = 8;

struct ColumnReducePlan {
  int64_t rows = 0, cols = 0, chunk_rows = 0, chunks = 0;
  static ColumnReducePlan make(int64_t rows, int64_t cols) {
    ColumnReducePlan p;
    p.rows = rows;
    p.cols = cols;
    p.chunk_rows = 256;
    while ((rows + p.chunk_rows - 1) / p.chunk_rows > 65535) p.chunk_rows *= 2;  // grid.y limit
    p.chunks = rows > 0 ? (rows + p.chunk_rows - 1) / p.chunk_rows : 1;
    return p;
  }
  int64_t partials() const { return chunks * cols; }
};

// Two sums at once (batch norm backward: sum dy and sum dy * xhat). An aggregate, so it may live in
// shared memory; V{} is zero.
struct DoublePair {
  double a, b;
  __device__ DoublePair& operator+=(const DoublePair& o) {
    a += o.a;
    b += o.b;
    return *this;
  }
};

// F: __device__ V operator()(int64_t row, int64_t col) const.
template <class V, class F>
__global__ void column_partials_kernel(ColumnReducePlan plan, F f, V* partial) {
  __shared__ V shared[kRowThreads][kColumnsPerBlock];
  const int64_t col = blockIdx.x * int64_t(kColumnsPerBlock) + threadIdx.x;
  const int64_t begin = blockIdx.y * plan.chunk_rows;
  const int64_t end = begin + plan.chunk_rows < plan.rows ? begin + plan.chunk_rows : plan.rows;
  V acc{};
  if (col < plan.cols)
    for (int64_t r = begin + threadIdx.y; r < end; r += kRowThreads) acc += f(r, col);
  shared[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < plan.cols) {
    V s = shared[0][threadIdx.x];
    for (int i = 1; i < kRowThreads; ++i) s += shared[i][threadIdx.x];
    partial[blockIdx.y * plan.cols + col] = s;
  }
}

// G: __device__ void operator()(int64_t col, const V& sum) const.
template <class V, class G>
__global__ void column_finish_kernel(ColumnReducePlan plan, const V* partial, G g) {
  const int64_t col = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (col >= plan.cols) return;
  V s = partial[col];
  for (int64_t c = 1; c < plan.chunks; ++c) s += partial[c * plan.cols + col];
  g(col, s);
}

template <class V, class F, class G>
cudaError_t launch_column_reduce(const ColumnReducePlan& plan, F f, G g, V* partial, cudaStream_t stream) {
  if (plan.cols <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((plan.cols + kColumnsPerBlock - 1) / kColumnsPerBlock),
                  static_cast<unsigned>(plan.chunks));
  column_partials_kernel<V, F><<<grid, dim3(kColumnsPerBlock, kRowThreads), 0, stream>>>(plan, f, partial);
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) return status;
  column_finish_kernel<V, G><<<static_cast<unsigned>((plan.cols + 255) / 256), 256, 0, stream>>>(plan, partial, g);
  return cudaGetLastError();
}

}  // namespace trainer::models::cuda
