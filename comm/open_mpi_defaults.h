// Settings the trainer gives Open MPI before MPI_Init, each one measured (BENCHMARKS.md, "Overlap
// with backward"). Each is an MCA parameter set through the environment only where the user has not
// set it: `OMPI_MCA_...` or `mpiexec --mca ...` still decides.
#pragma once

namespace trainer::comm {

// Call once per process, before MPI_Init.
void set_open_mpi_defaults();

}  // namespace trainer::comm
