#pragma once
// Runs plans on their own thread, so a 20-minute driver install never stalls
// the network link. At start it resumes whatever the journal holds (the plan
// survives the guest's reboot without the coordinator); plans and commands
// that arrive over the link are queued and run one at a time. It is handed
// everything from outside: the step kinds it may run, where its events go
// (the cli wires them to the durable spool), and whom to tell when a plan
// has finished (the cli: health reports then).
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "agent/plan/engine.hpp"

namespace factory::agent {

class PlanRunner {
 public:
  // Called on the runner's thread when a plan (run, resumed or retried) has
  // succeeded or failed.
  using FinishedHook = std::function<void(PlanEngine::Outcome)>;

  PlanRunner(GuestEnv env, StepRegistry steps, PlanEventSink sink,
             PlanEngineOptions engine_options = {}, RebootHook reboot = system_reboot_hook(),
             FinishedHook on_finished = {});
  ~PlanRunner();
  void start();
  // body: {"hash": ..., "plan": {...}} as the coordinator sends it.
  void submit_plan(const nlohmann::json& body);
  // {"action": "retry", "step": "id"?}, or a tier upgrade order
  // {"action": "tier_upgrade", ...} (PlanEngine::tier_upgrade)
  void submit_command(const nlohmann::json& cmd);
  // Tells the runner to stop, without waiting: the plan stops at the next
  // step boundary (PlanEngine::interrupt), and a step whose command is ended
  // from now on is left to resume, not failed. Idempotent, thread-safe.
  void interrupt();
  // interrupt(), then waits for the runner's thread. A step's command still
  // running is not ended here: the agent interrupts, ends every command
  // (CommandStop), then stops. The journal makes stopping anywhere safe.
  void stop();
  // A step asked for a reboot and the reboot was requested: the agent's
  // coming stop is the guest going down, not an admin's.
  bool rebooting() const { return rebooting_; }
  // Plan hash and state, for heartbeats.
  nlohmann::json summary() const;
  // PlanEngine::status_json(): every step with its kind and state.
  nlohmann::json status() const;

 private:
  struct Work {
    enum class Kind { resume, plan, retry, tier_upgrade } kind;
    nlohmann::json body;
  };
  void loop();

  PlanEventSink sink_;
  FinishedHook on_finished_;
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
