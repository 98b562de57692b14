// The step clock: how the ranks agree on where the run is. Two kinds, chosen once per rank:
//   lockstep  every rank takes every step together (every method but async_ps): the global step is
//             the rank's own count, and each step's verdict (stop, non-finite) is agreed on by the
//             control message below;
//   granted   async_ps's workers: each rank judges its own step (a non-finite gradient or a stop
//             signal ends the job on every rank: MPI_Abort), and the servers' replies say the global
//             step and the round (meet) a step completes (comm/sync/methods/async_ps/async_ps_server.h).
//
// The per-step control message: after the backward pass and before the gradient sync, every rank
// contributes two int32 (8 bytes) to one MAX allreduce, logged under ALLREDUCE_CONTROL:
//   [0] the stop signal this rank has received (SIGTERM/SIGINT, trainer/checkpoint/preemption.h), or 0;
//   [1] 0 when this rank's loss and local gradient are finite, else a key naming the first
//       non-finite item (the loss, or the lowest parameter tensor) and the rank.
// So every rank learns in the same step that the job must stop, or that the step must not be
// applied, before any rank has changed its sync state (error-feedback residuals, counters) or its
// weights. Its cost is one 8-byte allreduce per step (latency only, microseconds on one node)
// and one read of the local gradient to sum its squares.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/sync/gradient_sync.h"
#include "models/backend.h"
#include "models/parameters.h"

namespace trainer::app {

struct StepVerdict {
  int stop_signal = 0;     // the largest signal number any rank received, or 0
  bool nonfinite = false;  // some rank's loss or local gradient holds a NaN or an infinity
  int rank = -1;           // the lowest such rank (for the first item below)
  int tensor = -1;         // -1: the loss; else the first parameter tensor (index into views())
};

// The index of the first parameter tensor whose gradient holds a NaN or an infinity, or -1.
// One pass over the whole gradient (its sum of squares, in double: finite for any finite float);
// the per-tensor scan runs only when that sum is not finite. `backend`: the one the gradient is on.
int first_nonfinite_gradient(models::Backend& backend, const models::ParameterStore& params);

// The local gradient's check when it already went out during backward (sync.overlap): the first
// non-finite tensor as it was sent (GradientSync::finish_early_sends), or -1; kNotSentYet: the
// gradient is still here, and the verdict reads it.
constexpr int kNotSentYet = -2;

// Collective, once per step on every rank: the control allreduce described above.
StepVerdict agree_on_step(comm::Communicator& comm, int local_stop_signal, double loss, models::Backend& backend,
                          const models::ParameterStore& params, int sent_check = kNotSentYet);

// The same verdict from this rank's own loss and gradient alone, without a message: for ranks that
// do not take their steps together (async_ps workers).
StepVerdict check_step_here(int rank, int local_stop_signal, double loss, models::Backend& backend,
                            const models::ParameterStore& params);

// "the loss" or "the gradient of layer1.0.conv1.weight", for messages.
std::string nonfinite_item(int tensor, const models::ParameterStore& params);

// Where the run stands after one of this rank's steps.
struct StepPosition {
  int64_t global = 0;  // global steps done: the lr schedule's and the metrics' step
  int64_t round = -1;  // the round this step completes (evaluation, checkpoints and the end are
                       // counted in rounds), or -1 for none
};

class StepClock {
 public:
  virtual ~StepClock() = default;
  // After backward, before the step's sync: stop requests and non-finite values (granted: throws
  // std::runtime_error for either, which ends the job).
  virtual StepVerdict verdict(int64_t step, int local_stop_signal, double loss, int sent_check) = 0;
  // After this rank's `done`-th step, whose sync returned `stats`.
  virtual StepPosition position(int64_t done, const comm::SyncStats& stats) const = 0;
  // Training samples the job took in an interval in which this rank took `own_samples` and the
  // run advanced `global_steps`, for the samples/s rate.
  virtual double job_samples(int64_t own_samples, int64_t global_steps) const = 0;
};

// `comm`: every rank; the gradient lives in `params` on `backend`.
std::unique_ptr<StepClock> make_lockstep_clock(comm::Communicator& comm, models::Backend& backend,
                                               const models::ParameterStore& params);
// `trainers` workers of `batch_size` samples a step.
std::unique_ptr<StepClock> make_granted_clock(int rank, int trainers, int64_t batch_size, models::Backend& backend,
                                              const models::ParameterStore& params);

}  // namespace trainer::app
