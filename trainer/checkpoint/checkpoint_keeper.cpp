#include "trainer/checkpoint/checkpoint_keeper.h"

#include "comm/sync/registry.h"
#include "trainer/agreed_error.h"

namespace trainer::app {
namespace {

// FNV-1a over the parameter bytes: equal on all ranks iff they start from the same weights.
uint64_t checksum(const float* data, int64_t n) {
  uint64_t h = 1469598103934665603ull;
  const auto* bytes = reinterpret_cast<const unsigned char*>(data);
  for (int64_t i = 0; i < n * 4; ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  return h;
}

}  // namespace

void check_identical(const models::ParameterStore& params, comm::Communicator& comm) {
  if (comm.size() == 1) return;
  const std::vector<float> host = params.host_values();  // the weights may live on a GPU
  const auto h = static_cast<int64_t>(checksum(host.data(), params.size()) >> 1);
  int64_t lo = h, hi = h;
  comm.allreduce(&lo, 1, comm::DType::kI64, comm::ReduceOp::kMin, "ALLREDUCE_CHECK");
  comm.allreduce(&hi, 1, comm::DType::kI64, comm::ReduceOp::kMax, "ALLREDUCE_CHECK");
  if (lo != hi) throw std::runtime_error("ranks hold different initial weights (parameter checksums differ)");
}

CheckpointKeeper::CheckpointKeeper(const Config& config, models::ParameterStore& params,
                                   models::ParameterStore& buffers, comm::Communicator& comm)
    : out_(output_dir(config)),
      identity_{comm.size(), comm.rank(), config_hash(config), config.model.arch,
                static_cast<int>(comm::server_ranks(config.sync))},
      keep_(static_cast<int>(config.train.keep_checkpoints)),
      params_(params),
      buffers_(buffers),
      comm_(comm) {}

std::optional<LoadedCheckpoint> CheckpointKeeper::start(const std::string& resume) {
  if (resume.empty()) {
    check_identical(params_, comm_);
    return std::nullopt;
  }
  LoadedCheckpoint ck = load_checkpoint(out_, resume, identity_, params_, buffers_, comm_);
  last_ = ck.path;
  return ck;
}

std::string CheckpointKeeper::save(const TrainingState& state, bool must_succeed) {
  try {
    save_checkpoint(out_, identity_, params_, buffers_, state, comm_, keep_);
    last_ = out_ + "/checkpoints/step_" + std::to_string(state.step);
    return "";
  } catch (const std::runtime_error& err) {
    const std::string what =
        "checkpoint at step " + std::to_string(state.step) + " failed: " + err.what() + "; " + last_note();
    if (must_succeed) throw AgreedError(what, 1);
    return what;
  }
}

std::string CheckpointKeeper::last_note() const {
  return last_.empty() ? std::string("no checkpoint has been written yet") : "the last complete checkpoint is " + last_;
}

}  // namespace trainer::app
