// The Chrome trace's compute phases of the steps comm.trace_steps selects (comm/chrome_trace.h), on
// the comm log's clock: each mark closes the phase that began at the previous mark (or at the
// step's start), and end_step() adds the whole step as one span.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/chrome_trace.h"
#include "comm/comm_log.h"

namespace trainer::app {

class TraceSpans {
 public:
  TraceSpans(const comm::CommLog& log, int64_t first_step, int64_t steps)
      : log_(log), first_(first_step), end_(first_step + steps) {}

  void begin_step(int64_t step) {
    step_ = step;
    step_start_ = last_mark_ = log_.now_us();
  }
  void mark(const char* name) {
    const int64_t now = log_.now_us();
    if (step_ >= first_ && step_ < end_) spans_.push_back(comm::TraceSpan{name, step_, last_mark_, now});
    last_mark_ = now;
  }
  void end_step() {
    last_mark_ = step_start_;
    mark("step");
  }
  const std::vector<comm::TraceSpan>& spans() const { return spans_; }

 private:
  const comm::CommLog& log_;
  int64_t first_, end_;
  int64_t step_ = 0, step_start_ = 0, last_mark_ = 0;
  std::vector<comm::TraceSpan> spans_;
};

}  // namespace trainer::app
