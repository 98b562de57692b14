#include "comm/sync/error_feedback.h"

#include <cstring>
#include <istream>
#include <ostream>
#include <stdexcept>
#include <string>

#include "comm/sync/sync_state.h"

namespace trainer::comm {

float* ErrorFeedback::residual() {
  if (!residual_) {
    residual_.reset(new float[n_]);
    std::memset(residual_.get(), 0, n_ * sizeof(float));
  }
  return residual_.get();
}

void ErrorFeedback::clear(const int32_t* index, int64_t count) {
  float* r = residual();
  for (int64_t j = 0; j < count; ++j) r[index[j]] = 0.f;
}

int64_t ErrorFeedback::clear_common(const int32_t* mine, int64_t mine_count, const int32_t* output,
                                    int64_t output_count) {
  float* r = residual();
  int64_t a = 0, b = 0, common = 0;
  while (a < mine_count && b < output_count) {
    if (mine[a] < output[b]) {
      ++a;
    } else if (output[b] < mine[a]) {
      ++b;
    } else {
      r[mine[a]] = 0.f;
      ++common, ++a, ++b;
    }
  }
  return common;
}

void ErrorFeedback::save(std::ostream& out) const {
  write_pod(out, n_);
  write_pod(out, static_cast<uint8_t>(residual_ != nullptr));
  if (residual_) out.write(reinterpret_cast<const char*>(residual_.get()), static_cast<std::streamsize>(n_ * sizeof(float)));
}

void ErrorFeedback::load(std::istream& in, const char* what) {
  const auto n = read_pod<int64_t>(in);
  const auto present = read_pod<uint8_t>(in);
  if (!in) throw std::runtime_error(std::string(what) + " state: truncated before the residual");
  if (n != n_)
    throw std::runtime_error(std::string(what) + " state holds a residual of " + std::to_string(n) +
                             " entries, this model has " + std::to_string(n_));
  if (!present) {
    residual_.reset();
    return;
  }
  std::unique_ptr<float[]> r(new float[n_]);
  in.read(reinterpret_cast<char*>(r.get()), static_cast<std::streamsize>(n_ * sizeof(float)));
  if (!in) throw std::runtime_error(std::string(what) + " state: residual truncated");
  residual_ = std::move(r);
}

}  // namespace trainer::comm
