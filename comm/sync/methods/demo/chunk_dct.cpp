#include "comm/sync/methods/demo/chunk_dct.h"

#include <cmath>

namespace trainer::comm {

const std::vector<double>& ChunkDct::matrix(int64_t m) {
  auto it = matrices_.find(m);
  if (it != matrices_.end()) return it->second;
  std::vector<double> c(static_cast<size_t>(m * m));
  const double pi = std::acos(-1.0);
  for (int64_t u = 0; u < m; ++u)
    for (int64_t i = 0; i < m; ++i)
      c[static_cast<size_t>(u * m + i)] = std::sqrt((u == 0 ? 1.0 : 2.0) / static_cast<double>(m)) *
                                          std::cos(pi * static_cast<double>((2 * i + 1) * u) / static_cast<double>(2 * m));
  return matrices_.emplace(m, std::move(c)).first->second;
}

void ChunkDct::apply(const std::vector<Chunk>& chunks, float* x, bool inverse) {
  for (const Chunk& c : chunks) {
    const int64_t rows = c.rows, cols = c.cols;
    const std::vector<double>& cr = matrix(rows);
    const std::vector<double>& cc = matrix(cols);
    // Forward: Y = C_r T C_c^T; inverse: T = C_r^T Y C_c. M(a, b) picks C[a][b] or, inverse, C[b][a].
    auto at = [inverse](const std::vector<double>& m, int64_t n, int64_t a, int64_t b) {
      return inverse ? m[static_cast<size_t>(b * n + a)] : m[static_cast<size_t>(a * n + b)];
    };
    tile_.assign(static_cast<size_t>(rows * cols), 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < cols; ++j) tile_[static_cast<size_t>(r * cols + j)] = x[c.begin + r * c.stride + j];
    // Along the rows of the tile (each row times C_c^T), then along the columns (C_r times each column).
    half_.assign(tile_.size(), 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t v = 0; v < cols; ++v) {
        double s = 0;
        for (int64_t j = 0; j < cols; ++j) s += tile_[static_cast<size_t>(r * cols + j)] * at(cc, cols, v, j);
        half_[static_cast<size_t>(r * cols + v)] = s;
      }
    for (int64_t u = 0; u < rows; ++u)
      for (int64_t v = 0; v < cols; ++v) {
        double s = 0;
        for (int64_t r = 0; r < rows; ++r) s += at(cr, rows, u, r) * half_[static_cast<size_t>(r * cols + v)];
        x[c.begin + u * c.stride + v] = static_cast<float>(s);
      }
  }
}

}  // namespace trainer::comm
