#include "comm/sync/methods/outer/diloco.h"

#include <algorithm>
#include <cmath>
#include <istream>
#include <sstream>
#include <stdexcept>

#include "comm/sync/methods/dense/dense.h"
#include "comm/sync/registry.h"
#include "comm/sync/sync_state.h"

namespace trainer::comm {
namespace {

// The outer optimizer of one fragment: the inner steps' optimizers (optim/), on the backend where
// theta_outer lives.
std::unique_ptr<optim::Optimizer> make_outer_optimizer(models::Backend& backend, const DilocoOptions& o, int64_t size) {
  optim::OptimizerOptions options;
  options.name = o.outer_optimizer == "adam" ? "adam" : "sgd";
  options.momentum = o.outer_momentum;
  options.nesterov = o.outer_optimizer == "nesterov";
  return optim::make_optimizer(backend, options, size);
}

// The outer optimizer's code in the saved state (0 and 1 as the first format wrote them).
uint8_t outer_optimizer_code(const std::string& name) { return name == "nesterov" ? 1 : name == "adam" ? 2 : 0; }

// The first `count` floats of a buffer of the backend, through a host copy (checkpoints are the
// same files whatever the device).
void write_floats(std::ostream& out, const models::DeviceBuffer& buffer, int64_t count) {
  const std::vector<float> host = models::host_copy(buffer, count);
  out.write(reinterpret_cast<const char*>(host.data()), static_cast<std::streamsize>(count * sizeof(float)));
}

double mb(int64_t floats) { return static_cast<double>(floats) * 4 / 1e6; }

DilocoOptions diloco_options(const SyncSettings& o) { return options_of<DilocoOptions>(o); }

std::string str(double v) {
  std::ostringstream s;
  s << v;  // 0.9, not to_string's 0.900000
  return s.str();
}

// The defaults of issue 33 (BENCHMARKS.md, "Defaults that hold accuracy"): H = 8, and outer momentum
// 0.5 over SGD with momentum (the DiLoCo paper's 0.9 is for AdamW inner steps; over SGD momentum 0.9
// the two momenta compound and runs diverged or lost 7 to 11 points); 0.9 with adam and adamw.
std::vector<MethodDefault> diloco_defaults(const SyncOptions& o) {
  std::vector<MethodDefault> d;
  if (o.recipe.optimizer == "sgd" && o.recipe.momentum > 0)
    d.push_back({"outer_momentum", 0.5,
                 "diloco's outer momentum over SGD with momentum inner steps (the paper's 0.9 is for AdamW "
                 "inner steps; over SGD momentum it lost 6.7 points on CIFAR and 11 CER points on LAS)"});
  else
    d.push_back({"outer_momentum", 0.9,
                 "diloco's outer momentum over " + o.recipe.optimizer + " inner steps: the DiLoCo paper's (AdamW inner steps)"});
  return d;
}

// At H = 8, outer momentum 0.5 instead of the paper's 0.9 over SGD momentum 0.9 ended 6.7 points
// better on CIFAR (ResNet-20) and 11 CER points better on LAS, both within 2 points of dense
// (BENCHMARKS.md, "Methods that sync rarely"); a run set to 0.9 there gets this note.
std::vector<std::string> diloco_notes(const SyncOptions& o) {
  const auto keys = options_of<DilocoOptions>(o);
  if (keys.outer_optimizer == "adam" || keys.outer_momentum < 0.9 || o.recipe.optimizer != "sgd" || o.recipe.momentum < 0.9)
    return {};
  return {"note: diloco with outer momentum " + str(keys.outer_momentum) + " (outer_momentum; the paper's, for "
          "AdamW inner steps) over SGD momentum " + str(o.recipe.momentum) + ": at H = 8, outer momentum 0.5 ended at "
          "96.1% against 89.4% on CIFAR (ResNet-20; dense 97.8%) and at CER 17.7% against 28.7% on the LAS "
          "quickstart (dense 16.8%) (BENCHMARKS.md)"};
}

}  // namespace

std::vector<SyncOptionProblem> diloco_problems(const DilocoOptions& o) {
  std::vector<SyncOptionProblem> found;
  const std::string schedule = fragment_schedule_problem(o.period, o.fragments, o.sync_delay);
  if (!schedule.empty()) found.push_back({{"period", "fragments", "sync_delay"}, schedule});
  if (!(o.mixing >= 0 && o.mixing <= 1))
    found.push_back({{"mixing"}, "mixing = " + std::to_string(o.mixing) + " must be in [0, 1]"});
  if (o.outer_optimizer != "nesterov" && o.outer_optimizer != "sgd" && o.outer_optimizer != "adam")
    found.push_back({{"outer_optimizer"},
                     "outer_optimizer = \"" + o.outer_optimizer + "\": expected nesterov, sgd or adam"});
  if (o.outer_optimizer == "nesterov" && !(o.outer_momentum > 0))
    found.push_back({{"outer_optimizer", "outer_momentum"},
                     "outer_optimizer = \"nesterov\" needs outer_momentum > 0 (or outer_optimizer = "
                     "\"sgd\")"});
  if (!(o.outer_lr > 0) || !(o.outer_momentum >= 0))
    found.push_back(
        {{"outer_lr", "outer_momentum"}, "outer_lr must be > 0 and outer_momentum >= 0"});
  return found;
}

SyncMethod diloco_method() {
  SyncMethod m;
  m.name = "diloco";
  m.doc =
      "DiLoCo and Streaming DiLoCo: local steps, and every sync.diloco.period steps the averaged parameter change steps "
      "the shared parameters through an outer optimizer, optionally one fragment at a time";
  m.can.keeps_parameters_equal = false;
  m.can.device_buffers = true;  // theta_outer, its optimizer and the pseudo-gradient on the backend
  declare_options<DilocoOptions>(m);
  m.defaults = diloco_defaults;
  m.start_notes = diloco_notes;
  m.check = [](const SyncOptions& o) { return diloco_problems(diloco_options(o)); };
  // A delayed fragment's allreduce runs on its own thread while the training thread calls MPI.
  m.concurrent_calls = [](const SyncSettings& o) { return diloco_options(o).sync_delay > 0 && o.overlap; };
  m.make = [](const SyncOptions& o, const SyncContext& c) -> std::unique_ptr<GradientSync> {
    return std::make_unique<Diloco>(c.comm, c.backend, c.n, c.views, diloco_options(o), bucket_elements(o.bucket_mb),
                                    o.overlap);
  };
  return m;
}

Diloco::Diloco(Communicator& comm, models::Backend& backend, int64_t n, const std::vector<models::ParamView>* views,
               const DilocoOptions& o, int64_t bucket_elements, bool overlap)
    : OuterLoop(comm, backend, n, views, o, bucket_elements, parse_outer_dtype(o.outer_dtype), overlap),
      options_(o),
      wire_(parse_outer_dtype(o.outer_dtype)),
      overlap_(overlap),
      pseudo_gradient_(backend) {
  int64_t largest = 0;
  for (const Fragment& f : fragments_) {
    outer_optimizers_.push_back(make_outer_optimizer(backend, o, f.size()));
    largest = std::max(largest, f.size());
  }
  pseudo_gradient_.resize(largest);
}

std::string Diloco::describe() const {
  const int64_t H = options_.period, F = options_.fragments;
  int64_t largest = 0;
  std::ostringstream sizes;
  for (const Fragment& f : fragments_) {
    largest = std::max(largest, f.size());
    sizes << (f.first_tensor ? ", " : "") << mb(f.size());
  }
  const int p = comm_.size();
  const bool adam = options_.outer_optimizer == "adam";
  const int64_t state_copies = adam ? 2 : options_.outer_momentum > 0 ? 1 : 0;
  // What leaves a rank for one fragment's sync: a ring allreduce of fp32, or the low-bit sum's two calls.
  auto wire = [&](int64_t elements) {
    if (wire_ == OuterDType::kF32) return 2.0 * (p - 1) / p * 4.0 * static_cast<double>(elements);
    return static_cast<double>(quantized_volume(wire_, elements, p).bytes_sent);
  };
  double per_round = 0;
  for (const Fragment& f : fragments_) per_round += wire(f.size());
  std::ostringstream out;
  out << "diloco: " << H << " inner steps per fragment sync round; the pseudo-gradient theta_outer - theta_local "
      << "is averaged (ALLREDUCE_OUTER, on the wire as " << outer_dtype_name(wire_)
      << ") and steps theta_outer with outer " << options_.outer_optimizer << " (lr " << options_.outer_lr;
  if (!adam) out << ", momentum " << options_.outer_momentum;
  out << ")";
  out << "\n  " << F << " fragment(s) of whole tensors (" << sizes.str() << " MB), one synced every " << H / F
      << (F * (H / F) == H ? "" : "-" + std::to_string(H / F + 1)) << " step(s): at most " << mb(largest)
      << " MB of fp32 per sync, " << wire(largest) / 1e6 << " MB sent per rank for it at P = " << p << " ("
      << (wire_ == OuterDType::kF32 ? "ring allreduce 2(P-1)/P x 4 bytes per element"
                                    : "alltoall and allgather of the quantized chunks")
      << "), " << per_round / 1e6 / static_cast<double>(H) << " MB per step on average (dense fp32: "
      << 2.0 * (p - 1) / p * mb(n_) << ")";
  const std::string transfer =
      options_.sync_delay == 0 ? ""
      : overlapped()           ? ", the transfer runs on a communication thread during them"
      : !overlap_              ? ", the transfer blocks at the send (sync.overlap = false)"
                               : ", the transfer blocks at the send (MPI gives no MPI_THREAD_MULTIPLE)";
  out << "\n  sync delay " << options_.sync_delay << " step(s) (the outer step lands that many steps after the send"
      << transfer << "), "
      << "mixing " << options_.mixing << " (local share kept); batch-norm statistics averaged every " << H
      << " steps (ALLREDUCE_BN_STATS); extra memory " << mb(n_ * (1 + state_copies) + largest) << " MB (theta_outer"
      << (adam ? ", Adam's two moments" : state_copies ? ", outer momentum" : "") << ", one pseudo-gradient)";
  return out.str();
}

void Diloco::send(const SyncBuffers& b, const Fragment& fr, int, int64_t step) {
  float* delta = pseudo_gradient_.data();
  backend_.subtract(fr.size(), outer_.data() + fr.begin, b.params + fr.begin, delta);
  transfer().start(delta, fr.size(), step, Phase::kCompressed);  // overlapped: runs during the next steps
}

void Diloco::apply(SyncBuffers& b, const Fragment& fr, int f) {
  float* outer = outer_.data() + fr.begin;
  outer_optimizers_[static_cast<size_t>(f)]->step(outer, pseudo_gradient_.data(), options_.outer_lr);
  // torchft's p.lerp_(local, alpha): alpha 0 takes theta_outer, 1 keeps the local parameters exactly.
  backend_.lerp(fr.size(), outer, static_cast<float>(options_.mixing), b.params + fr.begin);
}

void Diloco::save(std::ostream& out) const {
  transfer().wait();  // a fragment in flight is saved as its finished average
  write_sync_header(out, "diloco", 1);
  write_schedule(out);
  write_pod(out, options_.outer_momentum);
  write_pod(out, outer_optimizer_code(options_.outer_optimizer));
  write_pod(out, n_);
  write_outer(out);
  for (const auto& o : outer_optimizers_) o->save(out);
  write_pod(out, static_cast<int32_t>(in_flight_));
  if (in_flight_ >= 0) write_floats(out, pseudo_gradient_, fragments_[static_cast<size_t>(in_flight_)].size());
}

void Diloco::load(std::istream& in) {
  transfer().wait();  // it writes pseudo_gradient_, which the loaded state replaces
  read_sync_header(in, "diloco", 1);
  read_schedule(in, "the schedule and the outer optimizer's state");
  const auto momentum = read_pod<double>(in);
  const auto optimizer = read_pod<uint8_t>(in);
  const auto n = read_pod<int64_t>(in);
  if (!in) throw std::runtime_error("diloco state: truncated");
  const auto mismatch = [](const char* key, const std::string& saved, const std::string& now) {
    return std::runtime_error("diloco state was saved with " + std::string(key) + " = " + saved + ", this run has " +
                              now + " (the schedule and the outer optimizer's state depend on it)");
  };
  if (optimizer != outer_optimizer_code(options_.outer_optimizer))
    throw mismatch("outer_optimizer", optimizer == 1 ? "\"nesterov\"" : optimizer == 2 ? "\"adam\"" : "\"sgd\"",
                   "\"" + options_.outer_optimizer + "\"");
  if (options_.outer_optimizer != "adam" && (momentum > 0) != (options_.outer_momentum > 0))
    throw mismatch("outer_momentum", std::to_string(momentum), std::to_string(options_.outer_momentum));
  if (n != n_)
    throw std::runtime_error("diloco state holds " + std::to_string(n) + " parameters, the model has " +
                             std::to_string(n_));
  // Everything into temporaries first: a damaged state leaves this object as it was.
  const SavedOuter outer = read_outer(in);
  std::vector<std::unique_ptr<optim::Optimizer>> optimizers;
  for (const Fragment& f : fragments_) {
    optimizers.push_back(make_outer_optimizer(backend_, options_, f.size()));
    optimizers.back()->load(in);
  }
  const auto in_flight = read_pod<int32_t>(in);
  if (!in || in_flight < -1 || in_flight >= static_cast<int32_t>(fragments_.size()))
    throw std::runtime_error("diloco state: truncated or damaged (fragment in flight)");
  std::vector<float> pseudo_gradient(pseudo_gradient_.size());
  if (in_flight >= 0) {
    in.read(reinterpret_cast<char*>(pseudo_gradient.data()),
            static_cast<std::streamsize>(fragments_[static_cast<size_t>(in_flight)].size() * sizeof(float)));
    if (!in) throw std::runtime_error("diloco state: truncated pseudo-gradient in flight");
  }
  adopt_outer(outer);
  outer_optimizers_ = std::move(optimizers);
  in_flight_ = in_flight;
  models::copy_to_device(backend_, pseudo_gradient.data(), pseudo_gradient_.size(), pseudo_gradient_.data());
}

}  // namespace trainer::comm
