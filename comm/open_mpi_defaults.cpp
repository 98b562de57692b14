#include "comm/open_mpi_defaults.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace trainer::comm {
namespace {

// Open MPI's tuned allreduce picks its algorithm from a decision tree fitted on other clusters. Over
// TCP (scripts/netem, Open MPI 4.1.4) it chose badly for gradient-sized messages: a 44.7 MB
// allreduce at P = 2 on 1 Gbit/s took 750 ms (ring; about half the link) where recursive doubling
// took 400; at P = 4 it took 1,150 ms where the ring took 620-640 (the link's bound for a ring is
// 536). At 25 MB: P = 2 430 -> 232 ms, P = 4 631 -> 364 ms; at 1 MB and P = 4 on 100 Mbit/s the
// ring took 176 ms against 236. Where the choices were within a few percent of each other (P = 2 at
// 1 MB and below) or the ring lost (P = 4, 64 kB on 1 Gbit/s: 29 against 19 ms: its 2 (P - 1)
// rounds of latency), Open MPI keeps its own decision. The rules file (Open MPI's format 1):
// collective 2 (allreduce); communicators of 2 ranks: recursive doubling (3) from 1 MiB; of 3 and
// more: the ring (4) from 512 KiB; algorithm 0 means "Open MPI's fixed decision". Both algorithms
// give every rank the same sum (the pairwise add is commutative in IEEE arithmetic; the ring's
// allgather copies one result), so results stay identical across ranks and across runs of one
// world size. The trainer's own allreduces of 1 MiB and more at P = 2 do not reach Open MPI
// (comm/pair_allreduce.h): the P = 2 rule serves bare MPI_Allreduce calls (`trainer bench comm`'s
// reference).
constexpr const char* kAllreduceRules =
    "1\n"
    "2\n"
    "2\n"
    "2\n2\n0 0 0 0\n1048576 3 0 0\n"
    "3\n2\n0 0 0 0\n524288 4 0 0\n";

bool g_user_tunes_allreduce = false;

// The rules must reach Open MPI as a file name. An anonymous in-memory file of this process
// (/proc/self/fd/N, read by this process's MPI_Init) leaves nothing on disk to clean up or race on.
void set_allreduce_rules() {
  g_user_tunes_allreduce = std::getenv("OMPI_MCA_coll_tuned_use_dynamic_rules") ||
                           std::getenv("OMPI_MCA_coll_tuned_dynamic_rules_filename") ||
                           std::getenv("OMPI_MCA_coll_tuned_allreduce_algorithm");
  if (g_user_tunes_allreduce) return;  // the user tunes Open MPI's collectives
  const int fd = memfd_create("trainer-allreduce-rules", 0);
  if (fd < 0) return;  // no rules: Open MPI's own decision (slower, still correct)
  const std::string rules = kAllreduceRules;
  if (write(fd, rules.data(), rules.size()) != static_cast<ssize_t>(rules.size())) {
    close(fd);
    return;
  }
  setenv("OMPI_MCA_coll_tuned_use_dynamic_rules", "1", 0);
  setenv("OMPI_MCA_coll_tuned_dynamic_rules_filename", ("/proc/self/fd/" + std::to_string(fd)).c_str(), 0);
}

}  // namespace

bool user_tunes_allreduce() { return g_user_tunes_allreduce; }

void set_open_mpi_defaults() {
  // Open MPI's blocking calls spin on its progress loop. The communication thread of an overlapped
  // step (comm/sync/methods/dense/bucket_reducer.h) waits in them while backward computes, and where no core is
  // spare (runtime.threads defaults to cores / ranks) its spinning took the compute threads' time:
  // ResNet-18 at P = 2 on 1 Gbit/s, backward 576 -> 864 ms. Yielding when a poll finds nothing gives
  // the core back: 640 ms, and the step 974 -> 736 ms. Waiting in MPI_Test with sleeps between
  // polls (MPI_Iallreduce) did not do better: the step was 1,063-1,090 ms against 980-996 here.
  setenv("OMPI_MCA_mpi_yield_when_idle", "1", /*overwrite=*/0);
  // Messages up to 1 MiB go eagerly over TCP (Open MPI's default: 64 KiB). Above the eager limit a
  // message waits for the receiver's answer to its first fragment (rendezvous), and in an overlapped
  // step that answer comes from a communication thread which shares its core with backward: each
  // round trip waits for the scheduler. ResNet-20 at P = 2 on 100 Mbit/s, overlapped: 180 -> 139 ms
  // per step with the default buckets, 164 -> 115 with 0.25 MB buckets (no overlap: 162). 1 MiB
  // covers the default first bucket (sync.first_bucket_mb = 1), so the first bucket of every model
  // leaves without a round trip. The cost is memory: a message that arrives before its receive is
  // posted is buffered whole (at most 1 MiB each).
  setenv("OMPI_MCA_btl_tcp_eager_limit", "1048576", /*overwrite=*/0);
  setenv("OMPI_MCA_btl_tcp_rndv_eager_limit", "1048576", /*overwrite=*/0);
  set_allreduce_rules();
  // Not set: OMPI_MCA_btl_tcp_links. Four TCP connections per pair of ranks reached an emulated
  // 1 Gbit/s link where one reached half of it (with Open MPI's default allreduce), but with four
  // links Open MPI 4.1.4 hung for good: LAS at P = 4 under scripts/netem, at the first Ok-Top-k step
  // after 250 dense ones, two ranks in an allgatherv round with each other (each having opened a
  // connection to the other at once, for a link not used before), both waiting, nothing on the
  // wire (Open MPI's multi-link connection bugs, e.g. its issues 4795 and 8498). A user may still
  // set it, at that risk.
}

}  // namespace trainer::comm
