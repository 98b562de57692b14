#include "comm/sync/methods/outer/outer_transfer.h"

#include <omp.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "models/backend.h"

namespace trainer::comm {

OuterTransfer::OuterTransfer(Communicator& comm, models::Backend& backend, OuterDType dtype, int64_t bucket_elements,
                             bool overlap)
    : comm_(comm),
      backend_(backend),
      dtype_(dtype),
      bucket_elements_(bucket_elements),
      // The thread's calls go over MPI (a device's transfer runs on a host copy): MPI must allow them.
      overlap_(overlap && comm.host_side().concurrent_calls()) {}

OuterTransfer::~OuterTransfer() {
  if (thread_.joinable()) thread_.join();
}

void OuterTransfer::average(Communicator& comm, float* data, int64_t count, bool host_copy) {
  if (dtype_ == OuterDType::kF32) {
    // allreduce_average's buckets (dense.h), its division by P below.
    for (int64_t begin = 0; begin < count; begin += bucket_elements_)
      comm.allreduce(data + begin, std::min(bucket_elements_, count - begin), DType::kF32, ReduceOp::kSum,
                     "ALLREDUCE_OUTER");
  } else if (host_copy) {
    allreduce_sum_quantized(comm, data, count, dtype_, quantized_, "ALLREDUCE_OUTER");
  } else {
    allreduce_sum_quantized(comm, backend_, data, count, dtype_, device_quantized_, "ALLREDUCE_OUTER");
  }
  const float inverse = 1.f / static_cast<float>(comm.size());
  if (!host_copy) {
    backend_.scale(count, inverse, data);
    return;
  }
  // A host copy of device data: the backend's own scale, written out (one rounded product each).
  for (int64_t i = 0; i < count; ++i) data[i] *= inverse;
}

void OuterTransfer::prepare() {
  if (overlap_ && !own_) own_ = (staged() ? comm_.host_side() : comm_).split(0, comm_.rank());
}

void OuterTransfer::start(float* data, int64_t count, int64_t step, Phase phase) {
  if (thread_.joinable()) throw std::logic_error("outer transfer: one is still in flight");
  if (staged()) {
    staging_.resize(static_cast<size_t>(count));
    models::copy_to_host(backend_, data, count, staging_.data());
    device_data_ = data;
    data = staging_.data();
  }
  if (!overlap_) {
    average(staged() ? comm_.host_side() : comm_, data, count, staged());
    finish_staged();
    return;
  }
  launch([this, data, count](Communicator& own) { average(own, data, count, staged()); },
         "diloco: the outer allreduce", step, phase);
}

void OuterTransfer::start_exchange(std::function<void(Communicator&)> exchange, std::string what, int64_t step,
                                   Phase phase) {
  if (thread_.joinable()) throw std::logic_error("outer transfer: one is still in flight");
  if (!overlap_) {
    exchange(comm_.host_side());  // host memory: a device communicator's MPI side
    return;
  }
  launch(std::move(exchange), std::move(what), step, phase);
}

void OuterTransfer::launch(std::function<void(Communicator&)> exchange, std::string what, int64_t step, Phase phase) {
  prepare();
  log_active_ = comm_.log().active();
  step_ = step;
  what_ = std::move(what);
  phase_ = phase;
  calls_.clear();
  error_ = nullptr;
  thread_ = std::thread([this, exchange = std::move(exchange)] { run(exchange); });
}

void OuterTransfer::run(const std::function<void(Communicator&)>& exchange) {
  CommLog::Deferral deferral(calls_, log_active_);
  omp_set_num_threads(1);  // this thread's loops run on it alone, beside the training thread's teams
  try {
    exchange(*own_);
  } catch (const std::exception& e) {
    error_ = std::make_exception_ptr(std::runtime_error(what_ + " started at step " + std::to_string(step_) +
                                                        " failed on its thread: " + e.what()));
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
  finish_staged();
}

void OuterTransfer::finish_staged() {
  if (!device_data_) return;
  models::copy_to_device(backend_, staging_.data(), static_cast<int64_t>(staging_.size()), device_data_);
  device_data_ = nullptr;
}

}  // namespace trainer::comm
