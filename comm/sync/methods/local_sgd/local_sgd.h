#pragma once

#include "comm/sync/gradient_sync.h"
#include "comm/sync/option_keys.h"
#include "models/device_buffer.h"

namespace trainer::comm {

// sync.method = "local_sgd"'s keys.
struct LocalSgdOptions {
  int64_t period = 4;
  template <class Keys>
  static void declare(Keys& k) {
    k.key("period", &LocalSgdOptions::period,
          "average parameters every N steps. 4: at 8 it ended 2.8 points below dense on the CIFAR "
          "ResNet-20 recipe at P = 4 and 2 CER points on LAS over seeds (BENCHMARKS.md, \"Defaults that hold "
          "accuracy\").",
          at_least(1));
  }
};

// Local SGD (Stich 2019; Lin et al. 2020, "Don't use large mini-batches, use local SGD"): each
// rank steps on its own gradient; after every `period`-th step the parameters, and the batch-norm
// running statistics with them, are averaged by allreduce (ALLREDUCE_PARAMS). Momentum buffers
// stay local. Communication per rank drops by the factor `period` against dense.
// The dense warmup (synchronous SGD) is the GradientSync wrapper's job.
//
// What goes on the wire is each rank's change since the last averaging, anchor - theta_r (the
// anchor: the parameters every rank held then), and the new parameters are anchor - mean(anchor -
// theta_r). That is the mean of the theta_r, computed as DiLoCo (diloco.h) computes its outer step,
// so that DiLoCo with outer SGD at lr 1 and no momentum is local SGD bit for bit; averaging
// theta_r directly rounds differently (fl(a - fl(a - b)) != b in general). The cost: the anchor,
// n floats of memory and of saved state.
class LocalSgd final : public GradientSync {
 public:
  // `backend`: where the buffers live (see DenseSync).
  LocalSgd(Communicator& comm, int64_t n, double bucket_mb, int64_t period, models::Backend& backend);
  std::string name() const override { return "local_sgd"; }
  std::string describe() const override;
  Phase phase(int64_t) const override { return Phase::kCompressed; }
  SyncStats reduce(SyncBuffers& b, int64_t step) override;
  void after_step(SyncBuffers& b, int64_t step) override;
  std::string overlap_plan() const override {
    return "none (local_sgd averages parameters after the optimizer step, so it starts after backward)";
  }
  void save(std::ostream& out) const override;
  void load(std::istream& in) override;
  std::string load_resharded(const std::vector<std::string>& states) override { return load_replicated(states); }

 private:
  Communicator& comm_;
  int64_t n_;
  int64_t bucket_elements_;
  int64_t period_;
  models::Backend& backend_;
  models::DeviceBuffer anchor_;  // empty until the first step (and with one rank, which never averages)
  models::DeviceBuffer change_;  // anchor - theta, then its average
};

}  // namespace trainer::comm
