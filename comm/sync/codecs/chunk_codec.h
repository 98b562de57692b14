// SparseLoCo's compressor (Sarfi et al. 2025, arXiv 2508.15706; sparseloco.h): chunk-wise top-k
// of a fragment of the flat parameters, the selected values quantized to a few bits with one scale
// per chunk, packed into a payload of a size known in advance.
//
// Chunks (the paper's, after DeMo): a tensor of two or more dimensions, viewed as shape[0] x the
// rest, is cut into tiles of up to 64 x 64 (4,096 entries; the last row and column of tiles take
// what is left, where the reference takes the largest divisor of each dimension up to 64 instead);
// any other tensor (biases, batch-norm weights) into runs of up to 4,096 entries. Chunks never
// cross a tensor, so they never cross a fragment (fragments.h) either.
//
// Per chunk of m entries, k = min(m, ceil(density x m)) entries of largest magnitude are kept (ties:
// the lower position in the chunk first), sent in increasing position, each as
//   its position in the chunk, 12 bits (m <= 4,096), and
//   its value as 32 bits (b = sync.<method>.value_bits = 32: the fp32 value itself, no scale), or
//   a code q of b = sync.<method>.value_bits bits (2, 4 or 8): with L = 2^b levels and the chunk's scale
//   s = max |x| / ((L - 1) / 2) over its kept entries, q = clamp(floor(x / s + L / 2), 0, L - 1),
//   and the value it stands for is (q - (L - 1) / 2) x s: L levels evenly spaced over
//   [-max |x|, max |x|] without a zero (kept entries are the chunk's largest; 2 bits: +-max and
//   +-max / 3). A chunk whose kept entries are all zero has s = 0 and decodes to zeros.
// The reference instead quantizes all chunks of a tensor together (mean shift, a range of 6
// standard deviations, each bin decoded as the mean of its values); one scale per chunk keeps a
// chunk's payload independent of the others' and its error bounded by s / 2 per entry.
//
// Payload layout (little-endian, every rank's the same size for one fragment, so the exchange is a
// plain allgather): the C chunk scales (fp32; none at 32 bits), then the K positions packed 12 bits
// each, then the K codes packed b bits each (K = sum of the chunks' k; each stream padded to whole bytes).
// Arithmetic is float32 throughout, in this order, so every rank decodes the same bits and
// scripts/make_sparseloco_fixtures.py reproduces them.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/sync/methods/outer/fragments.h"
#include "models/parameters.h"

namespace trainer::comm {

inline constexpr int64_t kChunkTile = 64;         // a 2-D tile's side
inline constexpr int64_t kChunkRun = 4096;        // a 1-D chunk's length (= 64 x 64)
inline constexpr int kChunkPositionBits = 12;     // log2(4096)

// One chunk: `rows` rows of `cols` entries, row r starting at begin + r x stride of the flat buffer
// (a run: one row).
struct Chunk {
  int64_t begin = 0;
  int64_t rows = 1, cols = 0, stride = 0;
  int64_t k = 0;  // entries kept
  int64_t size() const { return rows * cols; }
  int64_t at(int64_t j) const { return begin + (j / cols) * stride + j % cols; }  // the j-th entry
};

// The chunks of the tensors of `fragment` (views null or empty: the buffer [begin, end) as one 1-D
// tensor), in tensor order, tiles row-major within a tensor; vectors in runs of `run` (at most
// kChunkRun; DeMo's are 64, demo.h).
std::vector<Chunk> plan_chunks(const Fragment& fragment, const std::vector<models::ParamView>* views, double density,
                               int64_t run = kChunkRun);

class ChunkCodec {
 public:
  // `bits`: 2, 4, 8 or 32 (std::invalid_argument naming sync.<method>.value_bits otherwise).
  ChunkCodec(std::vector<Chunk> chunks, int bits);
  const std::vector<Chunk>& chunks() const { return chunks_; }
  int bits() const { return bits_; }
  int64_t kept() const { return kept_; }                // K, entries sent
  int64_t payload_bytes() const { return payload_bytes_; }

  // Selects, quantizes and packs x's chunks into `payload` (payload_bytes()). x[0] is entry `origin`
  // of the flat buffer the chunks index (0: x is that buffer; a fragment's begin: x holds the
  // fragment alone).
  void encode(const float* x, uint8_t* payload, int64_t origin = 0) const;
  // out[entry] += sign x the value a payload stands for, entry by entry in payload order (the
  // chunks in order, each in increasing position). Every rank adds the same floats in the same
  // order. out[0] stands for entry `origin`, as in encode().
  void decode_add(const uint8_t* payload, float sign, float* out, int64_t origin = 0) const;

 private:
  std::vector<Chunk> chunks_;
  int bits_;
  int64_t kept_ = 0;
  int64_t payload_bytes_ = 0;
  int64_t positions_at_ = 0, codes_at_ = 0;  // byte offsets of the two packed streams
};

}  // namespace trainer::comm
