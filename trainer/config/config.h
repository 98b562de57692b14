// The experiment configuration: one TOML file (plus --set overrides) -> one validated Config.
//
// Every key is listed exactly once, with its documentation and allowed values, in visit_config()
// (trainer/config/config_schema.h); loading, validation, --set overrides, the resolved config.toml, the
// reference documentation (docs/config.md) and key suggestions are all derived from that list.
// Defaults are the member initializers below.
//
// To add a key: a member here with its default, and one v.key(...) line in visit_config().
// To add a section: a struct here, a member of Config, and its lines in visit_config().
// A sync method's own keys are the exception: they are its options struct's, declared in its own
// file (comm/sync/registry.h), and visit_config() visits them from the method table.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/sync/sync_settings.h"

namespace trainer {

// The closed sets of names some keys accept, kept once so that validation, the documentation and
// the factories that build these things agree. A new model, dataset or schedule adds its name here.
inline const std::vector<std::string> kModelArchs = {"resnet20", "resnet32", "resnet56", "resnet18",
                                                     "vgg16",    "deepspeech", "las"};
inline const std::vector<std::string> kDatasets = {"cifar10", "an4"};
inline const std::vector<std::string> kSpeechFeatures = {"spectrogram", "logmel"};
inline const std::vector<std::string> kSyntheticVariants = {"easy", "hard"};  // data/synthetic_cifar.h
// Must match optim::optimizer_names() (a test checks).
inline const std::vector<std::string> kOptimizers = {"sgd", "adam", "adamw"};
inline const std::vector<std::string> kSchedules = {"constant", "multistep", "cosine", "exponential"};
inline const std::vector<std::string> kConvAlgorithms = {"auto", "direct", "winograd"};
inline const std::vector<std::string> kPrecisions = {"fp32", "tf32", "bf16"};
inline const std::vector<std::string> kDevices = {"cpu", "cuda"};
inline const std::vector<std::string> kCommunicators = {"auto", "nccl", "mpi"};

struct ExperimentConfig {
  std::string name = "quickstart";
  int64_t seed = 0;
  std::string output_dir;  // empty: runs/<name>; use output_dir(config) for the resolved folder
};

struct ModelConfig {
  std::string arch = "resnet20";
  int64_t num_classes = 10;
  double label_smoothing = 0.0;
  bool freeze_batchnorm = false;
  // Listen-Attend-Spell sizes (the an4 configuration of docs/architecture.md section 5) and its training and
  // decoding choices.
  int64_t deepspeech_conv_channels = 32;
  int64_t deepspeech_hidden = 800;
  int64_t deepspeech_rnn_layers = 5;
  int64_t las_listener_hidden = 384;
  int64_t las_pyramid_layers = 3;
  int64_t las_attention_dim = 512;
  int64_t las_embedding_dim = 256;
  int64_t las_speller_hidden = 640;
  int64_t las_speller_layers = 2;
  double teacher_forcing = 1.0;
  int64_t beam_width = 1;
  int64_t max_decode_steps = 150;
};

struct DataConfig {
  std::string dataset = "cifar10";
  std::string root = "datasets/synthetic_cifar10";
  bool synthesize_if_missing = false;
  int64_t synthetic_train_size = 20000;
  int64_t synthetic_test_size = 2000;
  int64_t synthetic_seed = 1234;
  std::string synthetic_variant = "easy";
  int64_t batch_size = 128;  // per process
  // Not a key: the global batch an elastic resume keeps (trainer/checkpoint/reshard.h) where the new number of
  // processes does not divide it (0: batch_size x processes). Shares then differ by one sample.
  int64_t global_batch = 0;
  int64_t eval_batch_size = 500;
  bool augment = true;
  int64_t loader_threads = 2;
  std::string features = "spectrogram";  // an4
  int64_t mel_bins = 80;
  bool skip_bad_audio = false;
  double speed_perturb = 0.0;
  double gain_perturb_db = 0.0;
};

struct OptimConfig {
  std::string name = "sgd";
  double lr = 0.1;
  double momentum = 0.9;  // sgd
  bool nesterov = false;  // sgd
  double weight_decay = 5e-4;
  bool decoupled_weight_decay = false;
  double beta1 = 0.9;  // adam, adamw
  double beta2 = 0.999;
  double eps = 1e-8;
  double grad_clip_norm = 0.0;  // 0: off
  std::string schedule = "multistep";
  std::vector<int64_t> milestones = {100, 150};  // epochs
  double gamma = 0.1;
  double min_lr = 0.0;
  int64_t warmup_steps = 0;
};

struct TrainConfig {
  int64_t epochs = 200;
  int64_t max_steps = 0;  // 0: no limit
  int64_t log_every_steps = 20;
  int64_t eval_every_steps = 0;  // 0: at the end of each epoch
  bool eval_at_start = false;
  int64_t checkpoint_every = 0;  // 0: only at the end
  int64_t keep_checkpoints = 2;
  int64_t eval_examples = 3;
  int64_t skip_nonfinite_steps = 0;  // 0: a NaN/Inf loss or gradient is an error
  bool divergence_guard = true;      // trainer/step/divergence_guard.h
  double divergence_factor = 1.5;
  double divergence_start_factor = 3.0;  // against the run's first step, dense steps included
  int64_t divergence_window = 50;    // steps
  std::string elastic_batch = "keep_global";  // resume on another number of processes (trainer/checkpoint/reshard.h)
};

struct RuntimeConfig {
  std::string device = "cpu";
  int64_t threads = 0;  // 0: hardware cores / ranks on this node
  bool deterministic = false;
  bool cuda_graph = true;  // runtime.device = cuda: each static-shape step as one CUDA graph (trainer/step/step_graph.h)
  std::string conv_algorithm = "auto";
  std::string precision = "fp32";  // fp32, tf32 (GPU only) or bf16 mixed precision
  std::string communicator = "auto";  // device buffers: nccl, mpi (host staging), or auto
  int64_t slowdown_rank = -1;     // runtime.slowdown = {rank = R, factor = F}: a straggler for experiments
  double slowdown_factor = 1.0;
};

// [sync]: the gradient-sync stage's keys and every method's own (comm/sync/sync_settings.h).
using SyncConfig = comm::SyncSettings;


struct CommConfig {
  bool log = true;
  int64_t log_first_step = 0;
  int64_t log_last_step = -1;
  int64_t log_every = 1;
  int64_t trace_first_step = 0;
  int64_t trace_steps = 0;
};

struct Config {
  ExperimentConfig experiment;
  ModelConfig model;
  DataConfig data;
  OptimConfig optim;
  TrainConfig train;
  RuntimeConfig runtime;
  SyncConfig sync;
  CommConfig comm;
  // Not keys: how the file was read where it was not as written, lines for the start and --dry-run:
  // "note: ..." for an old flat spelling read as the method's key, "config: ..." for a setting that
  // does not apply to sync.method (another method's table, a flat key the method has not).
  std::vector<std::string> notes;
};

// Every bad input is a ConfigError whose message is one line naming where the value came from (the
// file, or the --set argument) and the key, e.g.
//   configs/x.toml: unknown key 'optim.learning_rate' (did you mean 'optim.lr'?)
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Reads the TOML file at `path`, applies `overrides` ("key.path=value" strings from --set, in
// order, each beating the file and the ones before it), validates, and returns the result. Keys the
// file does not set keep their defaults. An empty path means "defaults plus overrides".
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

// The same from TOML text already in memory; source_name is what error messages call it.
Config parse_config(const std::string& toml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides = {});

// The resolved config as TOML: every key, by section, each with its documentation as a comment.
// parse_config(to_toml(c), ...) == c.
std::string to_toml(const Config& config);

// The reference documentation (docs/config.md): one Markdown table per section.
std::string config_reference_markdown();

// FNV-1a 64 of the resolved values (to_toml without the comments, so improving a key's
// documentation does not invalidate checkpoints). Equal configs hash equally.
uint64_t config_hash(const Config& config);

// experiment.output_dir, or runs/<experiment.name> when it is empty.
std::string output_dir(const Config& config);

bool operator==(const Config& a, const Config& b);
inline bool operator!=(const Config& a, const Config& b) { return !(a == b); }

}  // namespace trainer
