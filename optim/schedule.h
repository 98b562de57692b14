// Learning-rate schedules: the learning rate is a pure function of the step, so a resumed run gets
// the same rate without saving scheduler state.
//
// Epoch-based kinds (multistep, exponential) use the integer epoch = step / steps_per_epoch, so the
// rate changes at epoch boundaries exactly like PyTorch's MultiStepLR / ExponentialLR stepped once
// per epoch. Cosine is per step, like CosineAnnealingLR stepped once per step with
// T_max = total_steps; past total_steps it stays at min_lr (PyTorch would rise again).
//
// Linear warmup composes with every kind: for step < warmup_steps the scheduled rate is multiplied
// by (step + 1) / warmup_steps, so the first step is not taken with a zero rate and the last warmup
// step reaches the scheduled value.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainer::optim {

enum class ScheduleKind { kConstant, kMultiStep, kCosine, kExponential };

// "constant", "multistep", "cosine", "exponential" (the names the experiment file uses). Throws
// std::invalid_argument for any other name.
ScheduleKind schedule_kind_from_name(const std::string& name);

struct ScheduleOptions {
  ScheduleKind kind = ScheduleKind::kConstant;
  double base_lr = 0.1;
  std::vector<int64_t> milestones;  // multistep: epochs at which the rate is multiplied by gamma
  double gamma = 0.1;               // multistep: factor per milestone; exponential: factor per epoch
  double min_lr = 0.0;              // cosine: the rate reached at total_steps
  int64_t warmup_steps = 0;         // 0: no warmup
};

// The rate for the 0-based optimizer step `step`. steps_per_epoch must be > 0; total_steps must be
// > 0 for cosine (unused otherwise). Throws std::invalid_argument when they are not.
double learning_rate(const ScheduleOptions& options, int64_t step, int64_t steps_per_epoch,
                     int64_t total_steps);

}  // namespace trainer::optim
