#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/quantized_allreduce.h"
#include "comm/sync/fragments.h"
#include "comm/sync/gradient_sync.h"
#include "comm/sync/option_keys.h"
#include "comm/sync/outer_transfer.h"
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
// steps, each every H = sync.period steps):
//   1. tau = sync.sync_delay steps before its turn: the pseudo-gradient delta = theta_outer -
//      theta_local of the fragment, averaged over the ranks (ALLREDUCE_OUTER, in fp32, or through
//      the low-bit sum of comm/quantized_allreduce.h, sync.outer_dtype, then divided by P);
//   2. at its turn: the outer optimizer (SGD with Nesterov or heavy-ball momentum, PyTorch's
//      torch.optim.SGD, or Adam; optim::make_optimizer's, one per fragment, as torchft) steps
//      theta_outer with the average;
//   3. the fragment's local parameters become alpha x local + (1 - alpha) x theta_outer
//      (alpha = sync.mixing; torch.lerp's arithmetic, so 0 and 1 are exact). The tau inner steps
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
// sync.method = "diloco"'s keys; the method runs on DilocoOptions below, made from them and the
// stage's sync.bucket_mb and sync.overlap.
inline const std::vector<std::string> kOuterOptimizers = {"nesterov", "sgd", "adam"};
struct DilocoKeys {
  int64_t period = 8;
  std::string outer_optimizer = "nesterov";
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  int64_t fragments = 1;
  int64_t sync_delay = 0;
  double mixing = 0.0;
  std::string outer_dtype = "fp32";  // outer_dtype_names()

  template <class Keys>
  static void declare(Keys& k) {
    k.key("period", &DilocoKeys::period,
          "H, the inner steps between two syncs of the model (of each fragment). 8: at H = 8 with "
          "outer momentum 0.5, within 1 point of dense on the CIFAR ResNet-20 recipe at P = 4 over seeds; with "
          "H = 1 and the paper's outer momentum, diloco diverged on LAS (BENCHMARKS.md, \"Defaults that hold "
          "accuracy\").",
          at_least(1));
    k.key("outer_optimizer", &DilocoKeys::outer_optimizer,
          "the outer optimizer that steps the shared parameters with the averaged pseudo-gradient (shared - local "
          "parameters): nesterov (SGD with Nesterov momentum, the DiLoCo paper's choice) or sgd (heavy-ball "
          "momentum outer_momentum; none at 0), PyTorch's torch.optim.SGD arithmetic (sgd at lr 1 without "
          "momentum is local_sgd, bit for bit); or adam (torch.optim.Adam with betas 0.9 and 0.999 and eps 1e-8; "
          "outer_momentum does not apply). The optimizer is optim.name's own code, on the run's device.",
          kOuterOptimizers);
    k.key("outer_lr", &DilocoKeys::outer_lr, "the outer optimizer's learning rate.", open_closed(0, 1e6));
    k.key("outer_momentum", &DilocoKeys::outer_momentum,
          "the outer optimizer's momentum (nesterov needs it above 0). Unless set, 0.5 when the inner optimizer "
          "is sgd with momentum, else 0.9, the DiLoCo paper's (AdamW inner steps): over SGD momentum 0.9 the two "
          "momenta compound, and at H = 8 0.5 ended 6.7 points above 0.9 on ResNet-20 and 11 CER points on LAS "
          "(BENCHMARKS.md); a run set to 0.9 over SGD momentum prints a note at the start.",
          closed_open(0, 1));
    k.key("fragments", &DilocoKeys::fragments,
          "Streaming DiLoCo's F: the parameters are split into F fragments of whole tensors (model order, about "
          "equal sizes) that sync in turn, one every period / F steps, so each sync sends 1/F of the model "
          "(at most period fragments, and at most the model's tensors).",
          at_least(1));
    k.key("sync_delay", &DilocoKeys::sync_delay,
          "Streaming DiLoCo's tau: a fragment's pseudo-gradient is taken and sent tau steps before its outer step "
          "is applied (below period / fragments); its allreduce runs during those steps on a "
          "communication thread (sync.overlap).",
          at_least(0));
    k.key("mixing", &DilocoKeys::mixing,
          "Streaming DiLoCo's alpha: after its outer step a fragment's local parameters become alpha x local + "
          "(1 - alpha) x the new shared ones (0: take the shared ones; 1: stay local).",
          closed(0, 1));
    k.key("outer_dtype", &DilocoKeys::outer_dtype,
          "the format the pseudo-gradients cross the wire in (comm/quantized_allreduce.h): fp32 (one allreduce), "
          "or bf16 (2 bytes), fp8 (E4M3) or int8 (1 byte, plus one fp32 scale per block of 256), summed in fp32 "
          "as torchft's quantized allreduce: each rank quantizes, the chunks are exchanged all-to-all, each "
          "chunk's owner dequantizes and sums in fp32, quantizes the sum, and an allgather brings every chunk "
          "back. Each element is rounded twice whatever the number of processes: about 7% of its block's largest "
          "value for fp8, 0.8% for int8 and bf16 at worst.",
          outer_dtype_names());
  }
};

