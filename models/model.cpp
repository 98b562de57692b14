#include "models/model.h"

#include <stdexcept>

namespace trainer::models {

ImageClassifier::ImageClassifier(Backend& backend, std::string arch, float label_smoothing)
    : backend_(backend), arch_(std::move(arch)), label_smoothing_(label_smoothing) {}

void ImageClassifier::finish(uint64_t seed) {
  params_.allocate(backend_);
  buffers_.allocate(backend_);
  Rng rng(seed);
  for (auto& layer : layers_) layer->init(rng);
  params_.upload_initial_values();
  buffers_.upload_initial_values();
}

double ImageClassifier::forward(const Tensor& x, const int32_t* labels, Mode mode, int64_t* correct) {
  const Tensor* h = &x;
  for (auto& layer : layers_) h = &layer->forward(*h, mode);
  logits_ = h;
  if (h->rank() != 2) throw std::logic_error(arch_ + ": the last layer must produce {N, classes} logits");
  const int64_t n = h->dim(0), classes = h->dim(1);
  float* dlogits = nullptr;
  if (mode == Mode::kTrain) dlogits = dlogits_.resize(h->shape).data;
  return backend_.softmax_cross_entropy(n, classes, h->data, labels, label_smoothing_, dlogits, correct);
}

double ImageClassifier::forward_flops() const {
  double flops = 0;
  for (const auto& layer : layers_) flops += layer->forward_flops();
  return flops;
}

void ImageClassifier::backward() {
  const Tensor* g = &dlogits_.view();
  for (auto it = layers_.rbegin(); it != layers_.rend(); ++it) g = &(*it)->backward(*g);
}

}  // namespace trainer::models
