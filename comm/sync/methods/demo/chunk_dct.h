// DeMo's transform (Peng, Quesnelle and Kingma 2024, arXiv 2411.19870; demo.h): the orthonormal
// DCT-II of each chunk of chunk_codec.h, along both sides of a tile (X = C_r T C_c^T, C_m the m x m
// DCT-II matrix, C_m[u][i] = a_u cos(pi (2 i + 1) u / (2 m)), a_0 = sqrt(1 / m), a_u = sqrt(2 / m))
// and along a run; the inverse is the transpose. In place on the flat buffer the chunks index.
// Sums run in float64 in index order and are rounded once to float32, so a NumPy float64 matrix
// product rounded to float32 gives the same bits except where the exact value lies within float64
// error of a float32 rounding boundary (scripts/make_demo_fixtures.py).
#pragma once

#include <map>
#include <vector>

#include "comm/sync/codecs/chunk_codec.h"

namespace trainer::comm {

class ChunkDct {
 public:
  // Forward (DCT-II) or inverse (DCT-III, the transpose) of every chunk of x, in place.
  void forward(const std::vector<Chunk>& chunks, float* x) { apply(chunks, x, false); }
  void inverse(const std::vector<Chunk>& chunks, float* x) { apply(chunks, x, true); }

 private:
  void apply(const std::vector<Chunk>& chunks, float* x, bool inverse);
  const std::vector<double>& matrix(int64_t m);  // C_m, row-major, cached by size

  std::map<int64_t, std::vector<double>> matrices_;
  std::vector<double> tile_, half_;  // scratch
};

}  // namespace trainer::comm
