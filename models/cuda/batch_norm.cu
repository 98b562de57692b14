// Batch normalization of the CUDA backend: our own kernels rather than cuDNN's, because the op's
// contract (backend.h) is not cuDNN's: forward_training writes the batch mean and the *biased*
// variance (cuDNN saves the inverse standard deviation), frozen_stats trains with given statistics
// that backward treats as constants (cuDNN's training backward always differentiates through batch
// statistics), and fuse_relu's backward masks by the recomputed pre-activation. These are the
// oneDNN semantics of the CPU backend (models/cpu/dnnl_ops.cpp), formula for formula:
//   xhat = (x - mean) / sqrt(var + eps);  y = gamma * xhat + beta  (then ReLU when fused)
//   dbeta = sum dy';  dgamma = sum dy' * xhat  (dy' = dy masked by y > 0 when fused)
//   dx = gamma / sqrt(var + eps) * (dy' - dbeta / M - xhat * dgamma / M), or without the two
//   means when the statistics are frozen.
// Channels-last only: an activation is a row-major {M = N*H*W, C} matrix, so the statistics are
// per-column reductions.
//
// Launches: a training forward is one statistics kernel and one normalize kernel; backward is one
// kernel for the two gradient sums and one for dx (with frozen statistics dx needs no sums, so the
// sums kernel writes it: one launch). Every kernel runs on the same 2-D grid (Plan): blocks cover
// a group of channels (x) by a chunk of rows (y), each thread one channel and every lanes-th row of
// the chunk, so a warp reads consecutive floats and per-channel constants are computed once.
//
// Reductions in float, deterministic and without a one-block finish: each block combines its
// threads' values in a fixed tree and writes one partial per channel; the last block of a channel
// group to finish (a ticket counter, never float atomics) combines the group's partials in chunk
// order. Which block comes last varies from run to run, but the combination order does not, so the
// results are the same bits every run. The statistics are (count, mean, M2) moments of x - K (K a
// sample of the channel, its first row): Welford-style partials merged with Chan's formula, which
// stay accurate where a float sum of squares loses the variance to the mean (x around 500 +- 1:
// E[x^2] - E[x]^2 cancels 6 of float's 7 digits; tests/cuda_backend_test.cpp has the case), and
// the shift keeps the mean's rounding errors at the scale of the spread rather than of the offset.
#include <algorithm>
#include <new>
#include <stdexcept>
#include <string>

#include "models/cuda/kernels.h"
#include "models/cuda/launch.cuh"

namespace trainer::models::cuda {
namespace {

constexpr int kBlockThreads = 256;
constexpr int kMaxWidth = 64;           // channels per block: wider channel counts split into groups
constexpr int64_t kTargetBlocks = 512;  // about 4 blocks of 256 threads per SM on a 132-SM H100/H200
constexpr int kUnroll = 4;              // rows a thread loads before it uses them (memory parallelism)
constexpr int64_t kMinRowsPerThread = 4 * kUnroll;

// The grid every kernel of one op shares; it depends on the shape only (so do the results).
struct Plan {
  int64_t rows = 0, cols = 0;
  int width = 1, lanes = 1;                        // block = width channels x lanes rows
  int64_t groups = 1, chunk_rows = 1, chunks = 1;  // grid = groups x chunks

