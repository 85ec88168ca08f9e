#pragma once
// Health on its own schedule: a thread of its own samples every interval (and
// at once when asked, e.g. when a plan finishes), so health keeps flowing
// while a plan step runs for an hour, and in every mode the agent runs in.
// It knows nothing of plans: what to collect is asked of `scope` before each
// sample, and what is worth sending goes to `sink` (the agent's cli wires it
// to the link, which sends it as a non-durable health frame).
//
// Health is state: a sample goes to the sink when it changed beyond the
// thresholds (change.hpp) since the last one sent, or when max_quiet
// intervals passed without one, or when asked (report_now).
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "agent/guest/env.hpp"
#include "agent/health/change.hpp"
#include "agent/health/fault_watcher.hpp"
#include "agent/health/report.hpp"

namespace factory::agent {

struct HealthScheduleOptions {
  std::chrono::milliseconds interval{std::chrono::seconds(10)};
  // A sample is sent at least every max_quiet intervals, changed or not, so
  // the coordinator can tell a quiet guest from a silent one.
  int max_quiet = 6;
  HealthDeadlines deadlines;
  ChangeThresholds thresholds;
  // NVML's Xid and ECC events, waited for beside the schedule: each one
  // records its Xid in the fault book and asks for a sample at once.
  bool watch_faults = true;
  FaultWatchOptions faults;
};

class HealthScheduler {
 public:
  struct Scope {
    HealthCollectors collectors;
    std::string plan_hash;
    // Kept by the agent's model endpoint (its proxy's counters, the probe's
    // last result): added as it is, nothing collected for it here.
    std::optional<proto::EndpointSection> endpoint;
  };
  using ScopeSource = std::function<Scope()>;
  using Sink = std::function<void(const proto::HealthSample& sample)>;

  HealthScheduler(GuestEnv env, HealthScheduleOptions options, ScopeSource scope, Sink sink);
  // Stops, and waits for a sample under way (its collectors' deadlines bound it).
  ~HealthScheduler();
  HealthScheduler(const HealthScheduler&) = delete;
  HealthScheduler& operator=(const HealthScheduler&) = delete;

  void start();
  // A sample now rather than at the next interval, sent whatever it says;
  // the interval counts from it.
  void report_now();
  void stop();

  struct Counts {
    std::uint64_t sampled = 0;
    std::uint64_t sent = 0;
  };
  Counts counts() const;
  std::optional<proto::HealthSample> last_sample() const;
  // The event watcher's state (nullopt when options.watch_faults is off).
  std::optional<FaultWatcher::State> fault_watch() const;

 private:
  void loop();
  void take(bool forced);

  HealthProbe probe_;
  HealthScheduleOptions options_;
  ScopeSource scope_;
  Sink sink_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool requested_ = false;
  Counts counts_;
  std::optional<proto::HealthSample> last_sent_;
  std::optional<proto::HealthSample> last_sample_;
  int quiet_ = 0;  // intervals since the last sample sent
  std::thread thread_;
  // Last: it calls report_now() until it is gone, so it goes first.
  std::unique_ptr<FaultWatcher> faults_;
};

}  // namespace factory::agent
