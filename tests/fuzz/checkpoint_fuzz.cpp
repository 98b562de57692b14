// Fuzz target: resuming from a checkpoint folder (load_checkpoint with an explicit folder): the
// manifest (JSON, its own CRC, file sizes and CRCs, version, world size, model layout), rank 0's
// state file (safetensors with metadata, the flat arrays, optimizer and sync blobs) and the weights.
//
// Input: <mode byte><manifest.json> %% <rank0.state> %% <model.safetensors> (fuzz_input.h). The
// checksums would stop almost every mutation at the CRC checks, so when the mode byte is odd the
// target rewrites them to match (the manifest's sizes and CRC-32s of the two files, then the
// manifest's own CRC) whenever the manifest parses as an object: the fuzzer then reaches every check
// behind them. An even mode byte leaves the input as it is. Errors must be one line naming the folder.
//
// The seed is a real checkpoint of this target's model, written by save_checkpoint: run the target
// with TRAINER_FUZZ_WRITE_SEED=<file> and it writes one there and exits.
#include <zlib.h>

#include <cstdio>
#include <cstring>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "tests/fuzz/fuzz_input.h"
#include "tests/one_rank.h"
#include "trainer/checkpoint/checkpoint.h"

using namespace trainer;
namespace fs = std::filesystem;
using json = nlohmann::ordered_json;  // the manifest's key order is part of its checksum

namespace {

// A small CNN's tensors under PyTorch names (checkpoint_test's model).
struct Model {
  models::ParameterStore params{true}, buffers{false};
  Model() {
    params.declare("conv1.weight", {4, 3, 3, 3});
    params.declare("bn1.weight", {4});
    params.declare("fc.weight", {10, 4});
    params.declare("fc.bias", {10});
    buffers.declare("bn1.running_mean", {4});
    params.allocate(models::host_memory());
    buffers.allocate(models::host_memory());
  }
};

CheckpointIdentity identity() {
  CheckpointIdentity id;
  id.config_hash = 0x1234;
  id.arch = "fuzz_cnn";
  return id;
}

std::string hex8(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

uint32_t crc32_of(const std::string& s) {
  return static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(s.data()), static_cast<uInt>(s.size())));
}

// The manifest with its file entries and own checksum recomputed (checkpoint.cpp's definitions:
// zlib CRC-32, 8 hex digits, the manifest's CRC over dump(1) of everything before it); unchanged
// when it is not a JSON object with a "files" object.
std::string fix_checksums(const std::string& manifest, const std::string& state, const std::string& model) {
  json m = json::parse(manifest, nullptr, /*allow_exceptions=*/false);
  if (!m.is_object() || !m.contains("files") || !m["files"].is_object()) return manifest;
  m["files"]["rank0.state"] = {{"bytes", state.size()}, {"crc32", hex8(crc32_of(state))}};
  m["files"]["model.safetensors"] = {{"bytes", model.size()}, {"crc32", hex8(crc32_of(model))}};
  m.erase("manifest_crc32");
  m["manifest_crc32"] = hex8(crc32_of(m.dump(1)));
  return m.dump(1) + "\n";
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_seed(const char* seed_path) {
  Model model;
  for (auto* s : {&model.params, &model.buffers})
    for (int64_t i = 0; i < s->size(); ++i) s->values()[i] = 0.01f * static_cast<float>(i % 97) - 0.3f;
  TrainingState state;
  state.step = 3;
  state.epoch = 1;
  state.batch_in_epoch = 2;
  state.optimizer_state = "momentum-bytes";
  state.sync_state = "residual";
  testing::OneRank comm(1);
  const fs::path out = fuzz::scratch_dir() / "seed_run";
  save_checkpoint(out.string(), identity(), model.params, model.buffers, state, comm, 1);
  const fs::path folder = out / "checkpoints" / "step_3";
  const std::string packed = "\x01" + read_file(folder / "manifest.json") + "\n%%\n" +
                             read_file(folder / "rank0.state") + "\n%%\n" + read_file(folder / "model.safetensors");
  std::ofstream(seed_path, std::ios::binary) << packed;
  std::printf("wrote %s (%zu bytes)\n", seed_path, packed.size());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* seed = std::getenv("TRAINER_FUZZ_WRITE_SEED")) {
    write_seed(seed);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool fix = data[0] & 1;
  std::vector<std::string> parts = fuzz::split_parts(data + 1, size - 1, 3);
  if (fix) parts[0] = fix_checksums(parts[0], parts[1], parts[2]);
  const fs::path folder = fuzz::scratch_dir() / "run" / "checkpoints" / "step_3";
  fuzz::write_file(folder / "manifest.json", parts[0]);
  fuzz::write_file(folder / "rank0.state", parts[1]);
  fuzz::write_file(folder / "model.safetensors", parts[2]);

  static Model model;
  testing::OneRank comm(1);
  try {
    load_checkpoint((fuzz::scratch_dir() / "run").string(), folder.string(), identity(), model.params,
                    model.buffers, comm);
  } catch (const std::runtime_error& e) {
    fuzz::check_error_message(e.what(), folder.string());
  }
  return 0;
}