  static Plan make(int64_t rows, int64_t cols) {
    Plan p;
    p.rows = rows;
    p.cols = cols;
    // Balanced groups: 100 channels are two of 50, not 64 and 36.
    p.groups = cols > 0 ? (cols + kMaxWidth - 1) / kMaxWidth : 1;
    p.width = static_cast<int>(cols > 0 ? (cols + p.groups - 1) / p.groups : 1);
    p.lanes = kBlockThreads / p.width;
    // Enough rows per thread to amortize the per-channel setup and keep the partials few, enough
    // blocks to fill the GPU; a multiple of kUnroll so only a chunk's last rows are a short batch.
    const int64_t target_chunks = std::max<int64_t>(1, kTargetBlocks / p.groups);
    int64_t per_thread = (rows + p.lanes * target_chunks - 1) / (p.lanes * target_chunks);
    per_thread = std::max(kMinRowsPerThread, (per_thread + kUnroll - 1) / kUnroll * kUnroll);
    p.chunk_rows = p.lanes * per_thread;
    p.chunks = rows > 0 ? (rows + p.chunk_rows - 1) / p.chunk_rows : 1;  // <= target_chunks
    return p;
  }
  dim3 grid() const { return dim3(static_cast<unsigned>(groups), static_cast<unsigned>(chunks)); }
  dim3 block() const { return dim3(static_cast<unsigned>(width), static_cast<unsigned>(lanes)); }
  int64_t partials() const { return chunks * cols; }
};

// This thread's place in the plan: its channel and its rows [begin + lane, end) step lanes.
struct Place {
  int64_t channel, begin, end;
  int lane;
  bool active;  // a real channel (the last group may be narrower than the block)
  __device__ static Place of(const Plan& p) {
    Place t;
    t.channel = blockIdx.x * int64_t(p.width) + threadIdx.x;
    t.active = threadIdx.x < p.width && t.channel < p.cols;  // blockDim.x == width
    t.begin = blockIdx.y * p.chunk_rows;
    t.end = t.begin + p.chunk_rows < p.rows ? t.begin + p.chunk_rows : p.rows;
    t.lane = static_cast<int>(threadIdx.y);
    return t;
  }
};

// Loads this thread's next kUnroll values of a column before any is used; rows past the chunk read
// as 0 and say so in `valid` (a prefix of the batch, since rows increase). Every load is issued,
// from `row` (< end) in place of a row past the chunk, so none waits behind a branch.
struct Batch {
  float v[kUnroll];
  int valid = 0;
  __device__ void load(const float* m, const Plan& p, const Place& t, int64_t row) {
    valid = 0;
    const int64_t col = t.active ? t.channel : 0;
    for (int j = 0; j < kUnroll; ++j) {
      const int64_t r = row + int64_t(j) * p.lanes;
      const bool in = t.active && r < t.end;
      v[j] = m[(in ? r : row) * p.cols + col];
      if (!in) v[j] = 0.f;
      valid += in;
    }
  }
};

// Moments of a set of values: count, mean, sum of squared deviations from the mean.
struct Moments {
  float n, mean, m2;
};

// Chan et al.'s combination of two sets' moments; b may be empty. Counts are exact in float up
// to 2^24 rows per channel and only weigh the means beyond.
__device__ inline void merge(Moments& a, const Moments& b) {
  if (b.n == 0.f) return;
  const float n = a.n + b.n, delta = b.mean - a.mean, wb = b.n / n;
  a.mean += delta * wb;
  a.m2 += b.m2 + delta * delta * a.n * wb;
  a.n = n;
}

// The two gradient sums of backward, combined by plain addition.
struct Sums {
  float g, gx;  // sum dy', sum dy' * (x - mean)
};

__device__ inline void merge(Sums& a, const Sums& b) {
  a.g += b.g;
  a.gx += b.gx;
}

// Combines the block's values channel by channel across its lanes in a fixed tree (lane 0 gets the
// result). Every thread of the block calls it (it holds barriers).
template <class T>
__device__ T combine_lanes(T v, T* tile) {
  const int w = blockDim.x, x = threadIdx.x, y = threadIdx.y, lanes = blockDim.y;
  tile[y * w + x] = v;
  __syncthreads();
  int half = 1;
  while (half * 2 < lanes) half *= 2;
  for (; half > 0; half /= 2) {
    if (y < half && y + half < lanes) merge(tile[y * w + x], tile[(y + half) * w + x]);
    __syncthreads();
  }
  return tile[x];
}

// The last-block-done handshake: every block of a channel group takes a ticket after writing its
// partials; the one that takes the group's last ticket returns true and may read all of them. The
// fence before the ticket publishes the block's partials, the one after it (in the last block)
// orders the reads after every other block's ticket. The last block resets the counter for the next
// launch (all the group's tickets are taken by then).
__device__ bool last_block_of_group(unsigned* counter, unsigned blocks) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0) {
    last = atomicAdd(counter, 1u) == blocks - 1;
    if (last) {
      __threadfence();
      *counter = 0;
    }
  }
  __syncthreads();
  return last;
}

__device__ inline float shift_of(const float* x, int64_t channel) { return x[channel]; }  // row 0