struct DilocoOptions {
  int64_t period = 1;     // H: inner steps between two syncs of one fragment
  int64_t fragments = 1;  // F
  int64_t delay = 0;      // tau, below floor(H / F)
  double mixing = 0.0;    // alpha in [0, 1]
  std::string outer_optimizer = "nesterov";  // or "sgd" (heavy-ball momentum; none at momentum 0), "adam"
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  int64_t bucket_elements = 1 << 22;  // allreduce pieces (sync.bucket_mb)
  OuterDType outer_dtype = OuterDType::kF32;  // sync.outer_dtype (comm/quantized_allreduce.h)
  bool overlap = true;  // sync.overlap: a delayed fragment's transfer runs during the tau steps
};

struct SyncOptionProblem;  // registry.h
// DiLoCo's rules between its options (the fragment schedule; nesterov needs momentum; ...), stated
// once: the config (through the method's spec) and the constructor both ask it.
std::vector<SyncOptionProblem> diloco_problems(const DilocoOptions& options);

class Diloco final : public GradientSync {
 public:
  // `views`: the model's tensors (needed for F > 1). Throws std::invalid_argument naming the key
  // for an impossible fragment count, delay, mixing or outer optimizer.
  // `backend`: where the parameters live, and with them theta_outer, the outer optimizer's state and
  // the pseudo-gradient (host or device memory; checkpoints copy through the host).
  Diloco(Communicator& comm, models::Backend& backend, int64_t n, const std::vector<models::ParamView>* views,
         const DilocoOptions& options);
  std::string name() const override { return "diloco"; }
  std::string describe() const override;
  Phase phase(int64_t) const override { return Phase::kCompressed; }
  SyncStats reduce(SyncBuffers& b, int64_t step) override;
  void after_step(SyncBuffers& b, int64_t step) override;
  // The local parameters differ between syncs (its spec: keeps_parameters_equal is false);
  // everything this method keeps (theta_outer, the outer momentum, the schedule, a fragment in
  // flight) is the same on every rank, so a resume on another number of processes keeps it and
  // takes the mean of the saved ranks' local parameters.
  void complete_in_flight() override { transfer_->wait(); }
  std::string overlap_plan() const override;
  void save(std::ostream& out) const override;
  void load(std::istream& in) override;
  std::string load_resharded(const std::vector<std::string>& states) override { return load_replicated(states); }

  // For tests: theta_outer (empty before the first step), the fragments and the inner steps taken.
  std::vector<float> outer_parameters() const;  // a host copy
  const std::vector<Fragment>& fragments() const { return fragments_; }
  int64_t inner_steps() const { return inner_steps_; }
  // Whether a delayed fragment's transfer runs during the steps after its send (outer_transfer.h).
  bool overlapped() const { return transfer_->overlapped(); }

 private:
  void start_sync(const SyncBuffers& b, int f, int64_t step);  // step 1 above
  void finish_sync(SyncBuffers& b, int f);                     // steps 2 and 3, and the BN statistics

  Communicator& comm_;
  models::Backend& backend_;
  int64_t n_;
  DilocoOptions options_;
  std::vector<Fragment> fragments_;
  FragmentSchedule schedule_;
  std::vector<std::unique_ptr<optim::Optimizer>> outer_optimizers_;  // one per fragment
  models::DeviceBuffer outer_;  // theta_outer; empty until the first step
  int64_t inner_steps_ = 0;
  int in_flight_ = -1;                 // the fragment whose average waits for its outer step
  models::DeviceBuffer pseudo_gradient_;  // its average (sized to the largest fragment)
  // The pseudo-gradient's trip over the wire (ALLREDUCE_OUTER). Declared last: destroyed first, so a
  // transfer still in flight ends before the buffer it writes goes. Behind a pointer because save()
  // (const) waits for it.
  std::unique_ptr<OuterTransfer> transfer_;
};

}  // namespace trainer::comm
