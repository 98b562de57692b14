// The error every rank of a job throws alike, and the run's exit statuses.
#pragma once

#include <stdexcept>
#include <string>

namespace trainer::app {

// An error every rank throws at the same point with the same message (all ranks found it in the
// same collective), so no rank waits in a collective and none needs MPI_Abort: rank 0 prints it and
// every rank exits with `exit_status`.
struct AgreedError : std::runtime_error {
  int exit_status;
  AgreedError(const std::string& what, int status) : std::runtime_error(what), exit_status(status) {}
};
// The exit status of a run ended by a NaN or an infinity in the loss or gradient.
constexpr int kExitNonFinite = 3;
// The exit status of a run the divergence guard stopped (trainer/step/divergence_guard.h): its loss rose
// well above its level at the switch from dense training, or turned non-finite after it.
constexpr int kExitDiverged = 4;

}  // namespace trainer::app
