#include "agent/cli/runtime.hpp"

#include <spdlog/spdlog.h>

#include "agent/steps/builtin.hpp"
#include "common/subprocess.hpp"

namespace factory::agent {

namespace {

StepRegistry builtin_steps() {
  StepRegistry r;
  register_builtin_steps(r);
  return r;
}

std::function<void(nlohmann::json)> spool_sink(EventSpool& spool) {
  return [&spool](nlohmann::json event) {
    if (auto r = spool.emit(std::move(event)); !r)
      spdlog::error("event not recorded: {}", r.error().message);
  };
}

}  // namespace

HealthCollectors collectors_for_plan(const nlohmann::json& plan_status) {
  HealthCollectors c;
  for (auto& s : plan_status.value("steps", nlohmann::json::array())) {
    if (s.value("kind", "").rfind("ollama", 0) == 0) c.ollama = true;
    if (s.value("kind", "") == "rke2") c.k8s = true;
  }
  return c;
}

AgentRuntime::AgentRuntime(GuestEnv env, EventSpool& spool, AgentRuntimeOptions options)
    : stop_grace_(options.stop_grace),
      plan_(env, builtin_steps(), spool_sink(spool), std::move(options.engine),
            std::move(options.reboot), [this](PlanEngine::Outcome) { health_.report_now(); }),
      health_(
          env, options.health_interval,
          [this] {
            auto status = plan_.status();
            return HealthScheduler::Scope{collectors_for_plan(status),
                                          {{"plan_hash", status.value("plan_hash", "")}}};
          },
          spool_sink(spool)) {}

AgentRuntime::~AgentRuntime() {
  plan_.stop();
}

void AgentRuntime::start() {
  plan_.start();
  health_.start();
}

void AgentRuntime::stop() {
  // In this order: a command the stop ends must find the plan already told,
  // so that its step is left to resume rather than failed.
  plan_.interrupt();
  CommandStop ending(stop_grace_);
  health_.stop();
  plan_.stop();
}

}  // namespace factory::agent
