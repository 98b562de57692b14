#include "models/parameters.h"

#include <cstring>
#include <stdexcept>

namespace trainer::models {

int ParameterStore::declare(const std::string& name, const Shape& shape) {
  if (allocated_) throw std::logic_error("ParameterStore: declare('" + name + "') after allocate()");
  if (find(name) >= 0) throw std::logic_error("ParameterStore: duplicate tensor name '" + name + "'");
  views_.push_back({name, size_, shape});
  size_ += models::numel(shape);
  return static_cast<int>(views_.size()) - 1;
}

void ParameterStore::allocate() {
  if (allocated_) return;
  values_.resize(size_);
  std::memset(values_.data(), 0, sizeof(float) * size_);
  if (has_grads_) {
    grads_.resize(size_);
    std::memset(grads_.data(), 0, sizeof(float) * size_);
  }
  allocated_ = true;
}

int ParameterStore::find(const std::string& name) const {
  for (size_t i = 0; i < views_.size(); ++i)
    if (views_[i].name == name) return static_cast<int>(i);
  return -1;
}

}  // namespace trainer::models
