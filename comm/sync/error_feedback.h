// Error feedback (BytePS style, DESIGN.md section 4), kept apart from the compressors: a residual
// buffer of n floats holding, per entry, everything this rank has not yet contributed to an
// output. Each compressed step the method forms acc = grad + residual into the residual itself (in
// the same pass as its selection, select.h's accumulate_and_select), exchanges, and then clears
// the entries it contributed, which leaves residual = acc - contributed.
//
// The buffer is allocated (zero) on first use, so the dense warmup holds no residual and
// compression starts from zeros. Saved as a count and one raw write of n floats (110 MB for the
// paper's LSTM: one stream write, not one per entry).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>

namespace trainer::comm {

class ErrorFeedback {
 public:
  explicit ErrorFeedback(int64_t n) : n_(n) {}
  int64_t size() const { return n_; }
  // The residual (zero-filled on the first call).
  float* residual();
  bool allocated() const { return residual_ != nullptr; }
  // Clears the residual at the given indices: what this rank contributed in full.
  void clear(const int32_t* index, int64_t count);
  // Clears the indices present in both sorted lists (this rank's selection and the step's output)
  // and returns how many there were. Both lists strictly increasing.
  int64_t clear_common(const int32_t* mine, int64_t mine_count, const int32_t* output, int64_t output_count);

  void save(std::ostream& out) const;
  // Throws std::runtime_error (prefixed with `what`) when the saved size differs or data is short.
  void load(std::istream& in, const char* what);

 private:
  int64_t n_;
  std::unique_ptr<float[]> residual_;
};

}  // namespace trainer::comm
