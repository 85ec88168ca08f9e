#pragma once
// Runs plans on their own thread, so a 20-minute driver install never stalls
// the network link. At start it resumes whatever the journal holds (the plan
// survives the guest's reboot without the coordinator); plans and commands
// that arrive over the link are queued and run one at a time. Everything it
// has to say goes into the durable spool as events. Health is reported after
// each plan and then every health_interval.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "agent/plan/engine.hpp"

namespace factory::agent {

class EventSpool;

class PlanRunner {
 public:
  PlanRunner(GuestEnv env, EventSpool& spool, std::chrono::milliseconds health_interval,
             PlanEngineOptions engine_options = {}, RebootHook reboot = system_reboot_hook());
  ~PlanRunner();
  void start();
  // body: {"hash": ..., "plan": {...}} as the coordinator sends it.
  void submit_plan(const nlohmann::json& body);
  // {"action": "retry", "step": "id"?}
  void submit_command(const nlohmann::json& cmd);
  // Does not wait for a step in progress: the journal makes stopping anywhere safe.
  void stop();
  // Plan hash and state, for heartbeats.
  nlohmann::json summary() const;

 private:
  struct Work {
    enum class Kind { resume, plan, retry, health } kind;
    nlohmann::json body;
  };
  void loop();
  void report_health();
  void emit(nlohmann::json event);

  GuestEnv env_;
  EventSpool& spool_;
  std::chrono::milliseconds health_interval_;
  std::unique_ptr<PlanEngine> engine_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Work> queue_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> rebooting_{false};
  std::string last_outcome_ = "none";
  std::thread thread_;
};

}  // namespace factory::agent
