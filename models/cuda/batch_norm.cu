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
// column sums (column_reduce.cuh: double accumulation, deterministic).
#include <new>
#include <stdexcept>
#include <string>

#include "models/cuda/column_reduce.cuh"
#include "models/cuda/kernels.h"
#include "models/cuda/launch.cuh"

namespace trainer::models::cuda {
namespace {

// The one place the normalization is computed, so forward and backward see the same pre-activation.
struct Normalizer {
  const float *mean, *var, *gamma, *beta;
  float eps;
  __device__ float inv_std(int64_t c) const { return 1.f / sqrtf(var[c] + eps); }
  __device__ float xhat(float x, int64_t c) const { return (x - mean[c]) * inv_std(c); }
  __device__ float pre_activation(float x, int64_t c) const { return gamma[c] * xhat(x, c) + beta[c]; }
};

struct SumX {
  const float* x;
  int64_t cols;
  __device__ double operator()(int64_t r, int64_t c) const { return x[r * cols + c]; }
};

struct SumSquaredDeviation {
  const float* x;
  const float* mean;
  int64_t cols;
  __device__ double operator()(int64_t r, int64_t c) const {
    const double d = static_cast<double>(x[r * cols + c]) - mean[c];
    return d * d;
  }
};

struct StoreMean {  // also used for the variance: both divide a column sum by M
  float* out;
  double count;
  __device__ void operator()(int64_t c, double s) const { out[c] = static_cast<float>(s / count); }
};

// {sum dy', sum dy' * xhat} per channel.
struct GradientSums {
  const float *x, *dy;
  Normalizer norm;
  int64_t cols;
  bool relu;
  __device__ DoublePair operator()(int64_t r, int64_t c) const {
    const float xv = x[r * cols + c];
    float g = dy[r * cols + c];
    if (relu && !(norm.pre_activation(xv, c) > 0.f)) g = 0.f;
    return DoublePair{g, static_cast<double>(g) * norm.xhat(xv, c)};
  }
};

struct StoreGradients {
  float *dgamma, *dbeta;
  __device__ void operator()(int64_t c, const DoublePair& s) const {
    dbeta[c] = static_cast<float>(s.a);
    dgamma[c] = static_cast<float>(s.b);
  }
};

__global__ void normalize_kernel(int64_t total, int64_t cols, const float* x, Normalizer norm, bool relu, float* y) {
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const float v = norm.pre_activation(x[i], i % cols);
    y[i] = relu ? (v > 0.f ? v : 0.f) : v;
  }
}

__global__ void input_gradient_kernel(int64_t total, int64_t cols, const float* x, const float* dy, Normalizer norm,
                                      bool relu, bool frozen, const float* dgamma, const float* dbeta, float* dx) {
  const float inv_count = 1.f / static_cast<float>(total / cols);
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t c = i % cols;
    const float xv = x[i];
    float g = dy[i];
    if (relu && !(norm.pre_activation(xv, c) > 0.f)) g = 0.f;
    const float scale = norm.gamma[c] * norm.inv_std(c);
    dx[i] = frozen ? scale * g : scale * (g - dbeta[c] * inv_count - norm.xhat(xv, c) * dgamma[c] * inv_count);
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
      : g_(g), memory_(memory), stream_(stream), plan_(ColumnReducePlan::make(g.batch * g.h * g.w, g.channels)) {
    if (g.layout != Layout::kChannelsLast)
      throw std::invalid_argument("CUDA batch norm: only channels-last activations (the CUDA backend's layout)");
    // One scratch for both reductions: pairs are the larger.
    partial_ = memory_.allocate(sizeof(DoublePair) * static_cast<size_t>(plan_.partials()));
  }
  ~CudaBatchNorm() override { memory_.free(partial_); }

  void forward_training(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                        float* var) override {
    if (!g_.frozen_stats) {
      auto* partial = static_cast<double*>(partial_);
      const double count = static_cast<double>(plan_.rows);
      check_launch(launch_column_reduce(plan_, SumX{x, g_.channels}, StoreMean{mean, count}, partial, stream_),
                   "batch norm mean");
      check_launch(launch_column_reduce(plan_, SumSquaredDeviation{x, mean, g_.channels}, StoreMean{var, count},
                                        partial, stream_),
                   "batch norm variance");
    }
    normalize(x, gamma, beta, mean, var, y);
  }

  void forward_inference(const float* x, const float* gamma, const float* beta, const float* mean,
                         const float* var, float* y) override {
    normalize(x, gamma, beta, mean, var, y);
  }

  void backward(const float* x, const float* dy, const float* gamma, const float* beta, const float* mean,
                const float* var, float* dx, float* dgamma, float* dbeta) override {
    const Normalizer norm{mean, var, gamma, beta, g_.eps};
    check_launch(launch_column_reduce(plan_, GradientSums{x, dy, norm, g_.channels, g_.fuse_relu},
                                      StoreGradients{dgamma, dbeta}, static_cast<DoublePair*>(partial_), stream_),
                 "batch norm gradient sums");
    const int64_t total = plan_.rows * g_.channels;
    if (total <= 0) return;
    input_gradient_kernel<<<grid_for(total), kThreads, 0, stream_>>>(total, g_.channels, x, dy, norm, g_.fuse_relu,
                                                                      g_.frozen_stats, dgamma, dbeta, dx);
    check_launch(cudaGetLastError(), "batch norm input gradient");
  }

 private:
  void normalize(const float* x, const float* gamma, const float* beta, const float* mean, const float* var,
                 float* y) {
    const int64_t total = plan_.rows * g_.channels;
    if (total <= 0) return;
    normalize_kernel<<<grid_for(total), kThreads, 0, stream_>>>(total, g_.channels, x,
                                                                 Normalizer{mean, var, gamma, beta, g_.eps},
                                                                 g_.fuse_relu, y);
    check_launch(cudaGetLastError(), "batch norm normalize");
  }

  BatchNormGeometry g_;
  DeviceMemory& memory_;
  cudaStream_t stream_;
  ColumnReducePlan plan_;
  void* partial_ = nullptr;
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
  update_running_kernel<<<grid_for(channels), kThreads, 0, stream>>>(channels, momentum, unbias, batch_mean,
                                                                      batch_var, running_mean, running_var);
  return cudaGetLastError();
}

}  // namespace trainer::models::cuda
