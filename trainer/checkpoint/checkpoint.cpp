#include "trainer/checkpoint/checkpoint.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/safetensors.h"
#include "trainer/checkpoint/durable_file.h"

namespace trainer {
namespace {


namespace fs = std::filesystem;
// ordered_json keeps keys in the order written, so the manifest reads top-down and its own checksum
// can be recomputed from the parsed object.
using json = nlohmann::ordered_json;

// An integer of the manifest. nlohmann converts a float to an integer with a cast, which is
// undefined beyond the integer's range (a damaged manifest's 1e48): only integers pass.
template <class Int>
Int manifest_integer(const json& m, const char* key) {
  const json& v = m.at(key);
  if (!v.is_number_integer()) throw json::type_error::create(302, std::string(key) + " must be an integer", &v);
  return v.get<Int>();
}

constexpr int64_t kVersion = 1;
constexpr const char* kManifest = "manifest.json";
constexpr const char* kModelFile = "model.safetensors";

std::string step_folder_name(int64_t step) { return "step_" + std::to_string(step); }
std::string state_file_name(int rank) { return "rank" + std::to_string(rank) + ".state"; }

std::string hex(uint64_t v, int digits) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%0*llx", digits, static_cast<unsigned long long>(v));
  return buf;
}

std::string one_line(std::string s) {
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  return s;
}

// Step numbers of the step_<N> folders under root, newest first. Names that are not exactly
// "step_" + a canonical number (step_040, step_4.bak) are not checkpoints of this trainer.
std::vector<int64_t> list_steps(const fs::path& root) {
  std::vector<int64_t> steps;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return steps;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step_", 0) != 0 || name.size() > 5 + 18) continue;
    const std::string digits = name.substr(5);
    if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit)) continue;
    const int64_t step = std::stoll(digits);
    if (step_folder_name(step) == name && entry.is_directory(ec)) steps.push_back(step);
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

// ---- the model layout: names and shapes, the identity of a model ----

// One "name [d0, d1, ...]" string per tensor, in buffer order (which fixes the offsets): readable in
// the manifest, one line each, and compared as a whole.
json layout_json(const models::ParameterStore& store) {
  json tensors = json::array();
  for (const auto& v : store.views()) {
    std::string dims;
    for (int64_t d : v.shape) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
    tensors.push_back(v.name + " [" + dims + "]");
  }
  return json{{"count", store.size()}, {"tensors", std::move(tensors)}};
}

uint32_t layout_crc(const models::ParameterStore& params, const models::ParameterStore& buffers) {
  return crc32_of(layout_json(params).dump() + layout_json(buffers).dump());
}

// The first difference between a saved layout and this model's, or "" when they are the same.
std::string layout_difference(const json& saved, const models::ParameterStore& store, const char* kind) {
  const json mine = layout_json(store);
  if (saved == mine) return "";
  const json& a = saved.at("tensors");
  const json& b = mine.at("tensors");
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    if (a[i] != b[i])
      return std::string(kind) + " tensor " + std::to_string(i) + " is " + a[i].get<std::string>() +
             " in the checkpoint but " + b[i].get<std::string>() + " in this model";
  return "the checkpoint has " + std::to_string(a.size()) + " " + kind + " tensors (" +
         saved.at("count").dump() + " values), this model " + std::to_string(b.size()) + " (" +
         std::to_string(store.size()) + ")";
}

// ---- agreement between ranks ----

// What a problem with a checkpoint means for "latest": a damaged one is skipped in favour of the
// previous one; a refused one (another world size or model) stops the run, because every older
// checkpoint in the folder has the same problem.
enum Verdict : int64_t { kOk = 0, kDamaged = 1, kRefused = 2 };

struct CheckpointError : std::runtime_error {
  Verdict verdict;
  CheckpointError(Verdict v, const std::string& what) : std::runtime_error(one_line(what)), verdict(v) {}
};
[[noreturn]] void damaged(const std::string& what) { throw CheckpointError(kDamaged, what); }
[[noreturn]] void refused(const std::string& what) { throw CheckpointError(kRefused, what); }

