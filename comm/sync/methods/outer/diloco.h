#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/quantized_allreduce.h"
#include "comm/sync/option_keys.h"
#include "comm/sync/methods/outer/outer_loop.h"
#include "models/device_buffer.h"
#include "optim/optimizer.h"

namespace trainer::comm {

// DiLoCo (Douillard et al. 2023, arXiv 2311.08105) and Streaming DiLoCo (Douillard et al. 2025,
// arXiv 2501.18512), with the semantics of torchft's DiLoCo class (torchft/local_sgd.py:
// sync_every, fragment_sync_delay, fragment_update_alpha), whose recorded values
// tests/diloco_test.cpp reproduces.
//
// Every rank takes inner steps with the config's optimizer on its own data (its optimizer state
// stays local). The ranks also hold theta_outer, the parameters as of the last sync, the same on
// every rank. A sync of fragment f (fragments.h: F groups of whole tensors, taking turns every H/F
// steps, each every H = sync.diloco.period steps):
//   1. tau = sync.diloco.sync_delay steps before its turn: the pseudo-gradient delta = theta_outer -
//      theta_local of the fragment, averaged over the ranks (ALLREDUCE_OUTER, in fp32, or through
//      the low-bit sum of comm/quantized_allreduce.h, sync.diloco.outer_dtype, then divided by P);
//   2. at its turn: the outer optimizer (SGD with Nesterov or heavy-ball momentum, PyTorch's
//      torch.optim.SGD, or Adam; optim::make_optimizer's, one per fragment, as torchft) steps
//      theta_outer with the average;
//   3. the fragment's local parameters become alpha x local + (1 - alpha) x theta_outer
//      (alpha = sync.diloco.mixing; torch.lerp's arithmetic, so 0 and 1 are exact). The tau inner steps
//      taken since step 1 count only through alpha (torchft likewise).
// Batch-norm running statistics are averaged (ALLREDUCE_BN_STATS) with every sync of the last
// fragment, i.e. every H steps, as local SGD averages them. Everything but the local parameters
// is the same on every rank.
//
// One fragment, outer SGD at lr 1 without momentum, is local SGD, bit for bit (local_sgd.h
// averages the change since its last averaging for that reason; tests/diloco_test.cpp).
//
// Communication: every H/F steps one fragment of ~4n/F bytes is allreduced, so the average per
// step is 4n/H bytes whatever F, and the largest single sync F times smaller than DiLoCo's.
// Memory: theta_outer (n floats), the outer momentum (n floats; none without momentum; Adam: 2n) and one
// fragment's pseudo-gradient. The dense warmup is the factory's wrapper; the inner steps are
// counted from this method's first step (steps the non-finite guard skipped do not count).
//
// The delay: with tau > 0 the pseudo-gradient's allreduce starts at step 1 and runs on a
// communication thread of its own while the next tau inner steps compute (outer_transfer.h: its
// own communicator, MPI_THREAD_MULTIPLE, the comm log's records deferred); step 2 waits for it. The
// same calls on the same data, so the same values as a blocking allreduce at step 1 (torchft's
// recorded ones: tests/diloco_test.cpp runs them overlapped). Inline instead with sync.overlap =
// false, or when MPI gives no MPI_THREAD_MULTIPLE; with tau = 0 there is nothing to overlap.
// The pseudo-gradient buffer belongs to the transfer until step 2: nothing else touches it.
//
// A transfer in flight, at the points that need its result before the schedule does: save() (a
// checkpoint) and complete_in_flight() (the end of the run, a stop) wait for it to finish, so the
// checkpoint holds the averaged pseudo-gradient exactly as before and resumes bit for bit; the run's
// end finishes it on every rank (its bytes are in the comm log) and drops its outer step, as the
// blocking version did (it is in the last checkpoint, for a resume with more steps). A step the
// non-finite guard skips leaves the transfer running (its inner step does not count, so the outer
// step moves one step later, as before). An error on the thread comes back from step 2 (or from
// whatever waits) on the training thread.
//
// Saved state: the schedule's keys (checked on load), the inner step count, theta_outer, each
// fragment's outer optimizer, and a fragment in flight (its averaged pseudo-gradient), so a
// checkpoint inside a delay resumes exactly.
// sync.method = "diloco"'s keys: the schedule's (outer_loop.h) and its outer optimizer's.
inline const std::vector<std::string> kOuterOptimizers = {"nesterov", "sgd", "adam"};
struct DilocoOptions : OuterScheduleOptions {
  std::string outer_optimizer = "nesterov";  // or "sgd" (heavy-ball momentum; none at momentum 0), "adam"
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  double mixing = 0.0;               // alpha in [0, 1]
  std::string outer_dtype = "fp32";  // outer_dtype_names()

