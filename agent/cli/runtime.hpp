#pragma once
// The agent's work beside its link, wired as the factory-agent service runs
// it: the plan runner with the built-in step kinds, and the health
// scheduler, both reporting into the durable spool. Health reports when a
// plan finishes and every health_interval; which collectors run is taken
// from the plan's step kinds (a guest that installs Ollama reports Ollama,
// one that runs RKE2 its cluster).
#include <chrono>
#include <nlohmann/json.hpp>

#include "agent/health/scheduler.hpp"
#include "agent/link/spool.hpp"
#include "agent/plan/engine.hpp"
#include "agent/plan/runner.hpp"

namespace factory::agent {

struct AgentRuntimeOptions {
  std::chrono::milliseconds health_interval{};  // AgentConfig::health_interval
  PlanEngineOptions engine;
  RebootHook reboot = system_reboot_hook();
  // On stop, how long a running command (apt-get, dpkg, an installer) has
  // after SIGTERM before SIGKILL: well inside the unit's TimeoutStopSec (90s).
  std::chrono::milliseconds stop_grace{std::chrono::seconds(20)};
};

// The collectors a plan's guest wants, from its status (PlanEngine::status_json()).
HealthCollectors collectors_for_plan(const nlohmann::json& plan_status);

class AgentRuntime {
 public:
  AgentRuntime(GuestEnv env, EventSpool& spool, AgentRuntimeOptions options);
  // Joins the plan's thread before health goes: a finishing plan calls into it.
  ~AgentRuntime();
  // Resumes the journal's plan at once, before the coordinator is even
  // reachable (after the driver's reboot nobody needs to send it again), and
  // starts health.
  void start();
  // Ends every command the agent runs (SIGTERM to its process group, SIGKILL
  // after stop_grace), stops the plan at that point (the step resumes at the
  // next start) and health; returns once the plan's thread has ended (health's
  // is joined when the runtime goes away).
  void stop();
  // The plan asked the guest to reboot: the stop that follows is the reboot's.
  bool rebooting() const { return plan_.rebooting(); }

  PlanRunner& plan() { return plan_; }
  HealthScheduler& health() { return health_; }

 private:
  std::chrono::milliseconds stop_grace_;
  PlanRunner plan_;
  HealthScheduler health_;
};

}  // namespace factory::agent
