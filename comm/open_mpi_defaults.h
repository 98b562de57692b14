// Settings the trainer gives Open MPI before MPI_Init, each one measured (BENCHMARKS.md, "Overlap
// with backward"). Each is an MCA parameter set through the environment only where the user has not
// set it: `OMPI_MCA_...` or `mpiexec --mca ...` still decides.
#pragma once

namespace trainer::comm {

// Call once per process, before MPI_Init.
void set_open_mpi_defaults();

// Whether the user chose Open MPI's allreduce algorithms (an OMPI_MCA_coll_tuned_ variable for the
// allreduce was set before set_open_mpi_defaults): the trainer then leaves every allreduce to Open
// MPI, also at P = 2 where it otherwise exchanges large buffers itself (comm/pair_allreduce.h).
bool user_tunes_allreduce();

}  // namespace trainer::comm
