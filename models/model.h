// A model is a plain list of layers run forward in order and backward in reverse (llm.c style),
// ending in softmax cross-entropy. It owns the flat parameter/gradient buffers and the buffer of
// non-trainable state (batch-norm running statistics).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/layers/layer.h"

namespace trainer::models {

struct ModelOptions {
  std::string arch = "resnet20";
  int64_t num_classes = 10;
  float label_smoothing = 0.f;
  bool freeze_batchnorm = false;  // every BatchNorm trains with its running statistics (frozen BN)
};

class ImageClassifier {
 public:
  ImageClassifier(Backend& backend, std::string arch, float label_smoothing);

  // Building: layers declare their tensors through context(); finish() allocates the stores and
  // initializes every layer in order from one seeded generator.
  LayerContext context() { return {backend_, params_, buffers_}; }
  void add(std::unique_ptr<Layer> layer);
  void finish(uint64_t seed);

  // x: {N, C, H, W} channels-last; labels: N class ids. Returns the mean loss; in training mode
  // also keeps the loss gradient for backward(). *correct receives the number of right argmaxes.
  double forward(const Tensor& x, const int32_t* labels, Mode mode, int64_t* correct = nullptr);
  // Writes the gradient of the last training forward's loss into parameters().grads(). With a
  // gradient-ready callback set, calls it after each layer's backward with the offset from which
  // the flat gradient is final (layers declare their tensors in order and run backward in reverse,
  // so a layer's gradients are final when its backward returns): how sync.overlap starts buckets.
  void backward();
  void set_gradient_ready(std::function<void(int64_t)> ready) { gradient_ready_ = std::move(ready); }

  // FLOPs of the last forward (convolutions and GEMMs).
  double forward_flops() const;

  const std::string& arch() const { return arch_; }
  ParameterStore& parameters() { return params_; }
  ParameterStore& buffers() { return buffers_; }
  const Tensor& logits() const { return *logits_; }
  Backend& backend() { return backend_; }

 private:
  Backend& backend_;
  std::string arch_;
  float label_smoothing_;
  ParameterStore params_{true};
  ParameterStore buffers_{false};
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<int64_t> layer_first_view_;  // per layer: its first tensor's index in params_, or -1
  int64_t declared_ = 0;                   // tensors declared by the layers added so far
  std::function<void(int64_t)> gradient_ready_;
  const Tensor* logits_ = nullptr;
  OwnedTensor dlogits_{backend_};
};

// The image models by name: resnet20, resnet32, resnet56, resnet18, vgg16.
std::unique_ptr<ImageClassifier> make_image_model(const ModelOptions& options, Backend& backend, uint64_t seed);
const std::vector<std::string>& image_model_names();

}  // namespace trainer::models
