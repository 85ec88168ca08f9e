#include "common/worker_pool.hpp"

#include <spdlog/spdlog.h>

namespace factory {

WorkerPool::WorkerPool(std::size_t threads) {
  if (threads == 0) threads = 1;
  for (std::size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { loop(); });
}

WorkerPool::~WorkerPool() {
  stop();
}

bool WorkerPool::post(std::function<void()> job) {
  {
    std::lock_guard lk(mu_);
    if (stopping_) return false;
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
  return true;
}

void WorkerPool::stop() {
  {
    std::lock_guard lk(mu_);
    if (stopping_ && threads_.empty()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  threads_.clear();
}

std::size_t WorkerPool::queued() const {
  std::lock_guard lk(mu_);
  return jobs_.size();
}

void WorkerPool::loop() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    try {
      job();
    } catch (const std::exception& e) {
      // A job's exception is a bug; the pool stays up for the others.
      spdlog::error("worker: a job failed with an exception: {}", e.what());
    }
  }
}

}  // namespace factory