struct Outcome {
  int64_t verdict = kOk;
  std::string message;  // the lowest failing rank's, identical on every rank
};

// Collective: the worst verdict of all ranks, with the message of the lowest rank that has it, so
// that every rank decides alike and throws (or warns) with the same line.
Outcome agree(comm::Communicator& comm, int64_t verdict, const std::string& message) {
  const int64_t world = comm.size();
  int64_t key = verdict * world + (world - 1 - comm.rank());
  comm.allreduce(&key, 1, comm::DType::kI64, comm::ReduceOp::kMax, "CHECKPOINT_AGREE");
  Outcome out;
  out.verdict = key / world;
  if (out.verdict == kOk) return out;
  const int root = static_cast<int>(world - 1 - key % world);
  out.message = comm.rank() == root ? message : std::string();
  int64_t length = static_cast<int64_t>(out.message.size());
  comm.broadcast(&length, 1, comm::DType::kI64, root, "CHECKPOINT_AGREE");
  out.message.resize(static_cast<size_t>(length));
  if (length > 0) comm.broadcast(out.message.data(), length, comm::DType::kU8, root, "CHECKPOINT_AGREE");
  return out;
}

// Runs `work` on the ranks where `here` is true and makes every rank throw if it failed anywhere.
template <class Work>
void together(comm::Communicator& comm, bool here, Work&& work) {
  std::string error;
  if (here) {
    try {
      work();
    } catch (const std::exception& e) {
      error = one_line(e.what());
      if (error.empty()) error = "checkpoint: unknown error";
    }
  }
  const Outcome o = agree(comm, error.empty() ? kOk : kDamaged, error);
  if (o.verdict != kOk) throw std::runtime_error(o.message);
}

// The identity repeats what the communicator knows (the loop builds it once for both calls);
// disagreement is a bug in the caller, and would size the collectives below wrongly.
void check_identity(const CheckpointIdentity& id, const comm::Communicator& comm) {
  if (id.world_size != comm.size() || id.rank != comm.rank())
    throw std::invalid_argument("checkpoint: identity says rank " + std::to_string(id.rank) + " of " +
                                std::to_string(id.world_size) + ", the communicator rank " +
                                std::to_string(comm.rank()) + " of " + std::to_string(comm.size()));
}

// ---- writing ----

// safetensors (models/safetensors.h) has no U8 dtype, so opaque bytes are stored as I32 elements,
// zero-padded to a multiple of 4; the exact length is in the metadata.
std::string padded_blob(const std::string& blob) {
  std::string p = blob;
  p.resize((blob.size() + 3) / 4 * 4, '\0');
  return p;
}

// The stores' values copied to the host (they live on the backend's device) for writing.
struct HostValues {
  std::vector<float> params, buffers;
};

models::SafeTensorRef flat_ref(const char* name, const std::vector<float>& values) {
  return {name, "F32", {static_cast<int64_t>(values.size())}, values.data()};
}

void write_rank_state(const fs::path& path, const CheckpointIdentity& id, const models::ParameterStore& params,
                      const models::ParameterStore& buffers, const HostValues& host, const TrainingState& state,
                      int rank, int world) {
  const std::string opt = padded_blob(state.optimizer_state);
  const std::string sync = padded_blob(state.sync_state);
  const std::vector<models::SafeTensorRef> tensors = {
      flat_ref("params", host.params),
      flat_ref("buffers", host.buffers),
      {"optimizer_state", "I32", {static_cast<int64_t>(opt.size() / 4)}, opt.data()},
      {"sync_state", "I32", {static_cast<int64_t>(sync.size() / 4)}, sync.data()},
  };
  std::map<std::string, std::string> meta = {
      {"format", "trainer-rank-state"},
      {"version", std::to_string(kVersion)},
      {"step", std::to_string(state.step)},
      {"epoch", std::to_string(state.epoch)},
      {"batch_in_epoch", std::to_string(state.batch_in_epoch)},
      {"global_batch", std::to_string(state.global_batch)},
      {"world_size", std::to_string(world)},
      {"rank", std::to_string(rank)},
      {"config_hash", hex(id.config_hash, 16)},
      {"arch", id.arch},
      {"layout_crc32", hex(layout_crc(params, buffers), 8)},
      {"optimizer_state_bytes", std::to_string(state.optimizer_state.size())},
      {"sync_state_bytes", std::to_string(state.sync_state.size())},
  };
  if (state.divergence_reference_end >= 0) {
    char ref[32];
    std::snprintf(ref, sizeof ref, "%.17g", state.divergence_reference);  // the exact double back
    meta["divergence_reference"] = ref;
    meta["divergence_reference_end"] = std::to_string(state.divergence_reference_end);
  }
  if (std::isfinite(state.divergence_start)) {
    char start[32];
    std::snprintf(start, sizeof start, "%.17g", state.divergence_start);
    meta["divergence_start"] = start;
  }
  models::write_safetensors(path.string(), tensors, meta);
}

