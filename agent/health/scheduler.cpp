#include "agent/health/scheduler.hpp"

#include <spdlog/spdlog.h>

namespace factory::agent {

HealthScheduler::HealthScheduler(GuestEnv env, HealthScheduleOptions options, ScopeSource scope,
                                 Sink sink)
    : probe_(env, options.deadlines),
      options_(options),
      scope_(std::move(scope)),
      sink_(std::move(sink)) {
  if (options_.watch_faults)
    faults_ = std::make_unique<FaultWatcher>(
        env, FaultBook(FaultBook::file_in(env.state_dir)), [this] { report_now(); },
        options_.faults);
}

HealthScheduler::~HealthScheduler() {
  stop();
  if (thread_.joinable()) thread_.join();
  faults_.reset();
}

void HealthScheduler::start() {
  thread_ = std::thread([this] { loop(); });
  if (faults_) faults_->start();
}

std::optional<FaultWatcher::State> HealthScheduler::fault_watch() const {
  if (!faults_) return std::nullopt;
  return faults_->state();
}

void HealthScheduler::report_now() {
  std::lock_guard lk(mu_);
  requested_ = true;
  cv_.notify_one();
}

void HealthScheduler::stop() {
  if (faults_) faults_->stop();
  std::lock_guard lk(mu_);
  stopping_ = true;
  cv_.notify_one();
}

HealthScheduler::Counts HealthScheduler::counts() const {
  std::lock_guard lk(mu_);
  return counts_;
}

std::optional<proto::HealthSample> HealthScheduler::last_sample() const {
  std::lock_guard lk(mu_);
  return last_sample_;
}

void HealthScheduler::loop() {
  std::unique_lock lk(mu_);
  // The first sample at once: the coordinator learns the guest's GPU as soon
  // as the agent is up, not an interval later.
  auto next = std::chrono::steady_clock::now();
  bool forced = true;
  while (!stopping_) {
    cv_.wait_until(lk, next, [&] { return stopping_ || requested_; });
    if (stopping_) return;
    forced |= requested_;
    requested_ = false;
    auto began = std::chrono::steady_clock::now();
    lk.unlock();
    take(forced);
    lk.lock();
    forced = false;
    // On the interval's grid from when the sample began; a sample that took
    // longer than the interval is followed by the next at once.
    next = began + options_.interval;
  }
}

void HealthScheduler::take(bool forced) {
  try {
    Scope scope = scope_ ? scope_() : Scope{};
    proto::HealthSample h = probe_.sample(scope.collectors, scope.plan_hash);
    h.endpoint = std::move(scope.endpoint);
    bool send;
    {
      std::lock_guard lk(mu_);
      ++counts_.sampled;
      ++quiet_;
      send = forced || !last_sent_ || quiet_ >= options_.max_quiet ||
             health_changed(*last_sent_, h, options_.thresholds);
      last_sample_ = h;
      if (send) {
        last_sent_ = h;
        quiet_ = 0;
        ++counts_.sent;
      }
    }
    if (send && sink_) sink_(h);
  } catch (const std::exception& e) {
    // A collector that throws is a bug; the next sample tries again.
    spdlog::error("health: sample failed: {}", e.what());
  }
}

}  // namespace factory::agent
