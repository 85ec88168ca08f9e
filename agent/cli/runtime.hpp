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
};

// The collectors a plan's guest wants, from its status (PlanEngine::status_json()).
HealthCollectors collectors_for_plan(const nlohmann::json& plan_status);

class AgentRuntime {
 public:
  AgentRuntime(GuestEnv env, EventSpool& spool, AgentRuntimeOptions options);
  // Resumes the journal's plan at once, before the coordinator is even
  // reachable (after the driver's reboot nobody needs to send it again), and
  // starts health.
  void start();
  void stop();

  PlanRunner& plan() { return plan_; }
  HealthScheduler& health() { return health_; }

 private:
  PlanRunner plan_;
  HealthScheduler health_;
};

}  // namespace factory::agent
