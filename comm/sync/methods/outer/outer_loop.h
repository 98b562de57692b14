// The outer-loop family: the methods that take local inner steps and, on Streaming DiLoCo's
// schedule, sync one fragment of the model at a time (diloco.h: DiLoCo and Streaming DiLoCo;
// sparseloco.h: SparseLoCo). What they share is written once here, as torchft's one fragment class
// serves every schedule:
//   - the schedule's keys, H = period, F = fragments and tau = sync_delay (OuterScheduleOptions),
//     the fragments of whole tensors and the inner step each one syncs at (fragments.h);
//   - theta_outer, the parameters as of the last sync, the same on every rank: rank 0's at the
//     method's first step (broadcast once, BROADCAST_OUTER);
//   - the fragment in flight: after inner step k the schedule says which fragment's exchange to
//     start (send(): its pseudo-gradient theta_outer - theta_local, in whatever form the method
//     sends it) and which fragment's outer update to apply (apply()), tau steps later; the exchange
//     runs on OuterTransfer (outer_transfer.h), inline or on its thread during those steps;
//   - batch-norm running statistics averaged with every sync of the last fragment (every H steps,
//     ALLREDUCE_BN_STATS), as local SGD averages them;
//   - the parts of the saved state they share: the schedule's keys (checked on load) and the inner
//     step count with theta_outer (write_schedule, read_schedule; write_outer, read_outer).
// Each method is its exchange and its outer update (send, apply), and its own state around them.
#pragma once

#include <cstdint>
#include <istream>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "comm/quantized_allreduce.h"
#include "comm/sync/methods/outer/fragments.h"
#include "comm/sync/gradient_sync.h"
#include "comm/sync/methods/outer/outer_transfer.h"
#include "models/device_buffer.h"

namespace trainer::comm {

// The schedule's keys, in each outer-loop method's own table (option_keys.h): its options struct
// derives from this one.
struct OuterScheduleOptions {
  int64_t period = 8;      // H
  int64_t fragments = 1;   // F
  int64_t sync_delay = 0;  // tau

  template <class Keys>
  static void declare(Keys& k) {
    k.key("period", &OuterScheduleOptions::period,
          "H, the inner steps between two syncs of the model (of each fragment). 8: DiLoCo at H = 8 with outer "
          "momentum 0.5 ended within 1 point of dense on the CIFAR ResNet-20 recipe at P = 4 over seeds; with H = 1 "
          "and the paper's outer momentum it diverged on LAS (BENCHMARKS.md, \"Defaults that hold accuracy\").",
          at_least(1));
    k.key("fragments", &OuterScheduleOptions::fragments,
          "Streaming DiLoCo's F: the parameters are split into F fragments of whole tensors (model order, about "
          "equal sizes) that sync in turn, one every period / F steps, so each sync sends 1/F of the model (at "
          "most period fragments, and at most the model's tensors).",
          at_least(1));
    k.key("sync_delay", &OuterScheduleOptions::sync_delay,
          "Streaming DiLoCo's tau: a fragment's pseudo-gradient is taken and sent tau steps before its outer step "
          "is applied (below period / fragments); its exchange runs during those steps on a communication thread "
          "(sync.overlap).",
          at_least(0));
  }
};

class OuterLoop : public GradientSync {
 public:
  Phase phase(int64_t) const override { return Phase::kCompressed; }
  // theta_outer at the first step (rank 0's), then nothing: the method's work is in after_step.
  SyncStats reduce(SyncBuffers& b, int64_t step) override;
  // After the optimizer's inner step: the schedule's send and outer update, and the BN statistics.
  void after_step(SyncBuffers& b, int64_t step) override;
  void complete_in_flight() override { transfer_->wait(); }
  std::string overlap_plan() const override;

  // For tests: theta_outer (a host copy; empty before the first step), the fragments, the inner
  // steps taken, and whether a delayed fragment's exchange runs during the steps after its send.
  std::vector<float> outer_parameters() const { return models::host_copy(outer_); }
  const std::vector<Fragment>& fragments() const { return fragments_; }
  int64_t inner_steps() const { return inner_steps_; }
  bool overlapped() const { return transfer_->overlapped(); }

 protected:
  // `wire`: the format OuterTransfer's average sends (diloco's outer_dtype; an exchange of the
  // method's own, as sparseloco's allgather, ignores it). Throws std::invalid_argument naming the
  // key for an impossible schedule.
  OuterLoop(Communicator& comm, models::Backend& backend, int64_t n, const std::vector<models::ParamView>* views,
            const OuterScheduleOptions& schedule, int64_t bucket_elements, OuterDType wire, bool overlap);
  // A method's destructor calls it first: it ends an exchange in flight (OuterTransfer's destructor
  // waits for it) before the method's own buffers that the exchange writes go.
  void end_transfer() { transfer_.reset(); }

  // Fragment f's exchange, after inner step `step`: its pseudo-gradient from theta_outer and
  // b.params, sent on transfer(). Its outer update when the exchange is done: theta_outer's fragment
  // stepped with what came back, and the fragment of b.params set from it.
  virtual void send(const SyncBuffers& b, const Fragment& fragment, int f, int64_t step) = 0;
  virtual void apply(SyncBuffers& b, const Fragment& fragment, int f) = 0;
  // Called once theta_outer exists (the first step): the method's other state starts.
  virtual void start_outer() {}
  // What the exchange is, for overlap_plan: "allreduce", "allgather".
  virtual const char* exchange() const = 0;

  // The saved state's shared parts, each in its place in the method's format: the schedule's keys
  // (H, F, tau), and the inner step count with theta_outer. read_schedule throws std::runtime_error
  // naming the key that differs from this run's; `depends` says what depends on it.
  void write_schedule(std::ostream& out) const;
  void read_schedule(std::istream& in, const std::string& depends) const;
  void write_outer(std::ostream& out) const;
  struct SavedOuter {
    int64_t inner_steps = 0;
    std::vector<float> outer;  // empty before the first step
  };
  SavedOuter read_outer(std::istream& in) const;  // truncated: std::runtime_error
  void adopt_outer(const SavedOuter& saved);

  OuterTransfer& transfer() const { return *transfer_; }

  Communicator& comm_;
  models::Backend& backend_;
  const int64_t n_;
  const OuterScheduleOptions schedule_options_;
  const int64_t bucket_elements_;  // the BN statistics' allreduce pieces (sync.bucket_mb)
  const std::vector<Fragment> fragments_;
  models::DeviceBuffer outer_;  // theta_outer; empty until the first step
  int64_t inner_steps_ = 0;
  int in_flight_ = -1;  // the fragment whose exchange waits for its outer update

 private:
  const FragmentSchedule schedule_;
  // Behind a pointer: save() (const) waits for it, and a method's destructor ends it first.
  std::unique_ptr<OuterTransfer> transfer_;
};

}  // namespace trainer::comm
