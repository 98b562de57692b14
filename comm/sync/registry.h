// The gradient-sync methods as one table (docs/architecture.md section 4, "The method table").
//
// Each method is one file that defines its spec: its name, one line of documentation for
// sync.method, what it can do (SyncCapabilities), its own keys (an options struct, option_keys.h)
// with their defaults that depend on the recipe, the rules between them, its start notes, and its
// factory. The table (methods.h) lists the built-in methods, one line each; a test or an extension
// adds its own with register_sync_method(). Everything that used to ask a method's name asks the
// table instead: the config's keys, choices, defaults and checks, the factory (make_gradient_sync),
// the trainer's roles and resume, the start notes, --dry-run, the divergence guard and the benchmarks.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/sync/gradient_sync.h"
#include "comm/sync/option_keys.h"
#include "comm/sync/sync_settings.h"
#include "models/backend.h"
#include "models/parameters.h"

namespace trainer::comm {

// What a method can do; the trainer and the config decide with these, never with a name.
struct SyncCapabilities {
  // Takes SyncBuffers in device memory (runtime.device = "cuda"): its arithmetic runs on the
  // buffers' backend and its communicator moves device memory. The others compute on host buffers
  // (on a device run, host copies: host_staged.h).
  bool device_buffers = false;
  // Sends less than the gradient and keeps the rest in an error-feedback residual: sync.<method>.keep_dense
  // and sync.<method>.error_feedback apply to it.
  bool compresses = false;
  // Its reduce() sends the gradient to where the optimizer runs and returns the new parameters
  // (async_ps: the last sync.async_ps.servers ranks serve and run no training step). The rank's role, the
  // update rule and the checkpoint layout follow from it.
  bool applies_update = false;
  // Every rank holds the same parameters and optimizer state after every step (false: local SGD
  // between averaging steps, async_ps's workers). An elastic resume checks it.
  bool keeps_parameters_equal = true;
  // The first sync.dense_warmup_steps steps are dense allreduce in make_gradient_sync's wrapper
  // (false: the method is dense anyway, or runs the warmup itself, as async_ps's servers do).
  bool wrapped_in_warmup = true;
  // Every step enqueues the same kernels and collectives with the same arguments, and reads nothing
  // back on the host, so a whole step can be recorded once as a CUDA graph and replayed
  // (runtime.cuda_graph, trainer/step/step_graph.h), when its collectives run on the device (NCCL).
  bool capturable = false;
  // Compresses tensor by tensor (powersgd's matrices): it is built with the model's named tensors
  // (SyncContext::views) and refuses to be built without them; tools without a model give it one's.
  bool layer_wise = false;
  // Its allgatherv carries the same total whatever the number of ranks (oktopk: the k globally
  // selected entries, split among the ranks); another method's grows with the ranks (each rank's
  // own list). `trainer whatif` scales the measured messages by this.
  bool fixed_gather_total = false;
};

// What a factory gets beside the [sync] options: where the buffers live and what they hold.
struct SyncContext {
  Communicator& comm;
  int64_t n;  // gradient entries
  const std::vector<models::ParamView>* views;  // the model's named tensors; null in some tools
  models::Backend& backend;  // where SyncBuffers live (the CPU unless device_buffers)
  // sync.<method>.keep_dense, one flag per view (empty: nothing kept); only for methods that compress.
  const std::vector<bool>& kept;

