#include "models/parameters.h"

#include <stdexcept>

namespace trainer::models {

int ParameterStore::declare(const std::string& name, const Shape& shape) {
  if (allocated_) throw std::logic_error("ParameterStore: declare('" + name + "') after allocate()");
  if (find(name) >= 0) throw std::logic_error("ParameterStore: duplicate tensor name '" + name + "'");
  views_.push_back({name, size_, shape});
  size_ += models::numel(shape);
  return static_cast<int>(views_.size()) - 1;
}

void ParameterStore::allocate(DeviceMemory& memory) {
  if (allocated_) return;
  values_ = DeviceBuffer(memory, size_);
  memory.fill(size_, 0.f, values_.data());
  if (has_grads_) {
    grads_ = DeviceBuffer(memory, size_);
    memory.fill(size_, 0.f, grads_.data());
  }
  initial_values_.assign(static_cast<size_t>(size_), 0.f);
  allocated_ = true;
}

Tensor ParameterStore::initial_value(int id) {
  if (initial_values_.size() != static_cast<size_t>(size_) || size_ == 0)
    throw std::logic_error("ParameterStore: initial_value() outside allocate() .. upload_initial_values()");
  return {initial_values_.data() + views_.at(id).offset, views_[id].shape};
}

void ParameterStore::upload_initial_values() {
  if (!allocated_) throw std::logic_error("ParameterStore: upload_initial_values() before allocate()");
  copy_to_device(memory(), initial_values_.data(), static_cast<int64_t>(initial_values_.size()), values_.data());
  std::vector<float>().swap(initial_values_);
}

std::vector<float> ParameterStore::host_values() const {
  std::vector<float> host(static_cast<size_t>(size_));
  if (allocated_) copy_to_host(memory(), values_.data(), size_, host.data());
  return host;
}

void ParameterStore::copy_values_from_host(const void* host, size_t bytes) {
  if (bytes > sizeof(float) * static_cast<size_t>(size_))
    throw std::logic_error("ParameterStore: copy_values_from_host() of more bytes than the store holds");
  if (bytes == 0) return;
  memory().copy_to_device(values_.data(), host, bytes);
  memory().synchronize();
}

DeviceMemory& ParameterStore::memory() const {
  if (!values_.memory()) throw std::logic_error("ParameterStore: memory() before allocate()");
  return *values_.memory();
}

int ParameterStore::find(const std::string& name) const {
  for (size_t i = 0; i < views_.size(); ++i)
    if (views_[i].name == name) return static_cast<int>(i);
  return -1;
}

}  // namespace trainer::models
