// Softmax cross-entropy with label smoothing (backend.h), in double like the CPU backend's loop: one
// thread per sample (the image models have 10 or 100 classes), then one block sums the batch in a
// fixed order.
#include <cmath>

#include "models/cuda/kernels.h"
#include "models/cuda/launch.cuh"

namespace trainer::models::cuda {
namespace {

constexpr int kFinishThreads = 256;

__global__ void cross_entropy_rows_kernel(int64_t batch, int64_t classes, const float* logits,
                                          const int32_t* labels, float smoothing, float* dlogits, double* row_loss,
                                          int32_t* row_hit) {
  const double off = static_cast<double>(smoothing) / classes, on = 1.0 - smoothing + off;
  for (int64_t i = first_index(); i < batch; i += grid_stride()) {
    const float* z = logits + i * classes;
    const int32_t label = labels[i];
    if (label < 0 || label >= classes) {  // the loaders never produce one; poison the loss, read nothing
      row_loss[i] = NAN;
      row_hit[i] = 0;
      continue;
    }
    int64_t argmax = 0;  // the first largest, as std::max_element
    for (int64_t c = 1; c < classes; ++c)
      if (z[c] > z[argmax]) argmax = c;
    const double zmax = z[argmax];
    double sum = 0.0, sum_z = 0.0;
    for (int64_t c = 0; c < classes; ++c) {
      sum += exp(z[c] - zmax);
      sum_z += z[c];
    }
    const double log_sum = zmax + log(sum);
    // -sum_c target_c * log_softmax_c, with target = off everywhere plus (on - off) at the label.
    row_loss[i] = -(off * (sum_z - classes * log_sum) + (on - off) * (z[label] - log_sum));
    row_hit[i] = argmax == label;
    if (dlogits) {
      float* d = dlogits + i * classes;
      for (int64_t c = 0; c < classes; ++c) {
        const double p = exp(z[c] - log_sum);
        d[c] = static_cast<float>((p - off - (c == label ? on - off : 0.0)) / batch);
      }
    }
  }
}

__global__ void cross_entropy_finish_kernel(int64_t batch, const double* row_loss, const int32_t* row_hit,
                                            double* result) {
  __shared__ double loss[kFinishThreads], hits[kFinishThreads];
  double l = 0.0, h = 0.0;
  for (int64_t i = threadIdx.x; i < batch; i += kFinishThreads) {
    l += row_loss[i];
    h += row_hit[i];
  }
  loss[threadIdx.x] = l;
  hits[threadIdx.x] = h;
  __syncthreads();
  for (int half = kFinishThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      loss[threadIdx.x] += loss[threadIdx.x + half];
      hits[threadIdx.x] += hits[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    result[0] = loss[0];
    result[1] = hits[0];
  }
}

}  // namespace

cudaError_t launch_softmax_cross_entropy(int64_t batch, int64_t classes, const float* logits,
                                         const int32_t* labels, float smoothing, float* dlogits, double* row_loss,
                                         int32_t* row_hit, double* result, cudaStream_t stream) {
  if (batch > 0) {
    cross_entropy_rows_kernel<<<grid_for(batch), kThreads, 0, stream>>>(batch, classes, logits, labels, smoothing,
                                                                         dlogits, row_loss, row_hit);
    const cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) return status;
  }
  cross_entropy_finish_kernel<<<1, kFinishThreads, 0, stream>>>(batch, row_loss, row_hit, result);
  return cudaGetLastError();
}

}  // namespace trainer::models::cuda
