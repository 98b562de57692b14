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

void ImageClassifier::add(std::unique_ptr<Layer> layer) {
  // The layer declared its tensors in its constructor: those after the previous layer's.
  const int64_t declared = static_cast<int64_t>(params_.views().size());
  layer_first_view_.push_back(declared > declared_ ? declared_ : -1);
  declared_ = declared;
  layers_.push_back(std::move(layer));
}

void ImageClassifier::backward() {
  const Tensor* g = &dlogits_.view();
  for (size_t i = layers_.size(); i-- > 0;) {
    g = &layers_[i]->backward(*g);
    if (gradient_ready_ && layer_first_view_[i] >= 0) gradient_ready_(params_.views()[layer_first_view_[i]].offset);
  }
}

}  // namespace trainer::models
