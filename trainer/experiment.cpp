#include "trainer/experiment.h"

#include <omp.h>

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <thread>

#include "comm/device_communicator.h"
#include "comm/sync/registry.h"
#include "models/cpu/dnnl_dispatch.h"
#include "models/cpu/dnnl_precision.h"
#ifdef TRAINER_HAS_CUDA
#include "models/cuda/cuda_backend.h"
#endif

namespace trainer::app {

int configure_runtime(const Config& config, int local_ranks) {
  int threads = static_cast<int>(config.runtime.threads);
  if (threads <= 0)
    threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / std::max(1, local_ranks));
  omp_set_num_threads(threads);  // oneDNN (OpenMP runtime) and OpenBLAS (OpenMP build) follow this
  precision_plan(config);        // refuses what this device cannot run, before anything is built
  return threads;
}

models::BackendSettings backend_settings(const Config& config) {
  using models::ConvAlgorithm;
  using models::Precision;
  models::BackendSettings s;
  const std::string& p = config.runtime.precision;
  s.precision = p == "bf16" ? Precision::kBf16 : p == "tf32" ? Precision::kTf32 : Precision::kFp32;
  s.deterministic = config.runtime.deterministic;
  const std::string& a = config.runtime.conv_algorithm;
  s.conv_algorithm = a == "direct" ? ConvAlgorithm::kDirect : a == "winograd" ? ConvAlgorithm::kWinograd
                                                                                : ConvAlgorithm::kAuto;
  // So that CPU results do not depend on which kernels this CPU offers (config_schema.h).
  if (config.runtime.deterministic) s.conv_algorithm = ConvAlgorithm::kDirect;
  return s;
}

std::string precision_plan(const Config& config) {
  const std::string& p = config.runtime.precision;
  const std::string key = "runtime.precision = \"" + p + "\": ";
  if (p == "fp32") return "fp32";
  if (config.runtime.device == "cuda" && p == "tf32")
    return "tf32 (cuDNN convolutions and cuBLAS GEMMs may multiply on TF32 tensor cores; data and "
           "accumulation fp32)";
  if (config.runtime.device == "cuda" && p == "bf16")
    return "bf16 (cuDNN convolutions and cuBLAS Linear GEMMs on bf16 copies with fp32 accumulation, their outputs "
           "rounded to bf16 once; the rest fp32)";
  if (config.runtime.device != "cpu")
    throw std::invalid_argument(key + "runtime.device = \"" + config.runtime.device + "\" is not cpu or cuda");
  models::cpu::require_precision(backend_settings(config).precision);  // tf32; bf16 below AVX-512
  return "bf16 (convolutions and Linear layers on bf16 copies with fp32 accumulation; the rest fp32; oneDNN ISA " +
         std::string(models::cpu::dnnl_isa_name()) + ")";
}

models::Backend& device_backend(const Config& config, int local_rank) {
  const std::string& device = config.runtime.device;
  if (device == "cpu") return models::cpu_backend(backend_settings(config));
  if (device == "cuda") {
#ifdef TRAINER_HAS_CUDA
    try {
      return models::cuda::cuda_backend(local_rank, backend_settings(config));
    } catch (const std::exception& e) {
      throw std::runtime_error("runtime.device = \"cuda\": " + std::string(e.what()));
    }
#else
    throw std::invalid_argument(
        "runtime.device = \"cuda\": this trainer was built without CUDA support; rebuild with "
        "cmake -DTRAINER_CUDA=ON (needs the CUDA toolkit, cuDNN and NCCL, e.g. under /usr/local/cuda)");
#endif
  }
  throw std::invalid_argument("runtime.device = \"" + device + "\": expected cpu or cuda");
}

bool needs_concurrent_calls(const Config& c) {
  const comm::SyncMethod& method = comm::sync_method(c.sync.method);
  return method.concurrent_calls && method.concurrent_calls(c.sync);
}

optim::OptimizerOptions optimizer_options(const Config& c) {
  optim::OptimizerOptions o;
  o.name = c.optim.name;
  // A method that owns the momentum (sync.<method>.dgc) applies it before the optimizer sees the gradient.
  const bool owned = sync_owns_momentum(c);
  o.momentum = owned ? 0.0 : c.optim.momentum;
  o.nesterov = owned ? false : c.optim.nesterov;
  // ... and the coupled weight decay (its own momentum, comm/sync/wrappers/dgc.h); decoupled decay stays here.
  o.weight_decay = owned && !c.optim.decoupled_weight_decay && c.optim.name != "adamw" ? 0.0 : c.optim.weight_decay;
  o.decoupled_weight_decay = c.optim.decoupled_weight_decay;
  o.beta1 = c.optim.beta1;
  o.beta2 = c.optim.beta2;
  o.eps = c.optim.eps;
  return o;
}

optim::ScheduleOptions schedule_options(const OptimConfig& o) {
  optim::ScheduleOptions s;
  s.kind = optim::schedule_kind_from_name(o.schedule);
  s.base_lr = o.lr;
  s.milestones = o.milestones;
  s.gamma = o.gamma;
  s.min_lr = o.min_lr;
  s.warmup_steps = o.warmup_steps;
  return s;
}

int64_t total_steps(const Config& config, int64_t steps_per_epoch) {
  int64_t total = config.train.epochs * steps_per_epoch;
  if (config.train.max_steps > 0) total = std::min(total, config.train.max_steps);
  return total;
}

Experiment build_experiment(const Config& config, comm::Communicator& world, comm::Communicator& training,
                            const std::function<void(const std::string&)>& announce) {
  Experiment e;
  e.backend = &device_backend(config, world.local_rank());
  e.task = make_task(config, training, announce, *e.backend);
  const OptimConfig& o = config.optim;
  const int64_t n = e.task->parameters().size();
  e.optimizer = optim::make_optimizer(*e.backend, optimizer_options(config), n);
  e.schedule = schedule_options(o);
  const int64_t steps_per_epoch = e.task->steps_per_epoch();
  e.sync_options = sync_options(config, steps_per_epoch, total_steps(config, steps_per_epoch));
  comm::SyncOptions& so = e.sync_options;
  so.backend = e.backend;
  // A method that takes device buffers gets a communicator that moves them (NCCL, or MPI through
  // pinned staging); the others run on host copies (comm/sync/wrappers/host_staged.h) and talk MPI.
  if (comm::takes_device_buffers(comm::sync_method(config.sync.method), config.sync)) {
    comm::SyncCommunicator carrier = comm::make_sync_communicator(config.runtime.communicator, world, *e.backend);
    e.sync_comm = std::move(carrier.device);
    e.sync_on_device = carrier.on_device;
    if (e.sync_comm) announce("sync communicator: " + carrier.description);
  } else if (!e.backend->is_host()) {
    announce("sync: " + config.sync.method + " computes on the host: the gradient goes through host memory "
             "every step (comm/sync/wrappers/host_staged.h)");
  }
  e.sync = comm::make_gradient_sync(so, e.sync_comm ? *e.sync_comm : world, n, &e.task->parameters().views());
  return e;
}

}  // namespace trainer::app