  // The backend of a method without device_buffers, which keeps its state in host vectors: the
  // factory builds such a method for the host (and stages it on a device run), so this is a host
  // backend; a logic_error says so if a caller ever hands it a device's.
  models::Backend& host_backend(const std::string& method) const;
};

// A problem with a method's own keys, found before anything is built: the keys it involves (the
// config names the one set last; a name without a dot is the method's own key, "density", others are
// paths, "optim.name") and one line saying what is wrong, which names the method's keys by their
// names too (the config and the factory put "[sync.<method>] " before it).
struct SyncOptionProblem {
  std::vector<std::string> keys;
  std::string message;
};

// A default that depends on the recipe (the model, the optimizer, the method's other keys): it
// applies where the config leaves the key (the method's key named `key`, "density") unset; `why` is what it is for and what was measured, for
// --dry-run and the start.
struct MethodDefault {
  std::string key;
  Value value;
  std::string why;
};

struct SyncMethod {
  std::string name;  // the value of sync.method
  std::string doc;   // what it does, for sync.method's documentation (docs/config.md)
  SyncCapabilities can;
  // Its own keys, its table [sync.<name>] (option_keys.h; declare_options<O>() sets them from its
  // options struct): sync.<name>.<key>, with types, ranges and defaults of its own.
  std::vector<OptionKey> keys;
  // Its defaults that depend on the recipe (null: none); a default that does not is its key's.
  std::function<std::vector<MethodDefault>(const SyncOptions&)> defaults;
  // Lines printed at the start (and by --dry-run) when the recipe is known to cost accuracy with
  // this method, each beginning "note: " (null: none).
  std::function<std::vector<std::string>(const SyncOptions&)> start_notes;
  // Ranks that serve instead of training, the last ones (applies_update; null: none).
  std::function<int64_t(const SyncSettings&)> server_ranks;
  // Builds the method; the dense warmup and sync.<method>.keep_dense's dense allreduce are added around it by
  // make_gradient_sync. Throws std::invalid_argument naming the key for options it cannot run with.
  std::function<std::unique_ptr<GradientSync>(const SyncOptions&, const SyncContext&)> make;
  // The rules between the method's keys (and the recipe) that their ranges cannot say (null: none).
  // The config asks them while loading, to name the key set last; the factory builds only what
  // passes them; the method's constructor trusts its options.
  std::function<std::vector<SyncOptionProblem>(const SyncOptions&)> check;
  // True when these keys make the method call MPI from a second thread while the training thread
  // does too (MPI_THREAD_MULTIPLE is then requested at start). Null: never.
  std::function<bool(const SyncSettings&)> concurrent_calls;
  // True when these keys keep a method with device_buffers on host buffers after all (the
  // compressors' sync.<method>.keep_dense, sync.<method>.adaptive and 16-bit sync.wire_dtype are host loops). Null: never.
  std::function<bool(const SyncSettings&)> needs_host_buffers;
  // True when these keys make the method own SGD's momentum (optim.momentum, optim.nesterov, in
  // SyncOptions::recipe): the trainer then builds the optimizer without momentum (sync.<method>.dgc, dgc.h). Null: never.
  std::function<bool(const SyncSettings&)> owns_momentum;
  // True when these keys make the method apply optim.grad_clip_norm itself (DGC's local clipping):
  // the trainer then clips nothing after the sync. Null: never.
  std::function<bool(const SyncSettings&)> owns_clipping;
};

// Sets the method's keys from its options struct O, under its table: "sync.<name>.<key>".
template <class O>
void declare_options(SyncMethod& m) {
  m.keys = OptionBinding<O>(SyncSettings::method_key_path(m.name, "")).keys();
}

// Every key of every method in the table, in table order (each method's table after the one before).
const std::vector<OptionKey>& sync_method_keys();
const OptionKey* find_sync_method_key(const std::string& path);  // null when no method declares it
// The method's key named `name` ("density"), or null.
const OptionKey* method_key(const SyncMethod& method, const std::string& name);
// "oktopk, topka, gaussiank, gtopk and powersgd": the methods with a key of this name.
std::string sync_methods_with_key(const std::string& name);
// The server ranks of the settings' method (0 for every method but a parameter server).
int64_t server_ranks(const SyncSettings& settings);

// Whether the method runs on device buffers with these options (device_buffers, and not
// needs_host_buffers); on a device run the others compute on host copies (host_staged.h).
bool takes_device_buffers(const SyncMethod& method, const SyncSettings& settings);
// The spec's owns_momentum and owns_clipping with these settings (false when null).
bool method_owns_momentum(const SyncMethod& method, const SyncSettings& settings);
bool method_owns_clipping(const SyncMethod& method, const SyncSettings& settings);

// Every method, built-in ones first, in the order docs and errors list them.
const std::vector<SyncMethod>& sync_methods();  // their names: sync_method_names() (gradient_sync.h)
// The method named `name`, or null.
const SyncMethod* find_sync_method(const std::string& name);
// The same, or std::invalid_argument naming the available methods.
const SyncMethod& sync_method(const std::string& name);
// Changes whenever a method is registered, so that tables derived from this one (the config's keys)
// know to rebuild.
int sync_table_version();
// Adds a method (a test's, an extension's). Throws std::invalid_argument when the name is taken or
// the spec has no name or factory. Not thread-safe: register before anything reads the table.
void register_sync_method(SyncMethod method);
// "dense and local_sgd": the methods with a capability, for error messages.
std::string sync_methods_that(bool SyncCapabilities::*capability);

}  // namespace trainer::comm
