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
  if (!keep_residual_) ef_.clear_all();
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

std::string ErrorFeedbackSync::merge_state(const std::vector<std::istream*>& saved) {
  std::string first;
  for (size_t r = 0; r < saved.size(); ++r) {
    load_state(*saved[r]);
    std::ostringstream back;
    save_state(back);
    if (r == 0) first = back.str();
    if (back.str() != first)
      throw std::runtime_error(name() + " state of saved rank " + std::to_string(r) +
                               " differs from rank 0's, though the method keeps it equal on every rank");
  }
  std::istringstream rank0(first);
  load_state(rank0);
  return "state kept (equal on every rank)";
}

std::string ErrorFeedbackSync::load_resharded(const std::vector<std::string>& states) {
  if (states.empty()) throw std::runtime_error(name() + ": no saved state to resume from");
  std::stringstream before;
  save_state(before);
  std::vector<std::istringstream> streams;
  for (const std::string& s : states) streams.emplace_back(s);
  std::vector<std::istream*> saved;
  for (auto& s : streams) saved.push_back(&s);
  ErrorFeedback residual(ef_.size());
  std::string what;
  try {
    what = merge_state(saved);
    residual.load_mean(saved, name().c_str());
  } catch (...) {
    load_state(before);
    throw;
  }
  ef_ = std::move(residual);
  return name() + ": " + what + "; residual: the mean of the " + std::to_string(states.size()) +
         " saved ranks' (float64, rank order)";
}

}  // namespace trainer::comm
