#include "models/tensor.h"

#include <new>
#include <sstream>

namespace trainer::models {

std::string shape_string(const Shape& shape) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ']';
  return out.str();
}

const char* layout_name(Layout layout) {
  switch (layout) {
    case Layout::kBlocked8: return "nChw8c";
    case Layout::kBlocked16: return "nChw16c";
    default: return "nhwc";
  }
}

const char* dtype_name(DType dtype) { return dtype == DType::kBf16 ? "bf16" : "f32"; }

void HostBuffer::resize(int64_t n) {
  if (n > capacity_) {
    size_t bytes = ((static_cast<size_t>(n) * sizeof(float) + 63) / 64) * 64;
    float* p = static_cast<float*>(std::aligned_alloc(64, bytes ? bytes : 64));
    if (!p) throw std::bad_alloc();
    data_.reset(p);
    capacity_ = n;
  }
  size_ = n;
}

}  // namespace trainer::models