// Every named view, so that torch's load_state_dict (strict=False: no num_batches_tracked) or any
// safetensors tool sees an ordinary state_dict.
void write_model(const fs::path& path, const CheckpointIdentity& id, const models::ParameterStore& params,
                 const models::ParameterStore& buffers, const HostValues& host, int64_t step) {
  std::vector<models::SafeTensorRef> tensors;
  for (const auto& v : params.views()) tensors.push_back({v.name, "F32", v.shape, host.params.data() + v.offset});
  for (const auto& v : buffers.views()) tensors.push_back({v.name, "F32", v.shape, host.buffers.data() + v.offset});
  models::write_safetensors(path.string(), tensors,
                            {{"format", "pt"}, {"arch", id.arch}, {"step", std::to_string(step)},
                             {"trainer_checkpoint_version", std::to_string(kVersion)}});
}

json file_entry(const FileSum& sum) { return json{{"bytes", sum.bytes}, {"crc32", hex(sum.crc, 8)}}; }

void write_manifest(const fs::path& folder, const CheckpointIdentity& id, const models::ParameterStore& params,
                    const models::ParameterStore& buffers, const TrainingState& state, int world,
                    const FileSum& model, const std::vector<int64_t>& rank_sums) {
  json files = json::object();
  files[kModelFile] = file_entry(model);
  for (int r = 0; r < world; ++r)
    files[state_file_name(r)] =
        file_entry({static_cast<uint64_t>(rank_sums[2 * r]), static_cast<uint32_t>(rank_sums[2 * r + 1])});
  json m = {{"format", "trainer-checkpoint"},
            {"version", kVersion},
            {"step", state.step},
            {"world_size", world},
            {"global_batch", state.global_batch},
            {"config_hash", hex(id.config_hash, 16)},
            {"arch", id.arch},
            {"params", layout_json(params)},
            {"buffers", layout_json(buffers)},
            {"files", std::move(files)}};
  if (id.servers > 0) m["servers"] = id.servers;  // absent: no servers (or written before the key)
  m["manifest_crc32"] = hex(crc32_of(m.dump(1)), 8);
  write_text_atomic(folder / kManifest, m.dump(1) + "\n");
}

// Keeps the newest `keep` complete checkpoints up to `current`; older folders, complete or not,
// go. A folder loses its manifest first, so a deletion cut short leaves an incomplete folder,
// never a "complete" one with files missing.
void prune(const fs::path& root, int64_t current, int keep) {
  if (keep < 1) return;
  int kept = 1;  // the one just written
  for (int64_t step : list_steps(root)) {
    if (step >= current) continue;
    const fs::path folder = root / step_folder_name(step);
    if (fs::exists(folder / kManifest) && kept < keep) {
      ++kept;
      continue;
    }
    fs::remove(folder / kManifest);
    fs::remove_all(folder);
  }
}

}  // namespace

