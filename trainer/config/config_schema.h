// The list of every configuration key: visit_config(), plus the small vocabulary it is written in
// (value types, ranges, choices) and the key table derived from it.
//
// visit_config() calls, in order, v.section(name, doc) once per section and
//     v.key(path, field, doc, allowed)
// once per key, where field is a reference into the Config (const when the Config is) and allowed
// is a Range, a list of choices, or nothing. Loading, validation, writing, documentation, equality
// and suggestions are visitors over this one function (trainer/config/config.cpp, config_write.cpp).
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "comm/sync/registry.h"
#include "comm/wire_format.h"
#include "trainer/config/config.h"

namespace trainer::config_schema {

// The vocabulary keys are written in, shared with the sync methods' own keys (comm/sync/option_keys.h).
using comm::Allowed;
using comm::at_least;
using comm::closed;
using comm::closed_open;
using comm::open_closed;
using comm::Range;
using comm::Type;
using comm::type_of;
using comm::Value;

// sync.method's documentation: each method's own line from the method table (comm/sync/registry.h).
const char* sync_method_doc();

// A method's table: "sync.oktopk", and what the documentation says above it.
inline std::string method_section_name(const comm::SyncMethod& m) { return "sync." + m.name; }
std::string method_section_doc(const comm::SyncMethod& m);
// Whether the keys of `section` apply under the config's sync.method: every section but the other
// methods' tables.
bool method_section_applies(const std::string& section, const std::string& method);

// A method key's value in the settings: assignable in a Config being loaded, read-only otherwise.
inline comm::Value& method_key_value(SyncConfig& s, const std::string& path) { return s.keys.slot(path); }
inline const comm::Value& method_key_value(const SyncConfig& s, const std::string& path) { return s.keys.at(path); }

template <class Cfg, class Visitor>
void visit_config(Cfg& c, Visitor& v) {
  static_assert(std::is_same_v<std::remove_const_t<Cfg>, Config>);

  v.section("experiment", "Naming, seeding and where outputs go.");
  v.key("experiment.name", c.experiment.name, "Run name; the default output folder is runs/<name>.");
  v.key("experiment.seed", c.experiment.seed,
        "Seed of the run's random streams (weight initialization, data order, augmentation).",
        at_least(0));
  v.key("experiment.output_dir", c.experiment.output_dir,
        "Folder for config.toml, metrics, communication logs and checkpoints; empty means "
        "runs/<experiment.name>.");

  v.section("model", "The network to train.");
  v.key("model.arch", c.model.arch, "Network architecture (layers as in docs/architecture.md, section 5).",
        kModelArchs);
  v.key("model.num_classes", c.model.num_classes, "Number of output classes.", closed(2, 1e6));
  v.key("model.label_smoothing", c.model.label_smoothing,
        "Label smoothing of the cross-entropy targets, as in PyTorch's CrossEntropyLoss (0 = none); "
        "image models and las.",
        closed_open(0, 1));

  v.key("model.freeze_batchnorm", c.model.freeze_batchnorm,
        "Train every BatchNorm with its running statistics, left unchanged (frozen BN, as for "
        "fine-tuning); a batch's gradient is then the mean of its samples' gradients.");
  // The defaults are the Ok-Top-k paper's DeepSpeech (27.6M parameters); smaller values keep its
  // structure for runs that must fit a small machine (configs/repro's small variant).
  v.key("model.deepspeech_conv_channels", c.model.deepspeech_conv_channels,
        "deepspeech: channels of both convolutions.", closed(1, 1024));
  v.key("model.deepspeech_hidden", c.model.deepspeech_hidden, "deepspeech: LSTM width (and lookahead, final layer input).",
        closed(1, 16384));
  v.key("model.deepspeech_rnn_layers", c.model.deepspeech_rnn_layers, "deepspeech: LSTM layers.", closed(1, 16));
  v.key("model.las_listener_hidden", c.model.las_listener_hidden,
        "las: BLSTM width per direction of the listener.", at_least(1));
  v.key("model.las_pyramid_layers", c.model.las_pyramid_layers,
        "las: pyramidal BLSTM layers after the first BLSTM, each halving time (an utterance needs "
        "2^layers frames).", closed(0, 8));
  v.key("model.las_attention_dim", c.model.las_attention_dim,
        "las: size of the attention's query and key projections.", at_least(1));
  v.key("model.las_embedding_dim", c.model.las_embedding_dim, "las: character embedding size.", at_least(1));
  v.key("model.las_speller_hidden", c.model.las_speller_hidden, "las: speller LSTM width.", at_least(1));
  v.key("model.las_speller_layers", c.model.las_speller_layers, "las: speller LSTM layers.", closed(1, 8));
  v.key("model.teacher_forcing", c.model.teacher_forcing,
        "las: probability of feeding the true previous character to the speller while training "
        "(else its own prediction).", closed(0, 1));
  v.key("model.beam_width", c.model.beam_width,
        "las: beam width when decoding for evaluation (1 = greedy).", closed(1, 64));
  v.key("model.max_decode_steps", c.model.max_decode_steps,
        "las: longest transcript decoding produces, in characters.", at_least(1));

  v.section("data", "The dataset and the input pipeline.");
  v.key("data.dataset", c.data.dataset, "Dataset format read from data.root.", kDatasets);
  v.key("data.root", c.data.root,
        "Folder holding the dataset (cifar10: data_batch_1..5.bin and test_batch.bin).");
  v.key("data.synthesize_if_missing", c.data.synthesize_if_missing,
        "When data.root holds no dataset, generate the synthetic one there first (sizes and seed "
        "below) instead of failing.");
  v.key("data.synthetic_train_size", c.data.synthetic_train_size,
        "Training examples the synthetic generator writes.", at_least(1));
  v.key("data.synthetic_test_size", c.data.synthetic_test_size,
        "Test examples the synthetic generator writes.", at_least(1));
  v.key("data.synthetic_seed", c.data.synthetic_seed,
        "Seed of the synthetic generator, separate from experiment.seed so the data stays the same "
        "across runs.",
        at_least(0));
  v.key("data.synthetic_variant", c.data.synthetic_variant,
        "Which synthetic generator: easy (ResNet-20 reaches ~98% in 6 epochs) or hard (clutter, "
        "occlusion, shared parts, blur and noise; calibrated to land near real CIFAR-10, ~70%). The "
        "variant is recorded in data.root's README.txt; a synthetic data.root of the other variant is "
        "an error, never reused.",
        kSyntheticVariants);
  v.key("data.batch_size", c.data.batch_size,
        "Training examples per step on each process; the global batch is this times the number of "
        "processes.",
        closed(1, 65536));
  v.key("data.eval_batch_size", c.data.eval_batch_size, "Examples per forward pass in evaluation.",
        closed(1, 65536));
  v.key("data.augment", c.data.augment,
        "Augment training examples (cifar10: random crop with 4-pixel padding, horizontal flip).");
  v.key("data.loader_threads", c.data.loader_threads,
        "Background threads that read and augment batches.", closed(1, 64));
  v.key("data.features", c.data.features,
        "an4: spectrogram (161 bins of log1p |STFT|, Hamming 20 ms, hop 10 ms: the Ok-Top-k paper's "
        "DeepSpeech input) or logmel (data.mel_bins log-mel filterbanks, for LAS).",
        kSpeechFeatures);
  v.key("data.mel_bins", c.data.mel_bins, "an4, logmel: number of mel filters.", closed(8, 161));
  v.key("data.skip_bad_audio", c.data.skip_bad_audio,
        "an4: skip unreadable or mismatched utterances with a warning (counted) instead of stopping.");
  v.key("data.speed_perturb", c.data.speed_perturb,
        "an4: speed augmentation, a factor drawn from [1 - x, 1 + x] per utterance (0 = off).",
        closed_open(0, 1));
  v.key("data.gain_perturb_db", c.data.gain_perturb_db,
        "an4: gain augmentation, drawn from [-x, +x] dB per utterance (0 = off).", closed(0, 60));

  v.section("optim", "Optimizer, learning-rate schedule and gradient clipping.");
  v.key("optim.name", c.optim.name,
        "Optimizer: sgd (torch.optim.SGD, with momentum, nesterov); adam (torch.optim.Adam, with "
        "beta1, beta2, eps); adamw (torch.optim.AdamW: adam with decoupled weight decay).",
        kOptimizers);
  v.key("optim.lr", c.optim.lr, "Base learning rate, before the schedule and warmup.", closed(0, 10));
  v.key("optim.momentum", c.optim.momentum, "sgd: momentum factor (0 = plain SGD); unused by adam.",
        closed_open(0, 1));
  v.key("optim.nesterov", c.optim.nesterov,
        "sgd: Nesterov momentum (needs optim.momentum > 0); an error with adam and adamw.");
  v.key("optim.weight_decay", c.optim.weight_decay, "Weight decay factor (0 = none).", closed(0, 1));
  v.key("optim.decoupled_weight_decay", c.optim.decoupled_weight_decay,
        "false: L2 decay added to the gradient, as torch.optim.SGD and torch.optim.Adam; true: decay "
        "applied to the weights directly before the step (outside momentum and the moments), as "
        "SGDW/AdamW. adamw always decouples; adam with true is adamw.");
  v.key("optim.beta1", c.optim.beta1, "adam, adamw: decay of the running mean of the gradient.",
        closed_open(0, 1));
  v.key("optim.beta2", c.optim.beta2, "adam, adamw: decay of the running mean of the squared gradient.",
        closed_open(0, 1));
  v.key("optim.eps", c.optim.eps,
        "adam, adamw: added to the bias-corrected square root of the second moment (as PyTorch does).",
        open_closed(0, 1));
  v.key("optim.grad_clip_norm", c.optim.grad_clip_norm,
        "Clip the global L2 norm of the averaged gradient to this value (0 = no clipping).",
        at_least(0));
  v.key("optim.schedule", c.optim.schedule,
        "Learning-rate schedule: constant; multistep (times gamma at each milestone epoch); cosine "
        "(lr to min_lr over the run, per step); exponential (times gamma every epoch).",
        kSchedules);
  v.key("optim.milestones", c.optim.milestones,
        "multistep: epochs at which the rate is multiplied by gamma, in increasing order.",
        at_least(0));
  v.key("optim.gamma", c.optim.gamma,
        "multistep: factor at each milestone; exponential: factor per epoch (1/1.01 divides the rate "
        "by 1.01 each epoch).",
        open_closed(0, 1));
  v.key("optim.min_lr", c.optim.min_lr, "cosine: the rate at the end of the run.", closed(0, 10));
  v.key("optim.warmup_steps", c.optim.warmup_steps,
        "Linear warmup: over the first N steps the rate ramps from 1/N of the scheduled rate to all "
        "of it (0 = none).",
        at_least(0));

  v.section("train", "Length of the run, logging and evaluation.");
  v.key("train.epochs", c.train.epochs, "Passes over the training set.", at_least(1));
  v.key("train.max_steps", c.train.max_steps,
        "Stop after this many optimizer steps even if epochs remain (0 = no limit).", at_least(0));
  v.key("train.log_every_steps", c.train.log_every_steps, "Write a metrics record every N steps.",
        at_least(1));
  v.key("train.eval_every_steps", c.train.eval_every_steps,
        "Evaluate on the test split every N steps (0 = at the end of each epoch).", at_least(0));
  v.key("train.eval_at_start", c.train.eval_at_start,
        "Also evaluate before the first step of a fresh run: the untrained model's baseline.");
  v.key("train.checkpoint_every", c.train.checkpoint_every,
        "Write a checkpoint every N steps (0 = only at the end of the run).", at_least(0));
  v.key("train.keep_checkpoints", c.train.keep_checkpoints,
        "Complete checkpoints kept on disk; older ones are deleted after a newer one is complete.",
        at_least(1));
  v.key("train.skip_nonfinite_steps", c.train.skip_nonfinite_steps,
        "A step whose loss or gradient holds a NaN or an infinity on any rank is skipped on every "
        "rank (no optimizer step, BN statistics restored), at most N steps in a row; 0 = such a step is an error "
        "(exit status 3).",
        at_least(0));
  v.key("train.divergence_guard", c.train.divergence_guard,
        "Stop a run whose sync method diverges after switching from dense training (after "
        "sync.dense_warmup_steps; every method but dense and async_ps): when the mean training loss over a "
        "window of train.divergence_window steps (all processes' batches) exceeds train.divergence_factor "
        "times its mean over the window before the switch (the first window when there is no warmup), or any "
        "window, dense steps included, exceeds train.divergence_start_factor times the loss of the run's first "
        "step, or the loss turns non-finite after the switch where the run would end anyway, the run writes a "
        "checkpoint (when its loss is finite), prints one line beginning \"diverged:\" with the method, its "
        "settings, the steps and the last good checkpoint, writes a \"diverged\" record to metrics.jsonl and "
        "exits with status 4. Normal runs stay below: after the LAS quickstart's switch the highest window was "
        "0.97 x the switch level with oktopk, 0.99 x with powersgd, while diloco at H = 1 with the paper's outer "
        "momentum 0.9 (its defaults then) rose to 1.5 x within 50 steps and 1.73 x later (docs/architecture.md, "
        "\"The divergence guard\").");
  v.key("train.divergence_factor", c.train.divergence_factor,
        "train.divergence_guard: how far above the level at the switch a window's mean loss may go.",
        open_closed(1, 1e6));
  v.key("train.divergence_start_factor", c.train.divergence_start_factor,
        "train.divergence_guard: how far above the run's own start (the mean loss of its first step over all "
        "processes) a window's mean loss may go, in the dense steps before the switch too. It catches a run "
        "that blows up before the level at the switch is known or inside the window that measures it: the LAS "
        "quickstart at optim.lr = 10 without clipping and a 2-step warmup went from loss 3.5 to 862 within 20 "
        "steps, all inside its first window, and nothing stopped it. Training loss falls from its start; 3 x "
        "is far above any normal window.",
        open_closed(1, 1e6));
  v.key("train.divergence_window", c.train.divergence_window,
        "train.divergence_guard: steps per window; the mean over so many batches keeps one bad batch from "
        "tripping it (ranks agree on each window with one small allgather at its last step).",
        at_least(1));
  v.key("train.elastic_batch", c.train.elastic_batch,
        "Resuming on another number of processes P' keeps the checkpoint's global batch G (and so the lr, "
        "the schedule and what a step is). keep_global: G / P' samples per process; where P' does not "
        "divide G, shares of floor or ceil(G / P'), each gradient weighted by its share so the step is "
        "still the mean over G. keep_global_even: only where P' divides G (equal per-process batches, "
        "e.g. for the same BN batch size on every process); otherwise the resume is refused. "
        "data.batch_size applies to fresh runs and to resumes on the same P. With async_ps, P' counts the "
        "workers (processes - sync.servers).",
        Allowed({"keep_global", "keep_global_even"}));
  v.key("train.eval_examples", c.train.eval_examples,
        "an4: reference/hypothesis pairs shown with each evaluation.", closed(0, 100));

  v.section("runtime", "Device, threads and determinism.");
  v.key("runtime.device", c.runtime.device,
        "Where the model, its gradients and the optimizer state live and run: cpu, or cuda (GPU "
        "local_rank % visible GPUs under mpiexec; needs a build with cmake -DTRAINER_CUDA=ON).",
        kDevices);
  v.key("runtime.threads", c.runtime.threads,
        "Compute threads per process (0 = the machine's cores divided by the processes on this "
        "node).",
        closed(0, 4096));
  v.key("runtime.deterministic", c.runtime.deterministic,
        "CPU ops are deterministic for a fixed thread count and world size either way (repeated and "
        "resumed runs are bit-identical); true also pins convolutions to the direct algorithm, so "
        "results do not depend on which kernels this CPU offers. On CUDA, true keeps convolutions to "
        "cuDNN's deterministic algorithms (a run repeats bit for bit on the same GPU, and only then is a "
        "resume bit-exact there); false, as PyTorch's cudnn.deterministic, takes the fastest, whose "
        "weight-gradient sums use atomics and vary in their last bits from run to run.");
  v.key("runtime.cuda_graph", c.runtime.cuda_graph,
        "On CUDA: record a whole training step (batch upload, forward, backward, the dense sync's "
        "NCCL allreduce, the non-finite check, clipping, the optimizer) once as one CUDA graph, after "
        "eager warmup steps, and replay it, with the loss read back every train.log_every_steps. "
        "Same results as eager steps (bit for bit with runtime.deterministic = true). Steps that "
        "cannot be recorded run eagerly, and the run says why in one line: changing shapes (the "
        "speech models), a sync method other than dense or one through host staging. The step's time "
        "is then reported as compute (t_sync_ms and t_optim_ms are 0). Ignored on the CPU.");
  v.key("runtime.conv_algorithm", c.runtime.conv_algorithm,
        "Convolution algorithm on CPU: auto (Winograd F(4,3) for 3x3 stride-1 layers from 32 "
        "channels where oneDNN creates a Winograd kernel, where it measured faster; direct "
        "elsewhere), direct, or winograd (wherever oneDNN has it). oneDNN 3.2, the engine, has no "
        "Winograd convolution, so all three run direct today (oneDNN 2.6 had one for fp32 on "
        "AVX-512: ResNet-18's fp32 step was 1.6x faster with it).",
        kConvAlgorithms);
  v.key("runtime.precision", c.runtime.precision,
        "What convolutions and the layers' matrix products compute in. fp32: everything in fp32. "
        "bf16: mixed precision as PyTorch's autocast defines it: convolutions and Linear layers read "
        "bf16 copies of their weights, activations and incoming gradients and accumulate in fp32, and on "
        "the CPU the image networks keep their activations in bf16 from the first convolution to the "
        "classifier; parameters, gradients, optimizer state, the gradient sync, batch norm's "
        "statistics, the losses and all reductions stay fp32, so no loss scaling is needed (bf16 has "
        "fp32's exponent range) and checkpoints are the same files in either precision. On the CPU "
        "bf16 needs AVX-512 (native with avx512_bf16 or AMX, emulated on plain AVX-512) and is "
        "refused below it. On CUDA bf16 runs cuDNN's and cuBLAS's bf16 kernels, whose outputs are "
        "rounded to bf16 once more (as under autocast). The LSTMs and LAS's attention products stay fp32 "
        "on both. tf32: fp32 data, "
        "with cuDNN convolutions and cuBLAS GEMMs allowed to multiply on TF32 tensor cores (10-bit "
        "mantissa inputs, fp32 accumulation); a GPU mode, refused on the CPU.",
        kPrecisions);
  v.key("runtime.communicator", c.runtime.communicator,
        "What moves the gradient sync's device buffers when runtime.device = \"cuda\": nccl (every rank "
        "needs its own GPU), mpi (MPI through a pinned host staging buffer: ranks may share a GPU), or auto "
        "(nccl when every rank of the job has its own GPU, mpi otherwise). The CPU always uses MPI.",
        kCommunicators);
  v.key("runtime.slowdown.rank", c.runtime.slowdown_rank,
        "A straggler for experiments, written runtime.slowdown = {rank = R, factor = F}: rank R sleeps "
        "after each step so that its steps take F times as long as they would (-1 = nobody).",
        at_least(-1));
  v.key("runtime.slowdown.factor", c.runtime.slowdown_factor,
        "The straggler's slowdown factor F (1 = none).", closed(1, 1000));

  v.section("sync", "Data parallelism: how gradients (or parameters) are combined across processes.");
  v.key("sync.method", c.sync.method, sync_method_doc(), comm::sync_method_names());
  v.key("sync.dense_warmup_steps", c.sync.dense_warmup_steps,
        "The first N steps use dense allreduce whatever the method (synchronous SGD for local_sgd; "
        "for async_ps synchronous rounds: the servers average every worker's gradient).",
        at_least(0));
  v.key("sync.bucket_mb", c.sync.bucket_mb,
        "Bucket size in MB of fp32 gradient: the dense allreduce's, and the groups of whole tensors powersgd "
        "exchanges its factors for (as DDP's powerSGD_hook does per bucket). 8, not PyTorch DDP's 25: the last "
        "bucket only goes out when backward ends, and smaller buckets leave less there (ResNet-18 overlapped on "
        "1 Gbit/s: 682-692 ms per step against 749-751 with 25 at P = 2, 1,484-1,506 against 1,552-1,574 at "
        "P = 4; the same at 100 Mbit/s, where the link is busy all step anyway). A model whose whole gradient "
        "is a few MB overlaps better with buckets of a quarter MB (ResNet-20 at P = 4 on 100 Mbit/s: 260 -> "
        "218 ms per step with this and sync.first_bucket_mb at 0.25).",
        open_closed(0, 1e6));
  v.key("sync.first_bucket_mb", c.sync.first_bucket_mb,
        "Size in MB of the first dense bucket, the one backward fills first (the last layers' gradients): "
        "small, so that communication starts early in backward (PyTorch DDP's first bucket is 1 MB too).",
        open_closed(0, 1e6));
  v.key("sync.overlap", c.sync.overlap,
        "Gradient buckets are exchanged on a communication thread while backward still runs, each as soon as "
        "backward has written its last gradient (PyTorch DDP, Horovod): dense allreduce (sync.method = "
        "\"dense\" and every method's dense warmup) and powersgd's per-bucket factors. The buckets and their "
        "order are the same either way, so the result is bit-identical with false. The sparse methods select "
        "over the whole gradient and local_sgd averages parameters after the optimizer: they start after "
        "backward. Every model reports each layer's gradients as backward finishes them. diloco with "
        "sync.sync_delay > 0: each fragment's pseudo-gradient allreduce runs on a communication thread "
        "during the sync_delay steps after its send (MPI_THREAD_MULTIPLE is then requested; same values as "
        "false, which blocks the send step). On runtime.device = \"cuda\" dense buckets go out on a second "
        "CUDA stream, each after an event recorded behind its last gradient: with NCCL enqueued as backward "
        "hands it over (no host thread waits), through host staging by a communication thread that waits for "
        "the event; a recorded step (runtime.cuda_graph) sends them after backward. powersgd's overlap needs "
        "runtime.device = \"cpu\".");
  v.key("sync.wire_dtype", c.sync.wire_dtype,
        "Number format of the dense gradient allreduces (sync.method = \"dense\" and every method's dense "
        "warmup) and of powersgd's P and Q factors: fp32, or bf16 or fp16 at 2 bytes per element instead of 4 "
        "(PyTorch's bf16_compress_hook, fp16_compress_hook and fp16_compress_wrapper around powerSGD_hook). "
        "The cast is fused into the copy into each bucket; MPI sums the 16-bit values, rounding to the format "
        "at every add, so an element of a P-process sum sees up to P roundings of relative size 2^-8 (bf16) or "
        "2^-11 (fp16). fp16 is divided by the number of processes before its cast, so the sum stays below "
        "65504 wherever the average does. Parameters and BN statistics (local_sgd's averaging), the sparse "
        "methods' selected values and async_ps always travel as fp32. On runtime.device = \"cuda\" dense casts "
        "with the same rounding on the GPU and NCCL sums the 16-bit values natively (host staging: MPI as "
        "above); the compressors with a 16-bit wire compute on host copies.",
        comm::wire_dtype_names());
  // Each method's own keys, its table [sync.<method>], from the method table: declared in the
  // method's file (comm/sync/registry.h). Only sync.method's table applies; a writer that keeps to
  // it (config.toml, the hash, equality) skips the others' (method_section_applies).
  for (const comm::SyncMethod& method : comm::sync_methods()) {
    if (method.keys.empty()) continue;
    v.section(method_section_name(method).c_str(), method_section_doc(method).c_str());
    for (const comm::OptionKey& key : method.keys)
      std::visit([&](auto& value) { v.key(key.path.c_str(), value, key.doc.c_str(), key.allowed); },
                 method_key_value(c.sync, key.path));
  }

  v.section("comm", "The communication log (comm/rank<R>.jsonl and comm/summary.txt).");
  v.key("comm.log", c.comm.log, "Record every message and collective of the recorded steps.");
  v.key("comm.log_first_step", c.comm.log_first_step, "First step recorded.", at_least(0));
  v.key("comm.log_last_step", c.comm.log_last_step, "Last step recorded (-1 = to the end).", at_least(-1));
  v.key("comm.log_every", c.comm.log_every, "Record only steps that are multiples of N (sampling).",
        at_least(1));
  v.key("comm.trace_first_step", c.comm.trace_first_step, "First step of the Chrome trace (trace.json).",
        at_least(0));
  v.key("comm.trace_steps", c.comm.trace_steps,
        "Steps in the Chrome trace trace.json: every rank's compute phases and comm calls (0 = no trace; "
        "comm calls need comm.log).",
        closed(0, 1000));
}

// One row of the key table: everything visit_config() says about a key, with its default.
struct KeyInfo {
  std::string path;     // "optim.lr"
  std::string section;  // "optim"
  Type type;
  std::string doc;
  Allowed allowed;
  Value default_value;
};
struct SectionInfo {
  std::string name;
  std::string doc;
};
const std::vector<KeyInfo>& keys();  // in visit_config() order
const std::vector<SectionInfo>& sections();
const KeyInfo* find_key(const std::string& path);  // nullptr when unknown

// Text forms shared by error messages, the TOML writer and the documentation.
std::string toml_literal(const Value& v);  // as written in TOML: "a\"b", 0.1, [100, 150]
std::string type_name(Type t);             // "string", "integer", "array of integers", ...
std::string describe(const Range& r);      // "[0, 1)", "[1, inf)"

}  // namespace trainer::config_schema
