#include "comm/pair_allreduce.h"

#include <algorithm>

namespace trainer::comm {

namespace {

PairExchangeSizes g_sizes;

}  // namespace

PairExchangeSizes pair_exchange_sizes() { return g_sizes; }

PairExchangeSizes set_pair_exchange_sizes(PairExchangeSizes sizes) {
  const PairExchangeSizes previous = g_sizes;
  g_sizes.min_bytes = std::max<int64_t>(1, sizes.min_bytes);
  g_sizes.piece_bytes = std::clamp<int64_t>(sizes.piece_bytes, 1, int64_t(1) << 30);
  return previous;
}

void pair_allreduce(MPI_Comm comm, int rank, void* buffer, int64_t count, MPI_Datatype type, int64_t type_bytes,
                    MPI_Op op, PairScratch& scratch) {
  const int64_t bytes = count * type_bytes;
  // Whole elements per piece, so each piece is also one MPI_Reduce_local of an int count.
  const int64_t piece = std::max<int64_t>(type_bytes, g_sizes.piece_bytes / type_bytes * type_bytes);
  const int64_t pieces = (bytes + piece - 1) / piece;
  if (static_cast<int64_t>(scratch.peer.size()) < bytes) scratch.peer.resize(static_cast<size_t>(bytes));
  std::vector<MPI_Request>& requests = scratch.requests;
  requests.resize(static_cast<size_t>(2 * pieces));
  unsigned char* theirs = scratch.peer.data();
  const int peer = 1 - rank;
  auto* mine = static_cast<unsigned char*>(buffer);
  auto piece_bytes = [&](int64_t k) { return static_cast<int>(std::min(piece, bytes - k * piece)); };
  // Every receive first, so no piece arrives unexpected where the peer is not late; then every send.
  // The tag is the piece's index (MPI keeps one pair's messages of one tag in order anyway).
  for (int64_t k = 0; k < pieces; ++k)
    MPI_Irecv(theirs + k * piece, piece_bytes(k), MPI_BYTE, peer, static_cast<int>(k % 32768), comm, &requests[k]);
  for (int64_t k = 0; k < pieces; ++k)
    MPI_Isend(mine + k * piece, piece_bytes(k), MPI_BYTE, peer, static_cast<int>(k % 32768), comm,
              &requests[pieces + k]);
  MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
  // mine := op(theirs, mine), with MPI's own operation: what recursive doubling computes at P = 2.
  for (int64_t k = 0; k < pieces; ++k)
    MPI_Reduce_local(theirs + k * piece, mine + k * piece, static_cast<int>(piece_bytes(k) / type_bytes), type, op);
}

}  // namespace trainer::comm