void save_checkpoint(const std::string& output_dir, const CheckpointIdentity& identity,
                     const models::ParameterStore& params, const models::ParameterStore& buffers,
                     const TrainingState& state, comm::Communicator& comm, int keep) {
  check_identity(identity, comm);
  const int rank = identity.rank, world = identity.world_size;
  const fs::path root = fs::path(output_dir) / "checkpoints";
  const fs::path folder = root / step_folder_name(state.step);

  // A manifest must describe one step; ranks out of step would be a bug in the loop, caught here.
  int64_t steps[2] = {state.step, -state.step};
  comm.allreduce(steps, 2, comm::DType::kI64, comm::ReduceOp::kMin, "CHECKPOINT_STEP");
  if (steps[0] != -steps[1])
    throw std::runtime_error("checkpoint: ranks are saving different steps (" + std::to_string(steps[0]) +
                             " to " + std::to_string(-steps[1]) + ")");

  // Rank 0 makes the folder and removes the manifest of an earlier save of this step (a resumed
  // run passing it again), so from here until the new manifest the folder is incomplete, never a
  // "complete" mix of old and new files.
  together(comm, rank == 0, [&] {
    fs::create_directories(folder);
    fs::remove(folder / kManifest);
    fsync_folder(folder);
    fsync_folder(root);
    fsync_folder(root.parent_path());
  });

  // Every rank its own state; rank 0 also the weights. Sizes and checksums are read back from the
  // file system, so the manifest vouches for what is on disk, not for what was meant to be.
  int64_t mine[2] = {0, 0};
  FileSum model;
  const HostValues host{params.host_values(), buffers.host_values()};
  try {
    together(comm, true, [&] {
      const fs::path path = folder / state_file_name(rank);
      write_rank_state(path, identity, params, buffers, host, state, rank, world);
      const FileSum sum = checksum_file(path.string());
      mine[0] = static_cast<int64_t>(sum.bytes);
      mine[1] = sum.crc;
      if (rank == 0) {
        write_model(folder / kModelFile, identity, params, buffers, host, state.step);
        model = checksum_file((folder / kModelFile).string());
      }
    });
    std::vector<int64_t> sums(2 * static_cast<size_t>(world));
    comm.allgather(mine, 2, sums.data(), comm::DType::kI64, "CHECKPOINT_FILES");

    // Every state file is renamed and fsync'd (the agreement above is the barrier): the manifest
    // makes the checkpoint exist, and only then may older ones go.
    together(comm, rank == 0, [&] {
      write_manifest(folder, identity, params, buffers, state, world, model, sums);
      prune(root, state.step, keep);
    });
  } catch (const std::runtime_error&) {
    // Every rank is past its writes (together() agreed): give the space of the unfinished folder
    // back, so that a full disk does not stay full and older checkpoints are not crowded out.
    if (rank == 0) {
      std::error_code ignored;
      if (!fs::exists(folder / kManifest, ignored)) fs::remove_all(folder, ignored);
    }
    comm.barrier("CHECKPOINT_CLEANUP");  // every rank threw above: none returns before it is gone
    throw;
  }
}

// ---- reading ----

namespace {

// One rank's view of a checkpoint, read and checked but not yet applied: the stores change only
// once every rank has found its part valid. From another world size it holds every saved rank's file.
struct Staged {
  std::string folder;
  std::string config_warning;
  int saved_world = 0, saved_servers = -1;
  std::vector<models::SafeTensorsFile> files;  // this rank's; or every saved rank's, in rank order
  std::vector<TrainingState> states;           // the same ranks' states
};

json read_manifest(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in) damaged("checkpoint manifest " + path.string() + ": cannot read it");
  const std::string what = "checkpoint manifest " + path.string() + " is corrupt: ";
  json m;
  try {
    m = json::parse(text);
    if (!m.is_object() || !m.contains("manifest_crc32")) damaged(what + "not a manifest object");
    const std::string stored = m.at("manifest_crc32").get<std::string>();
    m.erase("manifest_crc32");
    if (stored != hex(crc32_of(m.dump(1)), 8)) damaged(what + "its checksum does not match its content");
    if (m.at("format") != "trainer-checkpoint") damaged(what + "format is not trainer-checkpoint");
  } catch (const json::exception& e) {
    damaged(what + e.what());
  }
  return m;
}

