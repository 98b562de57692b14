// The what-if model of a step whose dense buckets went out during backward (sync.overlap): the
// comm log gives, per logged step, the FORWARD_BACKWARD interval and each bucket's ready time, size
// and call interval. The step's shape is kept (per bucket: when backward made it ready, from the
// start of forward, and its size, medians over steps; backward's length), and on another network
// the buckets are laid along that timeline: bucket k starts at max(its ready time, bucket k-1's
// end) and lasts the model's cost of its allreduce; what is exposed is the last bucket's end past
// backward's end. The step's other calls (the control allreduce, a method's own) follow after it,
// one after another, as before.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "comm/network_model.h"

namespace trainer::app {

struct OverlappedBucket {
  double ready_ms = 0;  // after the start of the step's forward pass
  double size = 0;      // bytes (allreduce data size S)
};

struct OverlapMeasurement {
  std::vector<OverlappedBucket> buckets;  // in the order they went out; empty: nothing overlapped
  double backward_ms = 0;  // forward and backward (FORWARD_BACKWARD), median
  double exposed_ms = 0;   // the union of the step's calls after backward ended, median
  double wait_after_ms = 0;  // wait_us of the calls that started after backward, median
};

// Rank 0's records of one phase, step by step, as measure_run reads them.
class OverlapLog {
 public:
  void add_compute(int64_t step, int64_t t0, int64_t t1) { steps_[step].compute = {t0, t1}; }
  // ready_us < 0: not an overlapped bucket (a call after backward).
  void add_call(int64_t step, int64_t t0, int64_t t1, int64_t ready_us, double size, int64_t wait_us) {
    steps_[step].calls.push_back({t0, t1, ready_us, size, wait_us});
  }
  // Medians over the steps that have a FORWARD_BACKWARD record; no buckets when none was overlapped.
  OverlapMeasurement measure() const;

 private:
  struct Call {
    int64_t t0, t1, ready;
    double size;
    int64_t wait;
  };
  struct Step {
    std::pair<int64_t, int64_t> compute{-1, -1};
    std::vector<Call> calls;
  };
  std::map<int64_t, Step> steps_;
};

// The median (the mean of the middle two for an even count; 0 for none).
double median(std::vector<double> v);

// Seconds of communication the buckets leave exposed after backward on `rates` with `ranks` ranks.
double exposed_bucket_seconds(const OverlapMeasurement& overlap, const comm::NetworkRates& rates, int ranks);

}  // namespace trainer::app
