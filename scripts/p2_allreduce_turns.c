// Reproduces, without the trainer, why comm/pair_allreduce.h exists: at P = 2, an allreduce that
// follows another at once can run its two directions one after the other on Open MPI over TCP.
//
//   mpicc -O2 -o /tmp/p2_turns scripts/p2_allreduce_turns.c
//   export OMPI_MCA_btl_tcp_eager_limit=1048576 OMPI_MCA_btl_tcp_rndv_eager_limit=1048576
//   sudo -E scripts/netem --ranks 2 --bandwidth 100mbit -- /tmp/p2_turns mpi
//   sudo -E scripts/netem --ranks 2 --bandwidth 100mbit -- /tmp/p2_turns exchange
//
// Each repetition allreduces LAS's two dense buckets back to back (1.33 MB, then 5.0 MB; optional
// arguments: the two sizes in floats and the piece size in bytes) and prints the slowest rank's
// time for each. On the emulated 100 Mbit/s link the second needs 429 ms with both directions busy.
// Measured (2026-11-24, Open MPI 4.1.4): "mpi" (MPI_Allreduce, Open MPI's choice of algorithm or
// recursive doubling) 829-838 ms in nearly every repetition; "exchange" (every receive and send
// posted at once in 512 KiB messages, then a local add) 429 ms in every one.
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// The trainer's exchange, reduced to floats and a sum.
static void exchange_allreduce(float* a, int n, int piece_floats, float* theirs, MPI_Request* requests) {
  int me = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  const int peer = 1 - me, pieces = (n + piece_floats - 1) / piece_floats;
  for (int k = 0; k < pieces; ++k) {
    const int c = (k + 1) * piece_floats > n ? n - k * piece_floats : piece_floats;
    MPI_Irecv(theirs + (size_t)k * piece_floats, c, MPI_FLOAT, peer, k, MPI_COMM_WORLD, &requests[k]);
  }
  for (int k = 0; k < pieces; ++k) {
    const int c = (k + 1) * piece_floats > n ? n - k * piece_floats : piece_floats;
    MPI_Isend(a + (size_t)k * piece_floats, c, MPI_FLOAT, peer, k, MPI_COMM_WORLD, &requests[pieces + k]);
  }
  MPI_Waitall(2 * pieces, requests, MPI_STATUSES_IGNORE);
  for (int i = 0; i < n; ++i) a[i] += theirs[i];
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int me = 0, p = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  const int use_exchange = argc > 1 && strcmp(argv[1], "exchange") == 0;
  const int n1 = argc > 2 ? atoi(argv[2]) : 333729, n2 = argc > 3 ? atoi(argv[3]) : 1254624;
  const int piece_floats = (argc > 4 ? atoi(argv[4]) : 512 * 1024) / (int)sizeof(float);
  if (p != 2 || (argc > 1 && !use_exchange && strcmp(argv[1], "mpi") != 0) || n1 < 1 || n2 < 1 || piece_floats < 1) {
    if (me == 0) fprintf(stderr, "usage (2 ranks): p2_turns mpi|exchange [floats1 floats2 piece_bytes]\n");
    MPI_Finalize();
    return 2;
  }
  const int n_max = n1 > n2 ? n1 : n2;
  float* a = malloc(sizeof(float) * (size_t)n2);
  float* b = malloc(sizeof(float) * (size_t)n1);
  float* theirs = malloc(sizeof(float) * (size_t)n_max);
  MPI_Request* requests = malloc(sizeof(MPI_Request) * (size_t)(2 * (n_max / piece_floats + 1)));
  for (int rep = 0; rep < 8; ++rep) {
    for (int i = 0; i < n2; ++i) a[i] = (float)(i % 7) + (float)me;
    for (int i = 0; i < n1; ++i) b[i] = 1.0f;
    MPI_Barrier(MPI_COMM_WORLD);
    double t[3];
    t[0] = now_s();
    if (use_exchange) exchange_allreduce(b, n1, piece_floats, theirs, requests);
    else MPI_Allreduce(MPI_IN_PLACE, b, n1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    t[1] = now_s();
    if (use_exchange) exchange_allreduce(a, n2, piece_floats, theirs, requests);
    else MPI_Allreduce(MPI_IN_PLACE, a, n2, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    t[2] = now_s();
    double took[2] = {t[1] - t[0], t[2] - t[1]}, slowest[2];
    MPI_Allreduce(took, slowest, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (me == 0) printf("%s: first %.0f ms, second %.0f ms\n", use_exchange ? "exchange" : "mpi", 1e3 * slowest[0], 1e3 * slowest[1]);
  }
  free(a);
  free(b);
  free(theirs);
  free(requests);
  MPI_Finalize();
  return 0;
}
