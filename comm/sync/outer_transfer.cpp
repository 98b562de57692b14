#include "comm/sync/outer_transfer.h"

#include <omp.h>

#include <stdexcept>
#include <string>
#include <utility>

#include "comm/sync/dense.h"
#include "models/backend.h"

namespace trainer::comm {

OuterTransfer::OuterTransfer(Communicator& comm, models::Backend& backend, OuterDType dtype, int64_t bucket_elements,
                             bool overlap)
    : comm_(comm), backend_(backend), dtype_(dtype), bucket_elements_(bucket_elements), overlap_(overlap && comm.concurrent_calls()) {}

OuterTransfer::~OuterTransfer() {
  if (thread_.joinable()) thread_.join();
}

void OuterTransfer::average(Communicator& comm, float* data, int64_t count) {
  if (dtype_ == OuterDType::kF32) {
    allreduce_average(comm, backend_, data, count, bucket_elements_, "ALLREDUCE_OUTER");
    return;
  }
  allreduce_sum_quantized(comm, data, count, dtype_, quantized_, "ALLREDUCE_OUTER");
  backend_.scale(count, 1.f / static_cast<float>(comm.size()), data);
}

void OuterTransfer::prepare() {
  if (overlap_ && !own_) own_ = comm_.split(0, comm_.rank());
}

void OuterTransfer::start(float* data, int64_t count, int64_t step, Phase phase) {
  if (thread_.joinable()) throw std::logic_error("outer transfer: one is still in flight");
  if (!overlap_) {
    average(comm_, data, count);
    return;
  }
  prepare();
  log_active_ = comm_.log().active();
  step_ = step;
  phase_ = phase;
  calls_.clear();
  error_ = nullptr;
  thread_ = std::thread([this, data, count] { run(data, count); });
}

void OuterTransfer::run(float* data, int64_t count) {
  CommLog::Deferral deferral(calls_, log_active_);
  omp_set_num_threads(1);  // this thread's loops run on it alone, beside the training thread's teams
  try {
    average(*own_, data, count);
  } catch (const std::exception& e) {
    error_ = std::make_exception_ptr(std::runtime_error(
        "diloco: the outer allreduce started at step " + std::to_string(step_) + " failed on its thread: " + e.what()));
  } catch (...) {
    error_ = std::current_exception();
  }
}

void OuterTransfer::wait() {
  if (!thread_.joinable()) return;
  thread_.join();
  // Over a communicator of every rank, as the inline transfer on the job's: part of the wait analysis.
  const bool every_rank = own_->size() == comm_.log().world_size();
  for (DeferredCall& c : calls_) c.every_rank = c.every_rank || every_rank;
  comm_.log().replay(calls_, step_, phase_);
  calls_.clear();
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

}  // namespace trainer::comm
