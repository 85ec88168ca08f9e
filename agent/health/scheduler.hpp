#pragma once
// Health on its own schedule: a thread of its own reports every interval
// (and at once when asked, e.g. when a plan finishes), so health keeps
// flowing while a plan step runs for an hour. It knows nothing of plans:
// what to collect and what else a report carries are asked of `scope` before
// each report, and the report goes to `sink`; the agent's cli wires both.
//
//   {"kind": "health", "gpu": ..., "ollama"?: ..., "k8s"?: ..., ...scope's fields}
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "agent/guest/env.hpp"
#include "agent/health/report.hpp"

namespace factory::agent {

class HealthScheduler {
 public:
  struct Scope {
    HealthCollectors collectors;
    nlohmann::json fields = nlohmann::json::object();  // merged into the report
  };
  using ScopeSource = std::function<Scope()>;
  using Sink = std::function<void(nlohmann::json report)>;

  HealthScheduler(GuestEnv env, std::chrono::milliseconds interval, ScopeSource scope, Sink sink);
  // Stops, and waits for a report under way (the collectors' own timeouts bound it).
  ~HealthScheduler();
  HealthScheduler(const HealthScheduler&) = delete;
  HealthScheduler& operator=(const HealthScheduler&) = delete;

  void start();
  // A report now rather than at the next interval; the interval counts from it.
  void report_now();
  void stop();

 private:
  void loop();
  void report();

  GuestEnv env_;
  std::chrono::milliseconds interval_;
  ScopeSource scope_;
  Sink sink_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool requested_ = false;
  std::thread thread_;
};

}  // namespace factory::agent
