#include "agent/health/scheduler.hpp"

#include <spdlog/spdlog.h>

namespace factory::agent {

HealthScheduler::HealthScheduler(GuestEnv env, std::chrono::milliseconds interval,
                                 ScopeSource scope, Sink sink)
    : env_(std::move(env)), interval_(interval), scope_(std::move(scope)), sink_(std::move(sink)) {}

HealthScheduler::~HealthScheduler() {
  stop();
  if (thread_.joinable()) thread_.join();
}

void HealthScheduler::start() {
  thread_ = std::thread([this] { loop(); });
}

void HealthScheduler::report_now() {
  std::lock_guard lk(mu_);
  requested_ = true;
  cv_.notify_one();
}

void HealthScheduler::stop() {
  std::lock_guard lk(mu_);
  stopping_ = true;
  cv_.notify_one();
}

void HealthScheduler::loop() {
  std::unique_lock lk(mu_);
  auto next = std::chrono::steady_clock::now() + interval_;
  while (!stopping_) {
    cv_.wait_until(lk, next, [&] { return stopping_ || requested_; });
    if (stopping_) return;
    requested_ = false;
    lk.unlock();
    report();
    lk.lock();
    next = std::chrono::steady_clock::now() + interval_;
  }
}

void HealthScheduler::report() {
  try {
    Scope scope = scope_ ? scope_() : Scope{};
    nlohmann::json h = collect_health(env_, scope.collectors);
    h["kind"] = "health";
    for (auto& [k, v] : scope.fields.items()) h[k] = v;
    sink_(std::move(h));
  } catch (const std::exception& e) {
    // A collector that throws is a bug; the next report tries again.
    spdlog::error("health: report failed: {}", e.what());
  }
}

}  // namespace factory::agent
