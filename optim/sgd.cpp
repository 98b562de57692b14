#include "optim/sgd.h"

#include <cstring>
#include <istream>
#include <ostream>
#include <stdexcept>
#include <string>

namespace trainer::optim {

namespace {

// "TSGD" followed by a format version: bump the version whenever the layout changes so an old
// checkpoint fails loudly instead of loading garbage.
constexpr char kMagic[4] = {'T', 'S', 'G', 'D'};
constexpr uint32_t kVersion = 1;
// The state is written in host byte order; every machine we run on is little-endian, and saying so
// here makes a port to a big-endian one fail at compile time rather than read swapped floats.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "state files are little-endian");

template <class T>
void write_pod(std::ostream& out, const T& v) {
  out.write(reinterpret_cast<const char*>(&v), sizeof(T));
}

template <class T>
bool read_pod(std::istream& in, T& v) {
  return static_cast<bool>(in.read(reinterpret_cast<char*>(&v), sizeof(T)));
}

}  // namespace

Sgd::Sgd(int64_t n, const SgdOptions& options) : n_(n), options_(options) {
  if (n < 0) throw std::invalid_argument("Sgd: negative parameter count");
  if (options.momentum < 0) throw std::invalid_argument("Sgd: momentum must be >= 0");
  if (options.nesterov && options.momentum <= 0)
    throw std::invalid_argument("Sgd: Nesterov momentum requires momentum > 0");
  if (options.momentum != 0) momentum_buffer_.assign(static_cast<size_t>(n), 0.0f);
}

void Sgd::step(float* params, const float* grads, double lr) {
  // Coefficients are rounded to float once, as PyTorch does when it multiplies a float tensor by a
  // Python scalar; this keeps trajectories within float rounding of torch.optim.SGD.
  const float neg_lr = static_cast<float>(-lr);
  const bool decoupled = options_.decoupled_weight_decay;
  const float wd = decoupled ? 0.0f : static_cast<float>(options_.weight_decay);
  const float decay = decoupled ? static_cast<float>(1.0 - lr * options_.weight_decay) : 1.0f;
  const float m = static_cast<float>(options_.momentum);
  const bool use_momentum = !momentum_buffer_.empty();
  const bool first = steps_ == 0;
  const bool nesterov = options_.nesterov;
  float* buf = momentum_buffer_.data();
  const int64_t n = n_;

  // Every element is independent, so a static split gives the same result for any thread count.
#pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) {
    float p = params[i];
    float g = grads[i] + wd * p;
    if (use_momentum) {
      const float b = first ? g : m * buf[i] + g;
      buf[i] = b;
      g = nesterov ? g + m * b : b;
    }
    params[i] = p * decay + neg_lr * g;
  }
  ++steps_;
}

void Sgd::save(std::ostream& out) const {
  out.write(kMagic, sizeof(kMagic));
  write_pod(out, kVersion);
  write_pod(out, n_);
  write_pod(out, steps_);
  const int64_t buffer_len = static_cast<int64_t>(momentum_buffer_.size());
  write_pod(out, buffer_len);
  out.write(reinterpret_cast<const char*>(momentum_buffer_.data()),
            static_cast<std::streamsize>(buffer_len * sizeof(float)));
  if (!out) throw std::runtime_error("SGD state: write failed");
}

void Sgd::load(std::istream& in) {
  char magic[4];
  uint32_t version = 0;
  int64_t n = 0, steps = 0, buffer_len = 0;
  const bool got_magic = static_cast<bool>(in.read(magic, sizeof(magic)));
  if (got_magic && std::memcmp(magic, "TADM", 4) == 0)  // optim/adam.cpp's magic
    throw std::runtime_error("SGD state: this is an Adam optimizer state, not an SGD one (bad magic; was "
                             "optim.name changed?)");
  if (!got_magic || std::memcmp(magic, kMagic, sizeof(kMagic)) != 0)
    throw std::runtime_error("SGD state: not an SGD optimizer state (bad magic)");
  if (!read_pod(in, version) || version != kVersion)
    throw std::runtime_error("SGD state: unsupported format version " + std::to_string(version) +
                             " (expected " + std::to_string(kVersion) + ")");
  if (!read_pod(in, n) || !read_pod(in, steps) || !read_pod(in, buffer_len))
    throw std::runtime_error("SGD state: truncated header");
  if (n != n_)
    throw std::runtime_error("SGD state: holds " + std::to_string(n) +
                             " parameters but the model has " + std::to_string(n_));
  const int64_t expected_len = static_cast<int64_t>(momentum_buffer_.size());
  if (buffer_len != expected_len)
    throw std::runtime_error("SGD state: momentum buffer of " + std::to_string(buffer_len) +
                             " elements, expected " + std::to_string(expected_len) +
                             " (was momentum changed?)");
  if (steps < 0) throw std::runtime_error("SGD state: negative step count");
  // Read into a temporary so a truncated file leaves the optimizer as it was.
  std::vector<float> buffer(static_cast<size_t>(buffer_len));
  if (!in.read(reinterpret_cast<char*>(buffer.data()),
               static_cast<std::streamsize>(buffer_len * sizeof(float))))
    throw std::runtime_error("SGD state: truncated momentum buffer");
  momentum_buffer_ = std::move(buffer);
  steps_ = steps;
}

}  // namespace trainer::optim
