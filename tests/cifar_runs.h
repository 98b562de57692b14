// Helpers of the end-to-end tests that run the trainer under mpiexec on a small synthetic CIFAR-10:
// the dataset (made once per test binary), the command line of a fast ResNet-20 experiment, and
// the comparison of every rank's checkpointed state tensor for tensor.
#pragma once

#include <catch2/catch.hpp>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "data/synthetic_cifar.h"
#include "models/safetensors.h"
#include "process.h"

namespace trainer::testing {

inline const std::filesystem::path& small_cifar_dataset() {
  static TempDir dir("data");
  static bool made = false;
  if (!made) {
    data::write_synthetic_cifar10(dir.path.string(), 640, 100, 3);
    made = true;
  }
  return dir.path;
}

// A small, fast experiment: ResNet-20 at batch 8 per rank on 640 images (40 steps per epoch at
// P = 2, about 0.1 s a step per rank). `extra` is appended; a later --set of the same key wins.
inline std::string small_cifar_command(int ranks, const std::filesystem::path& out, const std::string& extra) {
  return std::string(TRAINER_MPIEXEC) + " -n " + std::to_string(ranks) + " " + TRAINER_BINARY + " --config " +
         TRAINER_SOURCE_DIR + "/configs/quickstart_cifar.toml --set data.root=" + small_cifar_dataset().string() +
         " --set data.synthesize_if_missing=false --set data.batch_size=8 --set data.eval_batch_size=50" +
         " --set train.epochs=1 --set train.eval_every_steps=1000 --set train.log_every_steps=5" +
         " --set runtime.threads=1 --set data.loader_threads=1 --set experiment.output_dir=" + out.string() + " " +
         extra;
}

// small_cifar_command on `ranks` with `args`, as a RunCommand of tests/resume_runs.h.
inline auto small_cifar_on(int ranks, const std::string& args) {
  return [ranks, args](const std::filesystem::path& out, const std::string& extra) {
    return small_cifar_command(ranks, out, args + extra);
  };
}

// Every tensor of every rank's state in a checkpoint folder, by "rank<R>.state/<tensor>".
inline std::map<std::string, std::vector<uint8_t>> rank_states(const std::filesystem::path& checkpoint, int ranks) {
  std::map<std::string, std::vector<uint8_t>> all;
  for (int r = 0; r < ranks; ++r) {
    const std::string file = "rank" + std::to_string(r) + ".state";
    const auto st = models::read_safetensors((checkpoint / file).string());
    for (const auto& t : st.tensors) all[file + "/" + t.name] = t.bytes;
  }
  return all;
}

// The bytes of rank 0's sync-method state in a checkpoint folder (a fragment in flight makes it longer).
inline size_t sync_state_bytes(const std::filesystem::path& checkpoint) {
  return rank_states(checkpoint, 1).at("rank0.state/sync_state").size();
}

inline void require_identical_states(const std::filesystem::path& a, const std::filesystem::path& b, int ranks) {
  const auto x = rank_states(a, ranks), y = rank_states(b, ranks);
  REQUIRE(x.size() == y.size());
  for (const auto& [name, bytes] : x) {
    INFO(name);
    REQUIRE(y.count(name));
    // A bool, not the vectors: Catch would print megabytes of bytes on a mismatch.
    const bool identical = bytes == y.at(name);
    CHECK(identical);
  }
}

}  // namespace trainer::testing
