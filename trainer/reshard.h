// Elastic resume: a checkpoint of P processes continued on P' (docs/architecture.md section 4,
// "Elastic resume"). Every rank's state is in the checkpoint (trainer/checkpoint.h), so nothing is
// reset: what every rank shares is taken as it is, and what is a rank's own is merged so that the
// run goes on as the P ranks would have.
//
//   global batch      kept: the checkpoint's global batch G is shared by the P' ranks, G / P' each;
//                     where P' does not divide G, ranks take floor or ceil shares (contiguous
//                     slices, data/loader.h) and each rank's gradient is weighted by
//                     share x P' / G, so the averaged gradient is still the mean over the G samples.
//                     The lr, the schedule and the step count are unchanged (a step is still G samples).
//   data position     kept: (epoch, batch) of the same global order; a global batch holds the same
//                     samples whatever P, so within the epoch none is repeated or skipped.
//   parameters        equal on every saved rank for a method that keeps them equal (checked: a
//                     difference is an error); otherwise (local SGD between averaging steps) the
//                     float64 mean of the P, i.e. the average the next averaging step would take.
//   BN statistics     the float64 mean of the P saved ranks' (each rank's running estimate).
//   optimizer state   equal on every saved rank for such a method (checked), else saved rank 0's
//                     (local SGD keeps momentum per rank).
//   sync state        GradientSync::load_resharded: residuals the mean of the P, Ok-Top-k's local
//                     thresholds the mean, region bounds recomputed, shared state kept.
//
// One line says what was done. A resume on the same P with the configured global batch is the
// exact resume of checkpoint.h and does not come here.
#pragma once

#include <string>

#include "comm/communicator.h"
#include "comm/sync/gradient_sync.h"
#include "models/parameters.h"
#include "optim/optimizer.h"
#include "trainer/checkpoint.h"
#include "trainer/config.h"

namespace trainer::app {

// Collective, before the run is built: the config to build it with when resuming from `which`
// ("" for a fresh run: the config as it is). When the checkpoint was written by another number of
// processes, or kept a global batch of its own, data.global_batch carries that batch (0 where the
// configured data.batch_size x processes equals it). Throws std::runtime_error (the same line on
// every rank) for a method that cannot resume on another number of processes yet (async_ps) and
// for a global batch smaller than the number of processes.
Config plan_resume(const Config& config, const std::string& which, comm::Communicator& comm);

// The samples per step over all training ranks, and this rank's share.
int64_t global_batch(const Config& config, int ranks);
int64_t batch_share(const Config& config, int ranks, int rank);

// Applies a checkpoint of another world size (ck.saved non-empty) to this rank: the stores, the
// optimizer and the sync method, as the header says. Returns the one line the resumed run prints.
// Throws std::runtime_error naming the checkpoint when its ranks disagree where they must not.
std::string apply_resharded(const LoadedCheckpoint& ck, int world, models::ParameterStore& params,
                            models::ParameterStore& buffers, optim::Optimizer& optimizer, comm::GradientSync& sync,
                            int64_t global_batch);

}  // namespace trainer::app