__global__ void statistics_kernel(Plan p, const float* x, float* part_mean, float* part_m2, unsigned* counters,
                                  float* mean, float* var) {
  __shared__ Moments tile[kBlockThreads];
  const Place t = Place::of(p);
  const float shift = t.active ? shift_of(x, t.channel) : 0.f;
  Moments acc{0.f, 0.f, 0.f};
  for (int64_t row = t.begin + t.lane; row < t.end; row += int64_t(kUnroll) * p.lanes) {
    Batch b;
    b.load(x, p, t, row);
    // The batch's own moments (a two-pass mean and M2 over registers), then one merge: one
    // division per kUnroll values rather than Welford's one per value.
    float s = 0.f;
    for (int j = 0; j < kUnroll; ++j) {
      b.v[j] -= shift;
      if (j < b.valid) s += b.v[j];
    }
    const float mean = b.valid == kUnroll ? s * (1.f / kUnroll) : b.valid ? s / static_cast<float>(b.valid) : 0.f;
    Moments m{static_cast<float>(b.valid), mean, 0.f};
    for (int j = 0; j < kUnroll; ++j) {
      const float d = b.v[j] - m.mean;
      if (j < b.valid) m.m2 += d * d;
    }
    merge(acc, m);
  }
  acc = combine_lanes(acc, tile);
  if (t.lane == 0 && t.active) {
    part_mean[blockIdx.y * p.cols + t.channel] = acc.mean;
    part_m2[blockIdx.y * p.cols + t.channel] = acc.m2;
  }
  if (!last_block_of_group(counters + blockIdx.x, static_cast<unsigned>(p.chunks))) return;

  // The group's finish: lane l merges chunks l, l + lanes, ... in order, then the lanes' tree.
  acc = Moments{0.f, 0.f, 0.f};
  if (t.active)
    for (int64_t chunk = t.lane; chunk < p.chunks; chunk += p.lanes) {
      const int64_t first = chunk * p.chunk_rows;
      const int64_t count = first + p.chunk_rows < p.rows ? p.chunk_rows : p.rows - first;
      merge(acc, Moments{static_cast<float>(count), __ldcg(part_mean + chunk * p.cols + t.channel),
                         __ldcg(part_m2 + chunk * p.cols + t.channel)});
    }
  acc = combine_lanes(acc, tile);
  if (t.lane == 0 && t.active) {
    mean[t.channel] = shift + acc.mean;
    var[t.channel] = acc.m2 / static_cast<float>(p.rows);  // biased
  }
}

// One channel's normalization, computed the same way wherever it is needed, so that backward's
// ReLU mask sees forward's pre-activation bit for bit.
struct ChannelNorm {
  float mean, inv_std, scale, beta;  // scale = gamma * inv_std
  __device__ static ChannelNorm of(const float* mean, const float* var, const float* gamma, const float* beta,
                                   float eps, int64_t c) {
    const float inv_std = 1.f / sqrtf(var[c] + eps);
    return ChannelNorm{mean[c], inv_std, gamma[c] * inv_std, beta[c]};
  }
  // (x - mean) first: exact for x near the mean, so a large mean costs no precision.
  __device__ float pre_activation(float x) const { return fmaf(x - mean, scale, beta); }
  // dy' of the formulas: dy, masked by the ReLU's pre-activation when fused.
  __device__ float masked(float g, float x, bool relu) const { return relu && !(pre_activation(x) > 0.f) ? 0.f : g; }
};

struct Stats {  // the op's inputs that ChannelNorm reads
  const float *mean, *var, *gamma, *beta;
  float eps;
  __device__ ChannelNorm channel(int64_t c) const { return ChannelNorm::of(mean, var, gamma, beta, eps, c); }
};

__global__ void normalize_kernel(Plan p, const float* x, Stats stats, bool relu, float* y) {
  const Place t = Place::of(p);
  if (!t.active) return;  // no barriers below
  const ChannelNorm n = stats.channel(t.channel);
  for (int64_t row = t.begin + t.lane; row < t.end; row += int64_t(kUnroll) * p.lanes) {
    Batch b;
    b.load(x, p, t, row);
    for (int j = 0; j < kUnroll; ++j) {  // a constant trip count keeps the batch in registers
      if (j >= b.valid) continue;
      const float v = n.pre_activation(b.v[j]);
      y[(row + int64_t(j) * p.lanes) * p.cols + t.channel] = relu && !(v > 0.f) ? 0.f : v;
    }
  }
}

