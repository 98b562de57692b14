// The mean over ranks of per-rank float arrays, for an elastic resume (trainer/checkpoint/reshard.h): every new
// rank computes it from the same saved arrays in the same order and gets the same bits, and the
// mean is the exact one rounded once. Each entry's sum runs in rank order as a float64 pair (sum
// and Neumaier's compensation), which holds the sum of float32 values exactly unless they span
// more than about 80 binades; then the pair is rounded to float64, divided by P (exact for P a
// power of two) and rounded to float32. So |mean - exact mean| <= half an ulp of float32 plus
// 2^-52 of the mean (the float64 steps; they decide the float32 result only when the exact mean
// falls within that of a float32 rounding boundary).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace trainer::comm {

class RankMean {
 public:
  explicit RankMean(int64_t n) : sum_(n, 0.0), compensation_(n, 0.0) {}
  int ranks() const { return ranks_; }
  // The next rank's values (ranks in order).
  void add(const float* values) {
    for (size_t i = 0; i < sum_.size(); ++i) {
      const double s = sum_[i], x = values[i], t = s + x;
      compensation_[i] += std::fabs(s) >= std::fabs(x) ? (s - t) + x : (x - t) + s;
      sum_[i] = t;
    }
    ++ranks_;
  }
  std::vector<float> mean() const {
    std::vector<float> out(sum_.size());
    for (size_t i = 0; i < sum_.size(); ++i)
      out[i] = static_cast<float>((sum_[i] + compensation_[i]) / static_cast<double>(ranks_));
    return out;
  }

 private:
  std::vector<double> sum_, compensation_;
  int ranks_ = 0;
};

}  // namespace trainer::comm
