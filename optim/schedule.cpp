#include "optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace trainer::optim {

ScheduleKind schedule_kind_from_name(const std::string& name) {
  if (name == "constant") return ScheduleKind::kConstant;
  if (name == "multistep") return ScheduleKind::kMultiStep;
  if (name == "cosine") return ScheduleKind::kCosine;
  if (name == "exponential") return ScheduleKind::kExponential;
  throw std::invalid_argument("unknown learning-rate schedule '" + name + "'");
}

double learning_rate(const ScheduleOptions& o, int64_t step, int64_t steps_per_epoch,
                     int64_t total_steps) {
  if (steps_per_epoch <= 0) throw std::invalid_argument("learning_rate: steps_per_epoch must be > 0");
  const int64_t epoch = step / steps_per_epoch;
  double lr = o.base_lr;
  switch (o.kind) {
    case ScheduleKind::kConstant:
      break;
    case ScheduleKind::kMultiStep: {
      // Milestones passed so far; a repeated milestone counts twice, as in MultiStepLR's Counter.
      const auto passed = std::count_if(o.milestones.begin(), o.milestones.end(),
                                        [epoch](int64_t m) { return m <= epoch; });
      lr = o.base_lr * std::pow(o.gamma, static_cast<double>(passed));
      break;
    }
    case ScheduleKind::kCosine: {
      if (total_steps <= 0) throw std::invalid_argument("learning_rate: cosine needs total_steps > 0");
      const double t = static_cast<double>(std::min(step, total_steps)) / static_cast<double>(total_steps);
      lr = o.min_lr + (o.base_lr - o.min_lr) * 0.5 * (1.0 + std::cos(M_PI * t));
      break;
    }
    case ScheduleKind::kExponential:
      lr = o.base_lr * std::pow(o.gamma, static_cast<double>(epoch));
      break;
  }
  if (step < o.warmup_steps)
    lr *= static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps);
  return lr;
}

}  // namespace trainer::optim
