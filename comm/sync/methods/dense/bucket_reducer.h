// Runs a step's work on its gradient buckets (gradient_buckets.h) in plan order, either on the
// calling thread after backward, or overlapped: on a communication thread that starts each bucket's
// work as soon as backward has written its last gradient, while backward goes on (as PyTorch DDP,
// Horovod's background thread, DeepSpeed's overlap_comm). The work is the method's (a BucketJob):
// dense sync allreduces the bucket; PowerSGD compresses the bucket's tensors and allreduces their
// factors, as DDP runs its powerSGD_hook per bucket.
//
// Threads: the communication thread makes every MPI call from the step's first bucket to its last;
// the training thread makes none in between (finish() returns only when the thread is idle again),
// so MPI_THREAD_SERIALIZED is enough (comm/mpi_communicator.cpp asks for it). The communication
// thread runs the jobs' loops (casts, products, the finiteness check) on one core: OpenMP teams of
// its own would compete with backward's.
//
// Non-finite values: with overlap a bucket is checked before its job runs (its sum of squares in
// double, finite for any finite floats), so the step's verdict (trainer/step/step_clock.h) can still say
// which tensor of which rank was not finite, although the local gradient is gone by then. A job
// must therefore leave nothing behind that outlives a skipped step (PowerSGD keeps its residual
// and its Q untouched until the trainer commits the step).
//
// On a device (OnDevice below; docs/architecture.md section 2, "Overlap"), nothing on the host waits
// for the compute stream. As backward hands a bucket over, the training thread enqueues on the
// compute stream each of the bucket's tensors' sum of squares (into a small device array, read
// once by finish(): the same check, per tensor) and the method's `stage` (dense: the 16-bit cast),
// then records the bucket's mark (an event) there. The job waits for the mark on the communication
// stream: with a communicator that only enqueues (NCCL) the training thread runs the job at once
// and no thread is needed; otherwise (MPI through host staging) the communication thread runs it,
// and its staging copy on the communication stream waits for the mark before MPI reads the data.
// finish() makes the compute stream wait for the communication stream (so whatever follows on the
// compute stream sees the sums), and the host waits only for the compute stream's squares.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/sync/methods/dense/gradient_buckets.h"
#include "models/backend.h"
#include "models/device_buffer.h"

namespace trainer::comm {

// One bucket's work, given its index in the plan and the step's flat gradient.
using BucketJob = std::function<void(size_t bucket, float* grads)>;

// Overlap on a device's buffers (see above). The reducer's jobs communicate on `stream`.
struct OnDevice {
  models::Backend* backend = nullptr;       // where the gradient lives; its stream computes
  models::DeviceStream* stream = nullptr;   // the communication stream (backend->make_stream())
  bool enqueues = false;                    // the jobs' calls only enqueue (Communicator::enqueues)
  BucketJob stage;                          // optional: on the compute stream before the mark
};

class BucketReducer {
 public:
  // `views`: the model's tensors (for the name of a non-finite one; may be null).
  BucketReducer(Communicator& comm, std::vector<GradientBucket> plan, BucketJob job,
                const std::vector<models::ParamView>* views);
  // Overlapped steps on a device (before the first begin()). `comm`'s log records the calls.
  void run_on_device(OnDevice device);
  bool on_device() const { return device_.stream != nullptr; }
  ~BucketReducer();
  BucketReducer(const BucketReducer&) = delete;
  BucketReducer& operator=(const BucketReducer&) = delete;

  const std::vector<GradientBucket>& plan() const { return plan_; }
  // When bucket b was handed over during this step's backward (comm log clock), or -1 (not
  // overlapped). The reducer gives it to the job's first message; a job with more (PowerSGD's Q)
  // gives it to them too, so that the log and the what-if see them as part of the bucket.
  int64_t ready_us(size_t b) const { return ready_us_[b]; }

  // Every bucket's job in plan order on this thread (no overlap).
  void run_all(float* grads);

  // Overlap: begin() before backward; ready(from) while backward runs, when gradient entries
  // [from, n) are final (buckets lying wholly there go to the communication thread, in plan order);
  // finish() after backward hands over the rest and waits for all. finish() returns the first
  // tensor whose local gradient was not finite when its bucket went out (-1: none; the number of
  // views when it lies outside every view), and rethrows an error of the communication thread.
  void begin(float* grads);
  void ready(int64_t from);
  int finish();

 private:
  void serve();                     // the communication thread's loop
  void run_bucket(size_t b);
  int first_nonfinite_tensor(const GradientBucket& bucket) const;
  // On a device: the bucket's squares, stage and mark on the compute stream (training thread).
  void stage_on_device(size_t b);
  int finish_on_device();

  Communicator& comm_;
  std::vector<GradientBucket> plan_;
  BucketJob job_;
  const std::vector<models::ParamView>* views_;

  // Shared with the communication thread (under mutex_).
  std::mutex mutex_;
  std::condition_variable work_, done_;
  float* grads_ = nullptr;
  size_t handed_ = 0;   // buckets handed over this step
  size_t reduced_ = 0;  // buckets whose job has returned
  int nonfinite_tensor_ = -1;
  std::vector<int64_t> ready_us_;  // per bucket: when it was handed over (comm log clock)
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;  // started at the first begin()

  // On a device (run_on_device).
  OnDevice device_;
  models::DeviceBuffer squares_;           // per slot (a tensor, or a bucket without views): a double
  std::vector<double> host_squares_;
  std::vector<std::pair<int64_t, int64_t>> slot_ranges_;  // per slot: [begin, end) of the gradient
  std::vector<std::vector<int>> bucket_slots_;             // per bucket: its slots
};

}  // namespace trainer::comm
