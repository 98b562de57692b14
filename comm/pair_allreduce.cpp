#include "comm/pair_allreduce.h"

#include <algorithm>

#include "comm/wire_format.h"

namespace trainer::comm {

namespace {

PairExchangeSizes g_sizes;

// out[i] = op(low[i], high[i]) with low the lower rank's value, so both ranks compute the same.
template <typename T>
void combine_typed(ReduceOp op, const T* low, const T* high, T* out, int64_t n) {
  switch (op) {
    case ReduceOp::kSum:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(low[i] + high[i]);
      break;
    case ReduceOp::kMax:
      for (int64_t i = 0; i < n; ++i) out[i] = high[i] > low[i] ? high[i] : low[i];
      break;
    case ReduceOp::kMin:
      for (int64_t i = 0; i < n; ++i) out[i] = high[i] < low[i] ? high[i] : low[i];
      break;
  }
}

// The 16-bit formats compare and add widened to fp32 (the sum rounds once: wire_add).
void combine_sixteen_bit(WireDType wire, ReduceOp op, const uint16_t* low, const uint16_t* high, uint16_t* out,
                         int64_t n) {
  if (op == ReduceOp::kSum) {  // out is low or high (the caller's buffer); the add is commutative
    wire_add(wire, out == low ? high : low, out, n);
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    float a = 0, b = 0;
    widen(wire, low + i, 1, &a);
    widen(wire, high + i, 1, &b);
    out[i] = (op == ReduceOp::kMax ? b > a : b < a) ? high[i] : low[i];
  }
}

// `out` is `low` or `high`.
void combine(DType type, ReduceOp op, const void* low, const void* high, void* out, int64_t n) {
  switch (type) {
    case DType::kF32:
      return combine_typed(op, static_cast<const float*>(low), static_cast<const float*>(high), static_cast<float*>(out), n);
    case DType::kF64:
      return combine_typed(op, static_cast<const double*>(low), static_cast<const double*>(high), static_cast<double*>(out),
                           n);
    case DType::kI32:
      return combine_typed(op, static_cast<const int32_t*>(low), static_cast<const int32_t*>(high),
                           static_cast<int32_t*>(out), n);
    case DType::kI64:
      return combine_typed(op, static_cast<const int64_t*>(low), static_cast<const int64_t*>(high),
                           static_cast<int64_t*>(out), n);
    case DType::kU8:
      return combine_typed(op, static_cast<const uint8_t*>(low), static_cast<const uint8_t*>(high),
                           static_cast<uint8_t*>(out), n);
    case DType::kBF16:
    case DType::kF16:
      return combine_sixteen_bit(type == DType::kBF16 ? WireDType::kBF16 : WireDType::kF16, op,
                                 static_cast<const uint16_t*>(low), static_cast<const uint16_t*>(high),
                                 static_cast<uint16_t*>(out), n);
  }
}

}  // namespace

PairExchangeSizes pair_exchange_sizes() { return g_sizes; }

PairExchangeSizes set_pair_exchange_sizes(PairExchangeSizes sizes) {
  const PairExchangeSizes previous = g_sizes;
  g_sizes.min_bytes = std::max<int64_t>(1, sizes.min_bytes);
  g_sizes.piece_bytes = std::clamp<int64_t>(sizes.piece_bytes, 1, int64_t(1) << 30);
  return previous;
}

void pair_allreduce(MPI_Comm comm, int rank, void* buffer, int64_t count, DType type, ReduceOp op,
                    PairScratch& scratch) {
  const int64_t es = dtype_size(type), bytes = count * es;
  // Whole elements per piece, so the combine could start on a piece as it lands (it does not yet:
  // at 100 Mbit/s to 10 Gbit/s the add is a small share of the transfer).
  const int64_t piece = std::max<int64_t>(es, g_sizes.piece_bytes / es * es);
  const int64_t pieces = (bytes + piece - 1) / piece;
  if (static_cast<int64_t>(scratch.peer.size()) < bytes) scratch.peer.resize(static_cast<size_t>(bytes));
  std::vector<MPI_Request>& requests = scratch.requests;
  requests.resize(static_cast<size_t>(2 * pieces));
  unsigned char* theirs = scratch.peer.data();
  const int peer = 1 - rank;
  auto* mine = static_cast<unsigned char*>(buffer);
  // Every receive first, so no piece arrives unexpected where the peer is not late; then every send.
  // The tag is the piece's index (MPI keeps one pair's messages of one tag in order anyway).
  for (int64_t k = 0; k < pieces; ++k) {
    const int n = static_cast<int>(std::min(piece, bytes - k * piece));
    MPI_Irecv(theirs + k * piece, n, MPI_BYTE, peer, static_cast<int>(k % 32768), comm, &requests[k]);
  }
  for (int64_t k = 0; k < pieces; ++k) {
    const int n = static_cast<int>(std::min(piece, bytes - k * piece));
    MPI_Isend(mine + k * piece, n, MPI_BYTE, peer, static_cast<int>(k % 32768), comm, &requests[pieces + k]);
  }
  MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
  const void* low = rank == 0 ? mine : theirs;
  const void* high = rank == 0 ? theirs : mine;
  combine(type, op, low, high, buffer, count);
}

}  // namespace trainer::comm
