// Elastic resume: a checkpoint of P processes continued on P' (docs/architecture.md section 4,
// "Elastic resume"). Every rank's state is in the checkpoint (trainer/checkpoint/checkpoint.h), so nothing is
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
// async_ps (P -> P' processes, or another sync.async_ps.servers: the servers are the last sync.async_ps.servers
// ranks of the new run, as in a fresh one; the manifest records the old count). A checkpoint is a
// meet, so the servers' state is one model's, cut in shards (comm/sync/methods/async_ps/async_ps_state.h):
//   servers           the S saved servers' shards of the parameters, BN statistics, optimizer state
//                     and gap-aware averages joined in parameter order and cut for the S' new ones
//                     as a fresh run at S' shards (bit for bit); version and the plan kept.
//   workers           every saved worker holds the joined parameters (checked); every new one starts
//                     from them, with the version it pulled. Their clocks (each worker's own step
//                     count, which differs at a meet) restart at the global step, and with them the
//                     data position: the global step's (epoch, batch) of the kept global batch, now
//                     shared by the W' workers. Exact where the clocks were equal (synchronous
//                     steps, the deterministic round robin); otherwise the slices the fast workers
//                     took beyond the global step are taken again, and those the slow ones had not
//                     reached yet are skipped, within that spread of steps.
//   per-worker state  nothing pending at a meet: no push in flight, no stale copy (DC-ASGD's and
//                     gap-aware damping's copies of what each worker was sent start from the
//                     checkpoint's parameters, as on every resume); staleness and the round robin
//                     restart.
//
// One line says what was done. A resume on the same P (and servers) with the configured global
// batch is the exact resume of checkpoint.h and does not come here.
#pragma once

#include <string>

#include "comm/communicator.h"
#include "comm/sync/methods/async_ps/async_ps_server.h"
#include "comm/sync/gradient_sync.h"
#include "models/parameters.h"
#include "optim/optimizer.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/config/config.h"

namespace trainer::app {

// Collective, before the run is built: the config to build it with when resuming from `which`
// ("" for a fresh run: the config as it is). When the checkpoint was written by another number of
// processes (or async_ps servers), or kept a global batch of its own, data.global_batch carries that
// batch (0 where the configured data.batch_size x training processes equals it). Throws
// std::runtime_error (the same line on every rank) for a global batch smaller than the number of
// training processes, one they do not divide under train.elastic_batch = "keep_global_even", and an
// async_ps checkpoint of another size that does not record its servers.
Config plan_resume(const Config& config, const std::string& which, comm::Communicator& comm);

// The samples per step over all training ranks, and this rank's share.
int64_t global_batch(const Config& config, int ranks);
int64_t batch_share(const Config& config, int ranks, int rank);

// What a training rank continues from after a re-sharding: the one line the resumed run prints,
// and the data position (epoch, batch) of the global order.
struct Resharded {
  std::string note;
  int64_t epoch = 0, batch_in_epoch = 0;
};

// Applies a checkpoint of another world size (ck.saved non-empty) to this rank: the stores, the
// optimizer and the sync method, as the header says. Throws std::runtime_error naming the
// checkpoint when its ranks disagree where they must not.
Resharded apply_resharded(const LoadedCheckpoint& ck, int world, models::ParameterStore& params,
                          models::ParameterStore& buffers, optim::Optimizer& optimizer, comm::GradientSync& sync,
                          int64_t global_batch);

// The same for async_ps's two roles (the header's async_ps part): a worker of `layout`, and a
// server, whose optimizer and state ParameterServer::load_resharded cuts from the saved servers'.
Resharded apply_ps_worker_resharded(const LoadedCheckpoint& ck, const comm::PsLayout& layout,
                                    models::ParameterStore& params, models::ParameterStore& buffers,
                                    optim::Optimizer& optimizer, comm::GradientSync& sync, int64_t global_batch);
void apply_ps_server_resharded(const LoadedCheckpoint& ck, comm::ParameterServer& server,
                               models::ParameterStore& params, models::ParameterStore& buffers);

}  // namespace trainer::app
