#include "agent/cli/runtime.hpp"

#include <spdlog/spdlog.h>

#include "agent/steps/builtin.hpp"
#include "common/atomic_file.hpp"
#include "common/subprocess.hpp"
#include "contract/protocol.hpp"

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

AgentRuntime::AgentRuntime(GuestEnv env, EventSpool& spool, AgentRuntimeOptions options)
    : stop_grace_(options.stop_grace), env_(std::move(env)) {
  if (options.run_plan)
    plan_ = std::make_unique<PlanRunner>(
        env_, builtin_steps(), spool_sink(spool), std::move(options.engine),
        std::move(options.reboot),
        // What the guest looks like once the plan is done is news at once.
        [this](PlanEngine::Outcome) {
          if (health_) health_->report_now();
        });
  if (auto saved = read_file(collectors_file())) {
    auto j = nlohmann::json::parse(*saved, nullptr, false);
    if (!j.is_discarded()) collectors_ = HealthCollectors::from_plan({{"health", j}});
  }
  ModelEndpointOptions eo = std::move(options.endpoint);
  if (eo.state_dir.empty()) eo.state_dir = env_.state_dir;
  if (eo.ollama_url.empty() || eo.ollama_url == ModelEndpointOptions{}.ollama_url)
    eo.ollama_url = env_.ollama_url;
  endpoint_ = std::make_unique<ModelEndpoint>(std::move(eo));
  // The keys' usage goes out as durable events, stored once.
  endpoint_->set_emit(spool_sink(spool));
  health_ = std::make_unique<HealthScheduler>(
      env_, options.health,
      [this] {
        HealthScheduler::Scope scope;
        scope.collectors = collectors();
        if (plan_) scope.plan_hash = plan_->summary().value("plan_hash", "");
        scope.endpoint = endpoint_->health();
        return scope;
      },
      [this](const proto::HealthSample& s) { sink(s); });
  maintenance_ = std::make_unique<MaintenanceNotices>(env_, spool);
  UpgradeOptions uo = std::move(options.upgrade);
  // The restart an upgrade asks for ends a running step (resumed by the
  // journal at the next start); it waits a little for one to finish first.
  uo.plan_busy = [this] { return plan_ && plan_->summary().value("plan_state", "") == "running"; };
  upgrader_ = std::make_unique<Upgrader>(env_, spool, std::move(uo));
}

AgentRuntime::~AgentRuntime() {
  // A finishing plan calls into health, and health's thread into the plan
  // and this object: the plan's thread is joined first, then health goes.
  if (plan_) plan_->stop();
  health_.reset();
}

std::filesystem::path AgentRuntime::collectors_file() const {
  return env_.state_dir / "health-collectors.json";
}

std::filesystem::path AgentRuntime::endpoint_plan_file() const {
  return env_.state_dir / "endpoint-plan.json";
}

void AgentRuntime::set_health_sink(HealthScheduler::Sink sink) {
  std::lock_guard lk(mu_);
  sink_ = std::move(sink);
}

void AgentRuntime::sink(const proto::HealthSample& s) {
  std::lock_guard lk(mu_);
  if (sink_) sink_(s);
}

HealthCollectors AgentRuntime::collectors() const {
  std::lock_guard lk(mu_);
  return collectors_;
}

void AgentRuntime::start() {
  // A guest that rebooted serves its endpoint (with the saved credentials)
  // before the coordinator is reachable.
  if (auto saved = read_file(endpoint_plan_file())) {
    auto j = nlohmann::json::parse(*saved, nullptr, false);
    if (!j.is_discarded()) endpoint_->on_plan(j);
  }
  upgrader_->on_start();
  if (plan_) plan_->start();
  health_->start();
}

void AgentRuntime::stop() {
  // In this order: a command the stop ends must find the plan already told,
  // so that its step is left to resume rather than failed.
  if (plan_) plan_->interrupt();
  CommandStop ending(stop_grace_);
  maintenance_->stop();
  upgrader_->stop();
  endpoint_->stop();
  health_->stop();
  if (plan_) plan_->stop();
}

void AgentRuntime::on_plan(const nlohmann::json& body) {
  const nlohmann::json plan = body.value("plan", nlohmann::json::object());
  HealthCollectors c = HealthCollectors::from_plan(plan);
  bool changed;
  {
    std::lock_guard lk(mu_);
    changed = !(c == collectors_);
    collectors_ = c;
  }
  if (changed) {
    if (auto st = write_file_atomic(collectors_file(), c.to_json().dump(), 0600); !st.ok())
      spdlog::warn("health: could not keep the plan's collectors: {}", st.error().message);
    // A new section to report is news.
    health_->report_now();
  }
  // The endpoint's and the probe's sections, kept for the next start.
  nlohmann::json ep = nlohmann::json::object();
  if (plan.contains("endpoint")) ep["endpoint"] = plan["endpoint"];
  if (plan.contains("health") && plan["health"].is_object() && plan["health"].contains("probe"))
    ep["health"] = {{"probe", plan["health"]["probe"]}};
  if (!ep.empty()) {
    if (auto st = write_file_atomic(endpoint_plan_file(), ep.dump(), 0600); !st.ok())
      spdlog::warn("endpoint: could not keep the plan's endpoint section: {}", st.error().message);
  } else {
    std::error_code ec;
    std::filesystem::remove(endpoint_plan_file(), ec);
  }
  endpoint_->on_plan(ep);
  if (plan_) plan_->submit_plan(body);
}

void AgentRuntime::on_command(const nlohmann::json& command) {
  // Read without value(), which throws (on the link's thread) on an action
  // that is not a string.
  auto action = command.find("action");
  if (!command.is_object() || action == command.end() || !action->is_string()) {
    spdlog::warn("ignoring a command without an action");
    return;
  }
  if (action->get_ref<const std::string&>() == proto::action::kMaintenance) {
    maintenance_->submit(command);
    return;
  }
  if (action->get_ref<const std::string&>() == proto::action::kUpgrade) {
    upgrader_->submit(command);
    return;
  }
  if (plan_) plan_->submit_command(command);
}

nlohmann::json AgentRuntime::heartbeat_fields() const {
  return plan_ ? plan_->summary() : nlohmann::json::object();
}

}  // namespace factory::agent