// Size, then CRC, against the manifest: a truncated file is reported as truncated.
void check_file(const fs::path& folder, const json& files, const std::string& name) {
  const std::string path = (folder / name).string();
  if (!files.contains(name)) damaged("checkpoint " + folder.string() + ": the manifest lists no " + name);
  const uint64_t bytes = files.at(name).at("bytes").get<uint64_t>();
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) damaged("checkpoint file " + path + " is missing");
  const uint64_t size = fs::file_size(path, ec);
  if (ec || size != bytes)
    damaged("checkpoint file " + path + " is truncated or damaged: " + std::to_string(size) +
            " bytes, the manifest says " + std::to_string(bytes));
  FileSum sum;
  try {
    sum = checksum_file(path);
  } catch (const std::exception& e) {
    damaged(std::string("checkpoint file ") + e.what());
  }
  const std::string want = files.at(name).at("crc32").get<std::string>();
  if (hex(sum.crc, 8) != want)
    damaged("checkpoint file " + path + " is damaged: CRC-32 " + hex(sum.crc, 8) + ", the manifest says " + want);
}

std::string meta(const models::SafeTensorsFile& f, const std::string& key) {
  const auto it = f.metadata.find(key);
  if (it == f.metadata.end()) damaged("checkpoint file " + f.path + " has no '" + key + "' metadata");
  return it->second;
}

int64_t meta_int(const models::SafeTensorsFile& f, const std::string& key) {
  const std::string s = meta(f, key);
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno == ERANGE)
    damaged("checkpoint file " + f.path + ": metadata '" + key + "' is not an integer: " + s);
  return v;
}

const models::SafeTensor& tensor(const models::SafeTensorsFile& f, const std::string& name,
                                 const std::string& dtype, int64_t numel) {
  if (!f.contains(name)) damaged("checkpoint file " + f.path + " has no tensor '" + name + "'");
  const models::SafeTensor& t = f.at(name);
  if (t.dtype != dtype || t.shape.size() != 1 || t.shape[0] != numel)
    damaged("checkpoint file " + f.path + ": tensor '" + name + "' is " + t.dtype + " of " +
            std::to_string(t.numel()) + " elements, expected " + dtype + " of " + std::to_string(numel));
  return t;
}

std::string blob(const models::SafeTensorsFile& f, const std::string& name) {
  const int64_t length = meta_int(f, name + "_bytes");
  if (length < 0) damaged("checkpoint file " + f.path + ": negative length of " + name);
  const int64_t words = length / 4 + (length % 4 != 0);  // (length + 3) / 4 overflows near INT64_MAX
  const models::SafeTensor& t = tensor(f, name, "I32", words);
  return std::string(t.bytes.begin(), t.bytes.begin() + length);
}

// One rank state file of a checkpoint (its CRC already checked against the manifest), checked
// against the manifest's step and world and this model's layout.
TrainingState read_rank_file(const fs::path& folder, int rank, int world, int64_t step, const models::ParameterStore& params,
                             const models::ParameterStore& buffers, models::SafeTensorsFile& f) {
  // The CRC matched, so a problem from here on means a file written by another program or version.
  try {
    f = models::read_safetensors((folder / state_file_name(rank)).string());
  } catch (const std::exception& e) {
    damaged(e.what());
  }
  const std::string inconsistent = "checkpoint file " + f.path + " does not belong to its manifest: ";
  if (meta(f, "format") != "trainer-rank-state" || meta_int(f, "version") != kVersion)
    damaged(inconsistent + "not a version " + std::to_string(kVersion) + " rank state");
  if (meta_int(f, "rank") != rank || meta_int(f, "world_size") != world || meta_int(f, "step") != step)
    damaged(inconsistent + "rank " + meta(f, "rank") + " of " + meta(f, "world_size") + " at step " + meta(f, "step"));
  if (meta(f, "layout_crc32") != hex(layout_crc(params, buffers), 8)) damaged(inconsistent + "another model layout");
  tensor(f, "params", "F32", params.size());
  tensor(f, "buffers", "F32", buffers.size());
  TrainingState state;
  state.step = step;
  state.epoch = meta_int(f, "epoch");
  state.batch_in_epoch = meta_int(f, "batch_in_epoch");
  state.global_batch = f.metadata.count("global_batch") ? meta_int(f, "global_batch") : 0;  // older checkpoints: 0
  if (f.metadata.count("divergence_reference_end")) {
    state.divergence_reference_end = meta_int(f, "divergence_reference_end");
    state.divergence_reference = std::strtod(meta(f, "divergence_reference").c_str(), nullptr);
  }
  if (f.metadata.count("divergence_start"))
    state.divergence_start = std::strtod(meta(f, "divergence_start").c_str(), nullptr);
  state.optimizer_state = blob(f, "optimizer_state");
  state.sync_state = blob(f, "sync_state");
  return state;
}

