// What the training ranks measure between two metrics records (train.log_every_steps): the mean
// loss, the time split (data, compute, sync, optimizer), bytes, density, skipped steps and
// async_ps's staleness. Rank 0 turns an interval into the progress line and one metrics.jsonl
// record; every rank starts a new interval at the same steps.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "comm/sync/gradient_sync.h"
#include "trainer/metrics.h"
#include "trainer/step/step_clock.h"

namespace trainer::app {

// Milliseconds of one interval, by stage.
struct StepTimes {
  double data = 0, compute = 0, sync = 0, optim = 0;
  double busy() const { return data + compute + sync + optim; }
};

// One step as the metrics see it.
struct StepRecord {
  double loss = 0;
  int64_t samples = 0, correct = 0;
  bool applied = false;    // false: skipped (non-finite)
  comm::SyncStats stats;   // the sync's report (meaningful when applied)
  double lr = 0;           // the trainer's schedule at this step
  int64_t sent = 0, received = 0;  // bytes this rank moved in the step
};

// The fixed facts of the run that the lines and records are made of.
struct RunFrame {
  int64_t first_step = 0, total_steps = 0, steps_per_epoch = 1;
  bool classifies = false;
  std::chrono::steady_clock::time_point run_start, train_start;
};

class IntervalMetrics {
 public:
  // writer: rank 0's metrics.jsonl (null on other ranks); progress: rank 0's output.
  IntervalMetrics(const RunFrame& frame, const StepClock& clock, MetricsWriter* writer, Progress* progress);

  StepTimes& times() { return times_; }
  // After each step: adds it, updates the progress line and, at the log cadence or the end
  // (`log_now`), writes the record and starts a new interval.
  void close_step(const StepRecord& step, const StepPosition& at, bool log_now);

 private:
  void report(const StepRecord& last, const StepPosition& at, bool log_now);
  void reset(int64_t global);

  RunFrame frame_;
  const StepClock& clock_;
  MetricsWriter* writer_;
  Progress* progress_;
  StepTimes times_;
  double loss_sum_ = 0, density_sum_ = 0, tau_sum_ = 0, low_sum_ = 0;
  int64_t low_steps_ = 0;
  double density_target_ = -1;  // the last applied step's SyncStats::density_target
  int64_t steps_ = 0, samples_ = 0, correct_ = 0, skipped_ = 0, sent_ = 0, received_ = 0, tau_max_ = -1;
  comm::Phase phase_ = comm::Phase::kDense;  // of the last applied step (kept across intervals)
  std::chrono::steady_clock::time_point start_;
  int64_t first_global_ = 0;
};

}  // namespace trainer::app
