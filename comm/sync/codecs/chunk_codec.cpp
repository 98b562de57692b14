#include "comm/sync/codecs/chunk_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

namespace trainer::comm {
namespace {

// Packs fixed-width unsigned fields, least significant bit first, into bytes.
class BitWriter {
 public:
  explicit BitWriter(uint8_t* out) : out_(out) {}
  void put(uint32_t value, int bits) {
    buffer_ |= static_cast<uint64_t>(value) << filled_;
    filled_ += bits;
    while (filled_ >= 8) {
      *out_++ = static_cast<uint8_t>(buffer_);
      buffer_ >>= 8;
      filled_ -= 8;
    }
  }
  void flush() {
    if (filled_ > 0) *out_++ = static_cast<uint8_t>(buffer_);
    buffer_ = 0;
    filled_ = 0;
  }

 private:
  uint8_t* out_;
  uint64_t buffer_ = 0;
  int filled_ = 0;
};

class BitReader {
 public:
  explicit BitReader(const uint8_t* in) : in_(in) {}
  uint32_t get(int bits) {
    while (filled_ < bits) {
      buffer_ |= static_cast<uint64_t>(*in_++) << filled_;
      filled_ += 8;
    }
    const auto value = static_cast<uint32_t>(buffer_ & ((uint64_t{1} << bits) - 1));  // bits <= 32
    buffer_ >>= bits;
    filled_ -= bits;
    return value;
  }