// Everything one rank checks before its part of a checkpoint may be applied; throws CheckpointError.
Staged read_checkpoint(const fs::path& folder, const CheckpointIdentity& id, const models::ParameterStore& params,
                       const models::ParameterStore& buffers) {
  const int rank = id.rank, world = id.world_size;
  Staged s;
  s.folder = folder.string();
  const std::string where = "checkpoint " + s.folder;
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) damaged(where + ": no such folder");
  if (!fs::exists(folder / kManifest, ec))
    damaged(where + " is incomplete: it has no " + kManifest + " (a save that did not finish)");
  const json m = read_manifest(folder / kManifest);
  std::vector<int> ranks{rank};  // the state files this rank reads: its own, or all of another world's
  int64_t step = 0;
  try {
    if (manifest_integer<int64_t>(m, "version") != kVersion)
      refused(where + " has format version " + m.at("version").dump() + "; this build reads version " +
              std::to_string(kVersion));
    const int64_t saved_world = manifest_integer<int64_t>(m, "world_size");
    if (saved_world < 1 || saved_world > (int64_t{1} << 20)) damaged(where + ": manifest world_size " + m.at("world_size").dump());
    s.saved_world = static_cast<int>(saved_world);
    s.saved_servers = m.contains("servers") ? manifest_integer<int>(m, "servers") : id.servers > 0 ? -1 : 0;
    if (saved_world != world || (id.servers > 0 && s.saved_servers >= 0 && s.saved_servers != id.servers)) {
      ranks.resize(static_cast<size_t>(saved_world));
      for (int r = 0; r < saved_world; ++r) ranks[r] = r;
    }
    const std::string arch = m.at("arch").get<std::string>();
    for (const auto& [key, store, kind] : {std::make_tuple("params", &params, "parameter"),
                                           std::make_tuple("buffers", &buffers, "buffer")}) {
      const std::string diff = layout_difference(m.at(key), *store, kind);
      if (!diff.empty()) refused(where + " holds another model (" + arch + "; this run builds " + id.arch + "): " + diff);
    }
    const std::string saved_hash = m.at("config_hash").get<std::string>();
    if (saved_hash != hex(id.config_hash, 16))
      s.config_warning = where + " was written with another configuration (config hash " + saved_hash +
                         ", this run " + hex(id.config_hash, 16) + "); resuming with this run's configuration";

    const json& files = m.at("files");
    for (int r : ranks) check_file(folder, files, state_file_name(r));
    if (rank == 0) check_file(folder, files, kModelFile);
    step = manifest_integer<int64_t>(m, "step");
  } catch (const json::exception& e) {
    damaged("checkpoint manifest " + (folder / kManifest).string() + " is corrupt: " + e.what());
  }
  s.files.resize(ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i)
    s.states.push_back(read_rank_file(folder, ranks[i], s.saved_world, step, params, buffers, s.files[i]));
  return s;
}

std::vector<float> floats_of(const models::SafeTensorsFile& f, const char* name) {
  const auto& bytes = f.at(name).bytes;  // sizes were checked by read_rank_file
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

std::string join(const std::vector<std::string>& lines) {
  std::string all;
  for (const std::string& s : lines) all += (all.empty() ? "" : "; ") + s;
  return all;
}

void apply(const models::SafeTensorsFile& f, const char* name, models::ParameterStore& store) {
  const auto& bytes = f.at(name).bytes;
  store.copy_values_from_host(bytes.data(), bytes.size());  // sizes were checked by read_rank_file
}

}  // namespace

