// The allreduce of a communicator of exactly two ranks, as one exchange of eager-sized pieces that
// are all posted at once, then a local combine. Used by MpiCommunicator for large buffers at P = 2.
//
// Why not MPI_Allreduce: at P = 2 every algorithm of Open MPI is a send and a receive of large
// messages in both directions over one TCP connection, and a large message waits for its receiver's
// go-ahead (rendezvous). When one rank enters a few milliseconds before the other (a scheduler tick,
// the tail of the previous bucket), its go-ahead to the peer can queue behind its own data, and the
// two directions run one after the other instead of together. Measured under scripts/netem at
// 100 Mbit/s, a 1.33 MB allreduce followed at once by a 5.0 MB one (LAS's two buckets): the second
// took 838 ms in most repetitions where the link allows 429; packet captures showed one direction
// idle while the other streamed. It decided whether LAS's overlapped step at P = 2 took 972 or 590 ms.
// Pieces below Open MPI's eager limit (1 MiB, comm/open_mpi_defaults.cpp) need no go-ahead, so both
// directions stream from the first byte whatever the skew: 429 ms in every repetition. The same
// exchange was also faster on the idle links (44.7 MB: 1 Gbit/s 385 against 425 ms, 10 Gbit/s 80
// against 95, shared memory 49 against 70).
//
// The cost is memory: Open MPI keeps an eager fragment (1 MiB) per piece in flight for reuse, about
// 50 MB per rank for a 44.7 MB buffer in one call (peak RSS 161 against 109 MB).
//
// Results are MPI's at P = 2 bit for bit: each rank applies MPI's own operation (MPI_Reduce_local,
// the 16-bit formats' user operations included) to the peer's values and its own, as recursive
// doubling does. A sum is the same on both ranks (IEEE addition is commutative).
#pragma once

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <cstdint>
#include <vector>

#include "comm/communicator.h"

namespace trainer::comm {

// The sizes in use (set_pair_exchange_sizes in comm/communicator.h).
PairExchangeSizes pair_exchange_sizes();

// Kept by the caller between calls, so steady-state calls do not allocate.
struct PairScratch {
  std::vector<unsigned char> peer;  // the peer's values
  std::vector<MPI_Request> requests;
};

// buffer := op(the peer's buffer, this rank's), on both ranks; `type` is `type_bytes` wide. `comm`
// holds the two ranks and carries no other point-to-point traffic (a duplicate of the caller's).
void pair_allreduce(MPI_Comm comm, int rank, void* buffer, int64_t count, MPI_Datatype type, int64_t type_bytes,
                    MPI_Op op, PairScratch& scratch);

}  // namespace trainer::comm