// {sum dy', sum dy' * (x - mean)} per channel (dgamma is the second times inv_std). With frozen
// statistics dx = scale * dy' needs no sums, so this pass writes it too.
__global__ void gradient_sums_kernel(Plan p, const float* x, const float* dy, Stats stats, bool relu, bool frozen,
                                     float* part_g, float* part_gx, unsigned* counters, float* dgamma, float* dbeta,
                                     float* dx) {
  __shared__ Sums tile[kBlockThreads];
  const Place t = Place::of(p);
  ChannelNorm n{0.f, 0.f, 0.f, 0.f};
  if (t.active) n = stats.channel(t.channel);
  Sums acc{0.f, 0.f};
  for (int64_t row = t.begin + t.lane; row < t.end; row += int64_t(kUnroll) * p.lanes) {
    Batch xs, gs;
    xs.load(x, p, t, row);
    gs.load(dy, p, t, row);
    for (int j = 0; j < kUnroll; ++j) {
      if (j >= xs.valid) continue;
      const float g = n.masked(gs.v[j], xs.v[j], relu);
      acc.g += g;
      acc.gx += g * (xs.v[j] - n.mean);
      if (frozen) dx[(row + int64_t(j) * p.lanes) * p.cols + t.channel] = n.scale * g;
    }
  }
  acc = combine_lanes(acc, tile);
  if (t.lane == 0 && t.active) {
    part_g[blockIdx.y * p.cols + t.channel] = acc.g;
    part_gx[blockIdx.y * p.cols + t.channel] = acc.gx;
  }
  if (!last_block_of_group(counters + blockIdx.x, static_cast<unsigned>(p.chunks))) return;

  acc = Sums{0.f, 0.f};
  if (t.active)
    for (int64_t chunk = t.lane; chunk < p.chunks; chunk += p.lanes)
      merge(acc, Sums{__ldcg(part_g + chunk * p.cols + t.channel), __ldcg(part_gx + chunk * p.cols + t.channel)});
  acc = combine_lanes(acc, tile);
  if (t.lane == 0 && t.active) {
    dbeta[t.channel] = acc.g;
    dgamma[t.channel] = acc.gx * n.inv_std;
  }
}

// dx with batch statistics: scale * (dy' - dbeta / M - xhat * dgamma / M).
__global__ void input_gradient_kernel(Plan p, const float* x, const float* dy, Stats stats, bool relu,
                                      const float* dgamma, const float* dbeta, float* dx) {
  const Place t = Place::of(p);
  if (!t.active) return;  // no barriers below
  const ChannelNorm n = stats.channel(t.channel);
  const float inv_count = 1.f / static_cast<float>(p.rows);
  const float mean_g = dbeta[t.channel] * inv_count;              // dbeta / M
  const float slope = dgamma[t.channel] * n.inv_std * inv_count;  // dgamma / M per unit of x - mean
  for (int64_t row = t.begin + t.lane; row < t.end; row += int64_t(kUnroll) * p.lanes) {
    Batch xs, gs;
    xs.load(x, p, t, row);
    gs.load(dy, p, t, row);
    for (int j = 0; j < kUnroll; ++j) {
      if (j >= xs.valid) continue;
      const float g = n.masked(gs.v[j], xs.v[j], relu);
      dx[(row + int64_t(j) * p.lanes) * p.cols + t.channel] = n.scale * (g - mean_g - (xs.v[j] - n.mean) * slope);
    }
  }
}

__global__ void update_running_kernel(int64_t channels, float m, float unbias, const float* batch_mean,
                                      const float* batch_var, float* running_mean, float* running_var) {
  for (int64_t c = first_index(); c < channels; c += grid_stride()) {
    running_mean[c] = (1.f - m) * running_mean[c] + m * batch_mean[c];
    running_var[c] = (1.f - m) * running_var[c] + m * batch_var[c] * unbias;
  }
}

void check_launch(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string("CUDA: ") + what + ": " + cudaGetErrorString(status));
}

