// Exact checkpoint and resume (docs/architecture.md section 3): everything a run needs to continue bit for bit
// as if it had never stopped, written so that a crash at any moment leaves the previous checkpoint
// usable.
//
// <output_dir>/checkpoints/step_<N>/
//   model.safetensors  rank 0's weights and buffers (BN running statistics) as F32 tensors under the
//                      PyTorch state_dict names; metadata: format "pt", arch, step. Loads with
//                      safetensors.torch.load_file, or with NumPy alone: scripts/read_checkpoint.py
//                      (which also checks the file against the manifest).
//   rank<R>.state      one per rank, also safetensors: that rank's full flat parameter and buffer
//                      arrays (ranks differ between local-SGD averaging steps, and BN statistics are
//                      per rank), the optimizer and sync-method state (opaque bytes), the step and
//                      the loader position and the global batch, and what it belongs to (world
//                      size, rank, model layout).
//   manifest.json      written last, by rank 0, once every rank's state file is durable: step, world
//                      size (and async_ps's number of servers), config hash, model layout (tensor
//                      names and shapes), and each file's size and CRC-32 (zlib's), plus a CRC-32
//                      of the manifest itself. A folder without a valid manifest is not a
//                      checkpoint.
//
// Every file is written to a temporary name, fsync'd, renamed and its folder fsync'd. A checkpoint
// of P processes loads on P' != P too (an elastic resume; for async_ps also on another number of
// servers, which the manifest records as "servers"): every rank then reads all P state files and
// trainer/checkpoint/reshard.h merges them. Both functions are collective: every rank of `comm` calls them
// with the same arguments, and an error on any rank makes every rank throw the same one-line
// std::runtime_error naming the file (no rank is left waiting in a collective).
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "models/parameters.h"

namespace trainer {

// What the training loop owns and must get back.
struct TrainingState {
  int64_t step = 0;                          // optimizer steps done
  int64_t epoch = 0, batch_in_epoch = 0;     // loader position of the NEXT batch
  std::string optimizer_state, sync_state;   // opaque bytes (Optimizer::save, GradientSync::save)
  int64_t global_batch = 0;  // data.global_batch: 0 = data.batch_size x processes; else the global
                             // batch an elastic resume kept (absent from older checkpoints: 0)
  // The divergence guard's reference loss and the step its window ended at (trainer/step/divergence_guard.h),
  // so that a resumed run is judged against the level at the switch; end -1: none yet (or absent).
  double divergence_reference = 0;
  int64_t divergence_reference_end = -1;
  // Its start (the loss of the run's first step); NaN when unknown (a checkpoint written before it was kept).
  double divergence_start = std::numeric_limits<double>::quiet_NaN();
};

// Who is saving or loading. The model's identity is its layout (tensor names and shapes, from the
// stores); a checkpoint of another layout is refused.
struct CheckpointIdentity {
  int world_size = 1;        // must be comm.size() (std::invalid_argument otherwise)
  int rank = 0;              // must be comm.rank()
  uint64_t config_hash = 0;  // config_hash(config): a mismatch is a warning (e.g. a new log cadence)
  std::string arch;          // for messages only
  int servers = 0;           // async_ps: the last `servers` ranks are parameter servers (0: none);
                             // a checkpoint of another number is re-sharded like one of another world size
};

// Writes checkpoints/step_<state.step>/ (replacing an unfinished or older folder of that step), then
// keeps only the newest `keep` complete checkpoints up to this step (keep < 1 keeps all; folders of
// later steps, e.g. from a run this one was resumed before, are never touched). A save that fails
// (full disk, I/O error) removes its unfinished folder, giving its space back, and leaves every
// older checkpoint as it was.
void save_checkpoint(const std::string& output_dir, const CheckpointIdentity& identity,
                     const models::ParameterStore& params, const models::ParameterStore& buffers,
                     const TrainingState& state, comm::Communicator& comm, int keep);

// One saved rank's part of a checkpoint, as written.
struct SavedRank {
  TrainingState state;
  std::vector<float> params, buffers;  // its flat arrays
};

struct LoadedCheckpoint {
  std::string path;     // the folder loaded
  std::string warning;  // empty, or one line for rank 0 to print (fallback, config change)
  TrainingState state;  // this rank's; from another world size, saved rank 0's
  int saved_world = 0;  // the number of processes that wrote it
  int saved_servers = -1;  // of those, async_ps's servers (0: none; -1: not recorded, an older checkpoint)
  // Only from another world size (or number of servers): every saved rank's part, in rank order.
  // The stores are then left as they were, for trainer/checkpoint/reshard.h to merge these into them.
  std::vector<SavedRank> saved;
};

// What `--resume which` will load, read before the run is built (a run of another world size
// shares the checkpoint's global batch, which the data loader needs first). Not collective: the
// named folder, or for "latest" the newest one with a valid manifest (load_checkpoint also checks
// the files, and may fall back further); nullopt when there is none.
struct CheckpointSummary {
  std::string path;
  int64_t step = 0;
  int world_size = 0;
  int64_t global_batch = 0;  // TrainingState::global_batch
  int servers = -1;          // LoadedCheckpoint::saved_servers
};
std::optional<CheckpointSummary> peek_checkpoint(const std::string& output_dir, const std::string& which);

// which: "latest" or a checkpoint folder. "latest" takes the newest checkpoint under
// <output_dir>/checkpoints that is complete and valid on every rank; a damaged newer one (no or a
// corrupt manifest, a missing, truncated or modified file) is skipped and named in the warning.
// Errors: nothing to load; a damaged explicit folder; another model (names, shapes) -- this stops
// "latest" too, since every older checkpoint shares it. On success params and buffers hold the saved
// values bit for bit (same world size; another world size fills `saved` instead); on error they are
// unchanged.
LoadedCheckpoint load_checkpoint(const std::string& output_dir, const std::string& which,
                                 const CheckpointIdentity& identity, models::ParameterStore& params,
                                 models::ParameterStore& buffers, comm::Communicator& comm);

}  // namespace trainer