 private:
  const uint8_t* in_;
  uint64_t buffer_ = 0;
  int filled_ = 0;
};

int64_t packed_bytes(int64_t fields, int bits) { return (fields * bits + 7) / 8; }

// (L - 1) / 2 for L = 2^bits levels: the codes' midpoint, exact in float32.
float code_midpoint(int bits) { return static_cast<float>((int64_t{1} << bits) - 1) / 2.f; }

// The chunks of one tensor of `numel` entries at `offset` with the given shape.
void add_tensor_chunks(int64_t offset, const models::Shape& shape, int64_t numel, double density, int64_t run,
                       std::vector<Chunk>& out) {
  auto kept = [density](int64_t m) {
    return std::min(m, std::max<int64_t>(1, static_cast<int64_t>(std::ceil(density * static_cast<double>(m)))));
  };
  const int64_t rows = shape.size() >= 2 ? shape[0] : 1;
  const int64_t cols = rows > 0 ? numel / rows : 0;
  if (rows <= 1 || cols <= 1) {  // a vector (or a matrix of one row or column): runs
    for (int64_t at = 0; at < numel; at += run) {
      Chunk c;
      c.begin = offset + at;
      c.cols = std::min(run, numel - at);
      c.stride = c.cols;
      c.k = kept(c.size());
      out.push_back(c);
    }
    return;
  }
  for (int64_t r = 0; r < rows; r += kChunkTile)
    for (int64_t col = 0; col < cols; col += kChunkTile) {
      Chunk c;
      c.begin = offset + r * cols + col;
      c.rows = std::min(kChunkTile, rows - r);
      c.cols = std::min(kChunkTile, cols - col);
      c.stride = cols;
      c.k = kept(c.size());
      out.push_back(c);
    }
}

}  // namespace

std::vector<Chunk> plan_chunks(const Fragment& fragment, const std::vector<models::ParamView>* views, double density,
                               int64_t run) {
  if (run < 1 || run > kChunkRun) throw std::logic_error("chunk codec: runs of " + std::to_string(run));
  std::vector<Chunk> chunks;
  if (!views || views->empty()) {
    add_tensor_chunks(fragment.begin, {fragment.size()}, fragment.size(), density, run, chunks);
    return chunks;
  }
  for (int64_t t = fragment.first_tensor; t < fragment.first_tensor + fragment.tensors; ++t) {
    const models::ParamView& v = (*views)[static_cast<size_t>(t)];
    add_tensor_chunks(v.offset, v.shape, v.numel(), density, run, chunks);
  }
  return chunks;
}

ChunkCodec::ChunkCodec(std::vector<Chunk> chunks, int bits) : chunks_(std::move(chunks)), bits_(bits) {
  if (bits != 2 && bits != 4 && bits != 8 && bits != 32)
    throw std::invalid_argument("value_bits = " + std::to_string(bits) + " must be 2, 4, 8 or 32");
  for (const Chunk& c : chunks_) {
    if (c.size() > kChunkRun || c.k < 1 || c.k > c.size())
      throw std::logic_error("chunk codec: a chunk of " + std::to_string(c.size()) + " entries keeping " +
                             std::to_string(c.k));
    kept_ += c.k;
  }
  positions_at_ = bits_ == 32 ? 0 : static_cast<int64_t>(chunks_.size()) * 4;
  codes_at_ = positions_at_ + packed_bytes(kept_, kChunkPositionBits);
  payload_bytes_ = codes_at_ + packed_bytes(kept_, bits_);
}

void ChunkCodec::encode(const float* x, uint8_t* payload, int64_t origin) const {
  const float half = code_midpoint(bits_);
  const float levels_half = static_cast<float>(int64_t{1} << bits_) / 2.f;  // L / 2: floor(y + L/2) rounds y + (L-1)/2
  const int64_t top = (int64_t{1} << bits_) - 1;
  BitWriter positions(payload + positions_at_), codes(payload + codes_at_);
  std::vector<int32_t> order;
  for (size_t ci = 0; ci < chunks_.size(); ++ci) {
    const Chunk& c = chunks_[ci];
    // A magnitude that sorts NaN first, so that the order is strict (a NaN is sent and caught by
    // the non-finite guard rather than breaking the sort).
    auto magnitude = [&](int32_t j) {
      const float v = x[c.at(j) - origin];
      return std::isnan(v) ? std::numeric_limits<float>::infinity() : std::fabs(v);
    };
    order.resize(static_cast<size_t>(c.size()));
    std::iota(order.begin(), order.end(), 0);
    auto larger = [&](int32_t a, int32_t b) {
      const float ma = magnitude(a), mb = magnitude(b);
      return ma > mb || (ma == mb && a < b);
    };
    std::nth_element(order.begin(), order.begin() + (c.k - 1), order.end(), larger);
    std::sort(order.begin(), order.begin() + c.k);
    if (bits_ == 32) {  // the values themselves
      for (int64_t i = 0; i < c.k; ++i) {
        positions.put(static_cast<uint32_t>(order[i]), kChunkPositionBits);
        uint32_t raw;
        std::memcpy(&raw, &x[c.at(order[i]) - origin], 4);
        codes.put(raw, 32);
      }
      continue;
    }
    float largest = 0;
    for (int64_t i = 0; i < c.k; ++i) largest = std::max(largest, std::fabs(x[c.at(order[i]) - origin]));
    const float scale = largest / half;
    std::memcpy(payload + ci * 4, &scale, 4);
    for (int64_t i = 0; i < c.k; ++i) {
      positions.put(static_cast<uint32_t>(order[i]), kChunkPositionBits);
      int64_t q = 0;
      if (scale > 0) {
        const float y = std::floor(x[c.at(order[i]) - origin] / scale + levels_half);
        q = std::isnan(y) ? 0 : static_cast<int64_t>(std::clamp(y, 0.f, static_cast<float>(top)));
      }
      codes.put(static_cast<uint32_t>(q), bits_);
    }
  }
  positions.flush();
  codes.flush();
}

void ChunkCodec::decode_add(const uint8_t* payload, float sign, float* out, int64_t origin) const {
  const float half = code_midpoint(bits_);
  BitReader positions(payload + positions_at_), codes(payload + codes_at_);
  for (size_t ci = 0; ci < chunks_.size(); ++ci) {
    const Chunk& c = chunks_[ci];
    float scale = 0;
    if (bits_ != 32) std::memcpy(&scale, payload + ci * 4, 4);
    for (int64_t i = 0; i < c.k; ++i) {
      const auto j = static_cast<int64_t>(positions.get(kChunkPositionBits));
      const uint32_t code = codes.get(bits_);
      if (j >= c.size()) throw std::runtime_error("chunk codec: a payload names position " + std::to_string(j) +
                                                  " in a chunk of " + std::to_string(c.size()));
      float value;
      if (bits_ == 32) std::memcpy(&value, &code, 4);
      else value = (static_cast<float>(code) - half) * scale;
      out[c.at(j) - origin] += sign * value;
    }
  }
}

}  // namespace trainer::comm
