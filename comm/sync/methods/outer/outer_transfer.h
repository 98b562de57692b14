// DiLoCo's pseudo-gradient crossing the wire (comm/sync/methods/outer/diloco.h; ALLREDUCE_OUTER): its average
// over the ranks, in fp32 (allreduce_average) or through the low-bit sum of sync.diloco.outer_dtype
// (allreduce_sum_quantized, then / P), either on the calling thread or overlapped with the inner
// steps that follow (Streaming DiLoCo's delay tau: the average is needed only tau steps later).
// SparseLoCo's allgather of its compressed fragments (comm/sync/methods/outer/sparseloco.h) runs the same way
// through start_exchange().
//
// Overlapped: the transfer runs on a thread of its own, over a communicator of its own (split from
// the method's, prepare()), while
// the training thread goes on with its steps and their MPI calls (the step's verdict, a dense
// warmup's buckets, evaluation) on the other communicator. Two threads calling MPI at once need
// MPI_THREAD_MULTIPLE (Communicator::concurrent_calls; the trainer asks for it in such runs,
// request_concurrent_calls); without it the transfer runs inline, as it does for tau = 0 (nothing to
// overlap) and with sync.overlap = false.
//
// Why a thread and not a nonblocking MPI_Iallreduce progressed by the step's own MPI calls: Open MPI
// moves a nonblocking collective only inside MPI calls, and a training step makes a handful of small
// ones (the verdict's allreduce), so a fragment of hundreds of kB would mostly move inside the final
// wait; the low-bit sum would also need Ialltoall and Iallgather chained by hand, and the NCCL and
// staged communicators an Iallreduce of their own. A thread needs none of it and moves the data
// while the step computes. Its loops (the division by P, the low-bit sum's conversions) run on that
// thread alone, so it takes no cores from the compute but the progress engine's (Open MPI yields
// when a poll finds nothing: mpi_communicator.cpp).
//
// Same values either way: the same calls on the same data in the same order; only the thread differs.
//
// The comm log: the thread records nothing into it (CommLog::Deferral); wait() replays its calls
// there, labelled with the step the transfer started in and with their true start and end times.
// The replay happens where every rank calls wait() (the outer step, a checkpoint, the end), so the
// collectives keep one order on every rank; metrics.jsonl's bytes_sent counts the transfer at that
// step. A transfer over a communicator that holds every rank of the job counts as a collective of
// all ranks for the wait analysis, as the inline one does.
//
// Errors: an exception on the thread is kept and rethrown by wait() on the training thread (the
// trainer then ends the job on every rank, main.cpp). The destructor waits for a transfer in flight
// without rethrowing: every rank started the transfer at the same step and every rank's thread
// carries it on whatever its training thread does, so it completes (or MPI ends the job).
//
// Device buffers (runtime.device = "cuda"): an inline transfer averages the data where it lies,
// over the method's communicator (NCCL, or MPI staged by the communicator), the low-bit codec as
// the backend's ops (Backend::quantize_blocks etc.: CUDA kernels, the CPU's bytes). An overlapped
// transfer runs on a host copy instead (staged below): start() copies the fragment's
// pseudo-gradient to host memory on the training thread, the host code above runs on it over the
// communicator's MPI side (Communicator::host_side), and wait() copies the average back.
// Why a host copy for the thread: a collective enqueued on the device's one stream from a second
// thread would interleave with the training thread's own collectives in a different order on each
// rank (NCCL then deadlocks), and MPI on host memory needs no stream at all. The copy is one
// fragment each way every H / F steps. Same values as on the CPU: the same host code on the same
// floats.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm_log.h"
#include "comm/communicator.h"
#include "comm/quantized_allreduce.h"
#include "models/backend.h"

namespace trainer::comm {

class OuterTransfer {
 public:
  // `overlap`: run transfers on a thread of their own when `comm` allows concurrent calls.
  // `backend`: where the data averaged lives (host or device memory; see above).
  OuterTransfer(Communicator& comm, models::Backend& backend, OuterDType dtype, int64_t bucket_elements, bool overlap);
  ~OuterTransfer();
  OuterTransfer(const OuterTransfer&) = delete;
  OuterTransfer& operator=(const OuterTransfer&) = delete;

  // Whether start() returns before the average is done.
  bool overlapped() const { return overlap_; }
  // Collective, once (later calls do nothing): makes the overlapped transfers' communicator. Every
  // rank calls it at the same point before the first start() (Diloco: in its first reduce(); not in
  // the constructor, since --dry-run builds the method on rank 0 alone), so that start() itself
  // makes no call on the training thread's communicator.
  void prepare();
  // data[0, count) <- its average over the ranks. Overlapped: returns at once, and `data` belongs to
  // the transfer until wait(); otherwise returns with the average. `step`, `phase`: the comm log's
  // labels of its calls. Collective; one transfer at a time.
  void start(float* data, int64_t count, int64_t step, Phase phase);
  // Another exchange than the average, run the same way (its thread and communicator, its calls
  // deferred into the comm log, its error rethrown by wait()): `exchange` makes its collective calls
  // over the communicator it is given, on host memory only (sparseloco's allgather of its compressed
  // fragments, sparseloco.h). `what` names it in an error ("sparseloco: the outer allgather").
  void start_exchange(std::function<void(Communicator&)> exchange, std::string what, int64_t step, Phase phase);
  // Completes the transfer in flight, if any: logs its calls and rethrows its error.
  void wait();
  bool in_flight() const { return thread_.joinable(); }

 private:
  // The calls themselves: data <- the sum over `comm`'s ranks, then / P, in the backend's memory or
  // (`host_copy`) in a host copy of device data.
  void average(Communicator& comm, float* data, int64_t count, bool host_copy);
  void launch(std::function<void(Communicator&)> exchange, std::string what, int64_t step, Phase phase);
  void run(const std::function<void(Communicator&)>& exchange);  // the thread's body
  void finish_staged();                   // copies a staged average back to the device
  // Whether transfers run on a host copy of device data (see above).
  bool staged() const { return !backend_.is_host() && overlap_; }

  Communicator& comm_;
  models::Backend& backend_;
  OuterDType dtype_;
  int64_t bucket_elements_;
  bool overlap_;
  std::unique_ptr<Communicator> own_;  // overlapped transfers' communicator
  QuantizedScratch quantized_;               // the low-bit sum's buffers on a host copy
  DeviceQuantizedScratch device_quantized_;  // and in the backend's memory (inline transfers)
  std::vector<float> staging_;         // staged(): the host copy of the data in flight
  float* device_data_ = nullptr;       // staged(): where wait() copies the average back to

  // One transfer in flight: its thread, and what the thread leaves for wait().
  std::thread thread_;
  bool log_active_ = false;  // the log's state when it started
  int64_t step_ = 0;
  std::string what_;  // the exchange's name for its error
  Phase phase_ = Phase::kCompressed;
  std::vector<DeferredCall> calls_;
  std::exception_ptr error_;
};

}  // namespace trainer::comm
