// The checkpoint keeper: one rank's side of a run's checkpoints, the same for every role (the
// training ranks and async_ps's servers write theirs in the same collective calls). It starts a run
// (resume, or check that every rank holds the same initial weights), writes checkpoints with the
// run's failure policy, and remembers the newest complete one for messages. The files and their
// guarantees are trainer/checkpoint/checkpoint.h.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "comm/communicator.h"
#include "models/parameters.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/config/config.h"

namespace trainer::app {

class CheckpointKeeper {
 public:
  // params and buffers: the whole model on this rank; `comm`: every rank of the job.
  CheckpointKeeper(const Config& config, models::ParameterStore& params, models::ParameterStore& buffers,
                   comm::Communicator& comm);

  // Collective, once at the start. `resume` empty: checks that every rank starts from the same
  // weights and returns nothing. Else loads "latest" or the named folder into the stores and
  // returns it (its warning, if any, is for rank 0 to print).
  std::optional<LoadedCheckpoint> start(const std::string& resume);

  // Collective: writes the checkpoint of `state.step`. A failed periodic checkpoint (full disk, I/O
  // error, read-only folder: every rank fails alike) returns one warning line, and the previous
  // complete checkpoint stays the one "--resume latest" finds; with must_succeed (the final one, or
  // the one a stop signal asks for) it throws AgreedError. Returns "" when written.
  std::string save(const TrainingState& state, bool must_succeed);

  // "the last complete checkpoint is <folder>", or that there is none yet: for error messages.
  std::string last_note() const;
  const std::string& last() const { return last_; }

 private:
  std::string out_;
  CheckpointIdentity identity_;
  int keep_;
  models::ParameterStore& params_;
  models::ParameterStore& buffers_;
  comm::Communicator& comm_;
  std::string last_;  // the newest complete checkpoint folder, "" before the first
};

// Collective: every rank must start from the same weights (a mismatch would silently train P
// different models); throws std::runtime_error when their checksums differ.
void check_identical(const models::ParameterStore& params, comm::Communicator& comm);

}  // namespace trainer::app
