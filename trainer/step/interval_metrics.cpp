#include "trainer/step/interval_metrics.h"

#include <algorithm>
#include <cstdio>

namespace trainer::app {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string fmt_progress(int64_t global, int64_t total, int64_t epoch, double loss, double lr, double rate,
                         double sync_share, const std::string& eta) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "step %lld/%lld  epoch %lld  loss %.4f  lr %.4g  %.0f samples/s  sync %.0f%%  ETA %s",
                static_cast<long long>(global), static_cast<long long>(total), static_cast<long long>(epoch), loss, lr,
                rate, sync_share, eta.c_str());
  return buf;
}

}  // namespace

IntervalMetrics::IntervalMetrics(const RunFrame& frame, const StepClock& clock, MetricsWriter* writer,
                                 Progress* progress)
    : frame_(frame), clock_(clock), writer_(writer), progress_(progress) {
  reset(frame.first_step);
  start_ = frame.train_start;
}

void IntervalMetrics::close_step(const StepRecord& step, const StepPosition& at, bool log_now) {
  sent_ += step.sent;
  received_ += step.received;
  if (step.applied) {
    phase_ = step.stats.phase;
    density_sum_ += step.stats.density;
    loss_sum_ += step.loss;
    steps_ += 1;
    samples_ += step.samples;
    correct_ += step.correct;
    if (step.stats.density_target >= 0) density_target_ = step.stats.density_target;
    if (step.stats.low_compression >= 0) {
      low_sum_ += step.stats.low_compression;
      low_steps_ += 1;
    }
    if (step.stats.staleness >= 0) {
      tau_sum_ += static_cast<double>(step.stats.staleness);
      tau_max_ = std::max(tau_max_, step.stats.staleness);
    }
  } else {
    skipped_ += 1;
  }
  if (writer_) report(step, at, log_now);
  if (log_now) reset(at.global);
}

void IntervalMetrics::report(const StepRecord& last, const StepPosition& at, bool log_now) {
  const int64_t epoch = (at.global - 1) / frame_.steps_per_epoch;
  const double rate = clock_.job_samples(samples_, at.global - first_global_) / std::max(seconds_since(start_), 1e-9);
  const double shown_lr = last.stats.lr >= 0 ? last.stats.lr : last.lr;  // async_ps: the servers' lr
  const double elapsed = seconds_since(frame_.train_start);
  const double busy = times_.busy();
  const double eta = elapsed / std::max<int64_t>(at.global - frame_.first_step, 1) *
                     static_cast<double>(frame_.total_steps - at.global);
  progress_->step(fmt_progress(at.global, frame_.total_steps, epoch, loss_sum_ / std::max<int64_t>(steps_, 1),
                               shown_lr, rate, busy > 0 ? 100 * times_.sync / busy : 0.0, format_duration(eta)),
                  log_now);
  if (!log_now) return;
  const double k = 1.0 / std::max<int64_t>(steps_, 1);
  nlohmann::json record{{"step", at.global},
                        {"epoch", epoch},
                        {"time_s", seconds_since(frame_.run_start)},
                        {"loss", loss_sum_ * k},
                        {"lr", last.lr},
                        {"samples_per_s", rate},
                        {"t_data_ms", times_.data * k},
                        {"t_compute_ms", times_.compute * k},
                        {"t_sync_ms", times_.sync * k},
                        {"t_optim_ms", times_.optim * k},
                        {"bytes_sent", static_cast<double>(sent_) * k},
                        {"bytes_recv", static_cast<double>(received_) * k},
                        {"density", density_sum_ * k},
                        {"phase", comm::phase_name(phase_)}};
  if (frame_.classifies) record["train_accuracy"] = static_cast<double>(correct_) / std::max<int64_t>(samples_, 1);
  if (skipped_ > 0) record["skipped_steps"] = skipped_;
  // sync.<method>.adaptive: the share of the compressed entries sent at the low-compression setting, mean over
  // the interval's adaptive steps (comm/sync/wrappers/accordion.h)
  if (low_steps_ > 0) record["low_compression"] = low_sum_ / static_cast<double>(low_steps_);
  // sync.<method>.density_warmup_*: the density the sparse selection aimed at in the interval's last step
  if (density_target_ >= 0) record["density_target"] = density_target_;
  if (tau_max_ >= 0) {  // async_ps: rank 0's gradients' staleness at the servers, and their lr
    record["staleness_mean"] = tau_sum_ * k;
    record["staleness_max"] = tau_max_;
    record["lr"] = last.stats.lr;
  }
  writer_->write(record);
}

void IntervalMetrics::reset(int64_t global) {
  times_ = StepTimes{};
  loss_sum_ = density_sum_ = tau_sum_ = low_sum_ = 0;
  low_steps_ = 0;
  density_target_ = -1;
  steps_ = samples_ = correct_ = skipped_ = sent_ = received_ = 0;
  tau_max_ = -1;
  start_ = Clock::now();
  first_global_ = global;
}

}  // namespace trainer::app
