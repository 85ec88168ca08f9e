#pragma once
// Threads for work that may wait: a Kubernetes call, a signature, a disk
// sync. An io thread hands such work here and goes on serving its
// connections; the work posts its result back where it is needed. Jobs run
// in the order queued (one thread: strictly; several: started in order).
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace factory {

class WorkerPool {
 public:
  explicit WorkerPool(std::size_t threads);
  // Runs what is queued, then joins.
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Thread-safe. After stop(), jobs are dropped (false).
  bool post(std::function<void()> job);
  // Runs what is queued, then joins every thread. Idempotent.
  void stop();
  std::size_t queued() const;
  std::size_t size() const { return threads_.size(); }

 private:
  void loop();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace factory