  template <class Keys>
  static void declare(Keys& k) {
    OuterScheduleOptions::declare(k);
    k.key("outer_optimizer", &DilocoOptions::outer_optimizer,
          "the outer optimizer that steps the shared parameters with the averaged pseudo-gradient (shared - local "
          "parameters): nesterov (SGD with Nesterov momentum, the DiLoCo paper's choice) or sgd (heavy-ball "
          "momentum outer_momentum; none at 0), PyTorch's torch.optim.SGD arithmetic (sgd at lr 1 without "
          "momentum is local_sgd, bit for bit); or adam (torch.optim.Adam with betas 0.9 and 0.999 and eps 1e-8; "
          "outer_momentum does not apply). The optimizer is optim.name's own code, on the run's device.",
          kOuterOptimizers);
    k.key("outer_lr", &DilocoOptions::outer_lr, "the outer optimizer's learning rate.", open_closed(0, 1e6));
    k.key("outer_momentum", &DilocoOptions::outer_momentum,
          "the outer optimizer's momentum (nesterov needs it above 0). Unless set, 0.5 when the inner optimizer "
          "is sgd with momentum, else 0.9, the DiLoCo paper's (AdamW inner steps): over SGD momentum 0.9 the two "
          "momenta compound, and at H = 8 0.5 ended 6.7 points above 0.9 on ResNet-20 and 11 CER points on LAS "
          "(BENCHMARKS.md); a run set to 0.9 over SGD momentum prints a note at the start.",
          closed_open(0, 1));
    k.key("mixing", &DilocoOptions::mixing,
          "Streaming DiLoCo's alpha: after its outer step a fragment's local parameters become alpha x local + "
          "(1 - alpha) x the new shared ones (0: take the shared ones; 1: stay local).",
          closed(0, 1));
    k.key("outer_dtype", &DilocoOptions::outer_dtype,
          "the format the pseudo-gradients cross the wire in (comm/quantized_allreduce.h): fp32 (one allreduce), "
          "or bf16 (2 bytes), fp8 (E4M3) or int8 (1 byte, plus one fp32 scale per block of 256), summed in fp32 "
          "as torchft's quantized allreduce: each rank quantizes, the chunks are exchanged all-to-all, each "
          "chunk's owner dequantizes and sums in fp32, quantizes the sum, and an allgather brings every chunk "
          "back. Each element is rounded twice whatever the number of processes: about 7% of its block's largest "
          "value for fp8, 0.8% for int8 and bf16 at worst.",
          outer_dtype_names());
  }
};


struct SyncOptionProblem;  // registry.h
// DiLoCo's rules between its options (the fragment schedule; nesterov needs momentum; ...), stated
// once and asked through the method's spec (the config at load, make_gradient_sync before it builds).
std::vector<SyncOptionProblem> diloco_problems(const DilocoOptions& options);

class Diloco final : public OuterLoop {
 public:
  // `views`: the model's tensors (needed for F > 1). `options` pass diloco_problems
  // (make_gradient_sync asks them); the fragment schedule still refuses an impossible one.
  // `backend`: where the parameters live, and with them theta_outer, the outer optimizer's state and
  // the pseudo-gradient (host or device memory; checkpoints copy through the host).
  // `bucket_elements`: the BN statistics' and the fp32 average's allreduce pieces (sync.bucket_mb);
  // `overlap`: a delayed fragment's transfer runs during the tau steps (sync.overlap).
  Diloco(Communicator& comm, models::Backend& backend, int64_t n, const std::vector<models::ParamView>* views,
         const DilocoOptions& options, int64_t bucket_elements, bool overlap);
  ~Diloco() override { end_transfer(); }
  std::string name() const override { return "diloco"; }
  std::string describe() const override;
  // The local parameters differ between syncs (its spec: keeps_parameters_equal is false);
  // everything this method keeps (theta_outer, the outer momentum, the schedule, a fragment in
  // flight) is the same on every rank, so a resume on another number of processes keeps it and
  // takes the mean of the saved ranks' local parameters.
  void save(std::ostream& out) const override;
  void load(std::istream& in) override;
  std::string load_resharded(const std::vector<std::string>& states) override { return load_replicated(states); }

 private:
  // Step 1 above: the fragment's pseudo-gradient, its average started. Steps 2 and 3.
  void send(const SyncBuffers& b, const Fragment& fragment, int f, int64_t step) override;
  void apply(SyncBuffers& b, const Fragment& fragment, int f) override;
  const char* exchange() const override { return "allreduce"; }

  const DilocoOptions options_;
  const OuterDType wire_;  // outer_dtype
  const bool overlap_;     // sync.overlap
  std::vector<std::unique_ptr<optim::Optimizer>> outer_optimizers_;  // one per fragment
  // The fragment in flight's pseudo-gradient, then its average (sized to the largest fragment). The
  // transfer writes it: ~Diloco ends the transfer before it goes.
  models::DeviceBuffer pseudo_gradient_;
};

}  // namespace trainer::comm
