// Background preparation of numbered items handed out in order: the part of the image and speech
// loaders that overlaps data preparation with the model's compute.
//
// Workers claim sequence numbers at most `depth` ahead of the consumer and build them with `make`;
// next() returns item next_ once it is ready, rethrowing the exception its worker caught. Items
// depend only on their sequence number (the loaders draw every random number from (seed, epoch,
// index)), so the output is the same for any thread count and timing. restart() (a seek) drops
// items claimed before it. With 0 threads, next() builds the item itself.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace trainer::data {

template <class Item>
class Prefetcher {
 public:
  using Make = std::function<Item(int64_t sequence)>;

  // Workers start at once: `make` must be callable from other threads as soon as this returns.
  Prefetcher(int threads, Make make) : make_(std::move(make)), depth_(threads > 0 ? threads + 1 : 0) {
    if (depth_ < 2 && threads > 0) depth_ = 2;
    for (int t = 0; t < threads; ++t) workers_.emplace_back([this] { work(); });
  }
  // Stops and joins the workers; at most the items in progress finish first.
  ~Prefetcher() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (std::thread& t : workers_) t.join();
  }
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // The next call to next() returns item `sequence`.
  void restart(int64_t sequence) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++generation_;
    ready_.clear();
    next_ = claimed_ = sequence;
    work_cv_.notify_all();
  }

  Item next() {
    if (workers_.empty()) return make_(next_++);
    std::unique_lock<std::mutex> lock(mutex_);
    ready_cv_.wait(lock, [this] { return ready_.count(next_) != 0; });
    Slot slot = std::move(ready_.extract(next_).mapped());
    ++next_;
    lock.unlock();
    work_cv_.notify_all();
    if (slot.error) std::rethrow_exception(slot.error);
    return std::move(slot.item);
  }

 private:
  struct Slot {
    Item item;
    std::exception_ptr error;
  };

  void work() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      work_cv_.wait(lock, [this] { return stop_ || claimed_ < next_ + depth_; });
      if (stop_) return;
      const int64_t sequence = claimed_++;
      const uint64_t generation = generation_;
      lock.unlock();
      Slot slot;
      try {
        slot.item = make_(sequence);
      } catch (...) {
        slot.error = std::current_exception();
      }
      lock.lock();
      if (generation == generation_) {  // otherwise a restart() made this item obsolete
        ready_.emplace(sequence, std::move(slot));
        ready_cv_.notify_all();
      }
    }
  }

  Make make_;
  int64_t depth_;
  std::mutex mutex_;
  std::condition_variable work_cv_;   // workers: a sequence number may be claimed, or stop
  std::condition_variable ready_cv_;  // consumer: an item arrived
  std::map<int64_t, Slot> ready_;
  int64_t next_ = 0;     // sequence next() returns
  int64_t claimed_ = 0;  // next sequence a worker claims
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::vector<std::thread> workers_;  // last: started after everything above exists
};

}  // namespace trainer::data