LoadedCheckpoint load_checkpoint(const std::string& output_dir, const std::string& which,
                                 const CheckpointIdentity& identity, models::ParameterStore& params,
                                 models::ParameterStore& buffers, comm::Communicator& comm) {
  check_identity(identity, comm);
  const bool latest = which == "latest";
  const fs::path root = fs::path(output_dir) / "checkpoints";
  std::vector<fs::path> candidates;
  if (latest) {
    // Rank 0 lists and everyone takes its list: one file system, but not necessarily seen by all
    // ranks at the same instant.
    std::vector<int64_t> steps;
    if (comm.rank() == 0) steps = list_steps(root);
    int64_t n = static_cast<int64_t>(steps.size());
    comm.broadcast(&n, 1, comm::DType::kI64, 0, "CHECKPOINT_LIST");
    steps.resize(static_cast<size_t>(n));
    if (n > 0) comm.broadcast(steps.data(), n, comm::DType::kI64, 0, "CHECKPOINT_LIST");
    for (int64_t step : steps) candidates.push_back(root / step_folder_name(step));
    if (candidates.empty())
      throw std::runtime_error("no checkpoint to resume from: " + root.string() +
                               (fs::is_directory(root) ? " holds no step_<N> folder" : " does not exist"));
  } else {
    candidates.push_back(which);
  }

  std::vector<std::string> skipped;  // damaged newer checkpoints, newest first
  for (const fs::path& folder : candidates) {
    Staged staged;
    int64_t verdict = kOk;
    std::string message;
    try {
      staged = read_checkpoint(folder, identity, params, buffers);
    } catch (const CheckpointError& e) {
      verdict = e.verdict;
      message = e.what();
    } catch (const std::exception& e) {  // e.g. bad_alloc for absurd sizes: the file is not usable
      verdict = kDamaged;
      message = one_line("checkpoint " + folder.string() + ": " + e.what());
    }
    const Outcome o = agree(comm, verdict, message);
    if (o.verdict == kRefused || (o.verdict == kDamaged && !latest)) throw std::runtime_error(o.message);
    if (o.verdict == kDamaged) {
      skipped.push_back(o.message);
      continue;
    }

    LoadedCheckpoint out;
    out.path = staged.folder;
    out.saved_world = staged.saved_world;
    out.saved_servers = staged.saved_servers;
    out.state = staged.states.front();
    if (staged.files.size() == 1 && staged.saved_world == identity.world_size) {
      apply(staged.files.front(), "params", params);
      apply(staged.files.front(), "buffers", buffers);
    } else {
      for (size_t r = 0; r < staged.files.size(); ++r)
        out.saved.push_back({std::move(staged.states[r]), floats_of(staged.files[r], "params"),
                             floats_of(staged.files[r], "buffers")});
    }
    if (!skipped.empty()) skipped.back() += "; resuming from " + staged.folder + " instead";
    if (!staged.config_warning.empty()) skipped.push_back(staged.config_warning);
    out.warning = join(skipped);
    return out;
  }
  throw std::runtime_error("no valid checkpoint to resume from in " + root.string() + ": " + join(skipped));
}

std::optional<CheckpointSummary> peek_checkpoint(const std::string& output_dir, const std::string& which) {
  std::vector<fs::path> candidates;
  if (which == "latest") {
    const fs::path root = fs::path(output_dir) / "checkpoints";
    for (int64_t step : list_steps(root)) candidates.push_back(root / step_folder_name(step));
  } else {
    candidates.push_back(which);
  }
  for (const fs::path& folder : candidates) {
    try {
      const json m = read_manifest(folder / kManifest);
      CheckpointSummary c;
      c.path = folder.string();
      c.step = manifest_integer<int64_t>(m, "step");
      c.world_size = manifest_integer<int>(m, "world_size");
      c.global_batch = m.contains("global_batch") ? manifest_integer<int64_t>(m, "global_batch") : 0;
      c.servers = m.contains("servers") ? manifest_integer<int>(m, "servers") : -1;
      return c;
    } catch (const std::exception&) {  // damaged: load_checkpoint skips it too, or names it
    }
  }
  return std::nullopt;
}

}  // namespace trainer
