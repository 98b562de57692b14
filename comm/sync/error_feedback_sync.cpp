#include "comm/sync/error_feedback_sync.h"

#include <sstream>
#include <stdexcept>
#include <string>

namespace trainer::comm {

SyncStats ErrorFeedbackSync::reduce(SyncBuffers& b, int64_t step) {
  if (b.n != ef_.size())
    throw std::invalid_argument(name() + ": gradient of " + std::to_string(b.n) + " entries, the method was built for " +
                                std::to_string(ef_.size()));
  ErrorFeedback::Step feedback(ef_, b.grads);
  const SyncStats stats = compress(b, step, feedback);
  if (!feedback.formed()) throw std::logic_error(name() + ": a compressed step that never formed acc = grad + residual");
  return stats;
}

void ErrorFeedbackSync::save(std::ostream& out) const {
  save_state(out);
  ef_.save(out);
}

void ErrorFeedbackSync::load(std::istream& in) {
  std::stringstream before;  // the compressor's state is small (no residual): kept to roll back
  save_state(before);
  ErrorFeedback residual(ef_.size());
  try {
    load_state(in);
    residual.load(in, name().c_str());
  } catch (...) {
    load_state(before);
    throw;
  }
  ef_ = std::move(residual);
}

}  // namespace trainer::comm