class CudaBatchNorm final : public BatchNormOp {
 public:
  CudaBatchNorm(const BatchNormGeometry& g, DeviceMemory& memory, cudaStream_t stream)
      : g_(g), memory_(memory), stream_(stream), plan_(Plan::make(g.batch * g.h * g.w, g.channels)) {
    if (g.layout != Layout::kChannelsLast)
      throw std::invalid_argument("CUDA batch norm: only channels-last activations (the CUDA backend's layout)");
    // Two partials per (chunk, channel), shared by forward and backward, then one ticket counter
    // per channel group. The counters start at zero (0.f's bits) and each launch leaves them so.
    const int64_t floats = 2 * plan_.partials() + plan_.groups;
    scratch_ = static_cast<float*>(memory_.allocate(sizeof(float) * static_cast<size_t>(floats)));
    counters_ = reinterpret_cast<unsigned*>(scratch_ + 2 * plan_.partials());
    memory_.fill(plan_.groups, 0.f, scratch_ + 2 * plan_.partials());
  }
  ~CudaBatchNorm() override { memory_.free(scratch_); }

  void forward_training(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                        float* var) override {
    if (empty()) return;
    if (!g_.frozen_stats) {
      statistics_kernel<<<plan_.grid(), plan_.block(), 0, stream_>>>(plan_, x, scratch_, scratch_ + plan_.partials(),
                                                                     counters_, mean, var);
      check_launch(cudaGetLastError(), "batch norm statistics");
    }
    normalize(x, gamma, beta, mean, var, y);
  }

  void forward_inference(const float* x, const float* gamma, const float* beta, const float* mean, const float* var,
                         float* y) override {
    if (!empty()) normalize(x, gamma, beta, mean, var, y);
  }

  void backward(const float* x, const float* dy, const float* gamma, const float* beta, const float* mean,
                const float* var, float* dx, float* dgamma, float* dbeta) override {
    if (empty()) return;
    const Stats stats{mean, var, gamma, beta, g_.eps};
    gradient_sums_kernel<<<plan_.grid(), plan_.block(), 0, stream_>>>(
        plan_, x, dy, stats, g_.fuse_relu, g_.frozen_stats, scratch_, scratch_ + plan_.partials(), counters_, dgamma,
        dbeta, dx);
    check_launch(cudaGetLastError(), "batch norm gradient sums");
    if (g_.frozen_stats) return;  // the sums kernel wrote dx
    input_gradient_kernel<<<plan_.grid(), plan_.block(), 0, stream_>>>(plan_, x, dy, stats, g_.fuse_relu, dgamma, dbeta,
                                                                       dx);
    check_launch(cudaGetLastError(), "batch norm input gradient");
  }

 private:
  bool empty() const { return plan_.rows <= 0 || plan_.cols <= 0; }

  void normalize(const float* x, const float* gamma, const float* beta, const float* mean, const float* var, float* y) {
    normalize_kernel<<<plan_.grid(), plan_.block(), 0, stream_>>>(plan_, x, Stats{mean, var, gamma, beta, g_.eps},
                                                                  g_.fuse_relu, y);
    check_launch(cudaGetLastError(), "batch norm normalize");
  }

  BatchNormGeometry g_;
  DeviceMemory& memory_;
  cudaStream_t stream_;
  Plan plan_;
  float* scratch_ = nullptr;
  unsigned* counters_ = nullptr;
};

}  // namespace

std::unique_ptr<BatchNormOp> make_batchnorm_op(const BatchNormGeometry& g, DeviceMemory& memory, cudaStream_t stream) {
  if (g.dtype != DType::kF32) throw std::invalid_argument("CUDA batch norm: fp32 activations only");
  return std::make_unique<CudaBatchNorm>(g, memory, stream);
}

cudaError_t launch_batchnorm_update_running(int64_t channels, float momentum, float unbias, const float* batch_mean,
                                            const float* batch_var, float* running_mean, float* running_var,
                                            cudaStream_t stream) {
  if (channels <= 0) return cudaSuccess;
  update_running_kernel<<<grid_for(channels), kThreads, 0, stream>>>(channels, momentum, unbias, batch_mean, batch_var,
                                                                     running_mean, running_var);
  return cudaGetLastError();
}

}  // namespace trainer::models::cuda
