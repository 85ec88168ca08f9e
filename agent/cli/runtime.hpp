#pragma once
// The agent's work beside its link, wired as the factory-agent service runs
// it: the plan runner with the built-in step kinds, its events into the
// durable spool, and health on its own schedule, in every mode (with
// --link-only too, where no plan runs). Health samples go to a sink (the
// link's offer_health: state, not spooled). Which collectors run is the
// plan's "health" section, the tier's in the catalog: taken from each plan
// the coordinator sends, and kept in the state directory so a guest that
// rebooted mid-plan reports the same before the coordinator is reachable.
// Commands go to the plan runner ("retry"), except maintenance notices and
// upgrade orders, which the agent acts on in every mode (maintenance.hpp,
// agent/upgrade/upgrader.hpp).
#include <chrono>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>

#include "agent/cli/maintenance.hpp"
#include "agent/cli/model_endpoint.hpp"
#include "agent/health/scheduler.hpp"
#include "agent/link/spool.hpp"
#include "agent/plan/engine.hpp"
#include "agent/plan/runner.hpp"
#include "agent/upgrade/upgrader.hpp"

namespace factory::agent {

struct AgentRuntimeOptions {
  bool run_plan = true;  // false: --link-only (health still runs)
  HealthScheduleOptions health;
  PlanEngineOptions engine;
  RebootHook reboot = system_reboot_hook();
  // On stop, how long a running command (apt-get, dpkg, an installer) has
  // after SIGTERM before SIGKILL: well inside the unit's TimeoutStopSec (90s).
  std::chrono::milliseconds stop_grace{std::chrono::seconds(20)};
  // The model endpoint and the health probe, when the plan asks for them
  // (state_dir and ollama_url are filled in from the GuestEnv when empty).
  ModelEndpointOptions endpoint;
  // The self-update (binary_path, the CA file; plan_busy is filled in here).
  UpgradeOptions upgrade;
};

class AgentRuntime {
 public:
  AgentRuntime(GuestEnv env, EventSpool& spool, AgentRuntimeOptions options);
  // Joins the plan's thread before health goes: a finishing plan calls into it.
  ~AgentRuntime();

  // Thread-safe: where samples go from now on (nullptr: nowhere, e.g. once
  // the link is gone).
  void set_health_sink(HealthScheduler::Sink sink);
  // Reports what an upgrade left to report (a rollback, say) and tells a
  // new binary on trial, resumes the journal's plan at once, before the
  // coordinator is even reachable (after the driver's reboot nobody needs to
  // send it again), and starts health.
  void start();
  // Ends every command the agent runs (SIGTERM to its process group, SIGKILL
  // after stop_grace), stops the plan at that point (the step resumes at the
  // next start) and health; returns once the plan's thread has ended (health's
  // is joined when the runtime goes away).
  void stop();
  // The plan asked the guest to reboot: the stop that follows is the reboot's.
  bool rebooting() const { return plan_ && plan_->rebooting(); }

  // A plan frame's body from the coordinator ({"hash", "plan"}): its health
  // section chooses the collectors; the plan runs unless link-only.
  void on_plan(const nlohmann::json& body);
  // A command frame's body: "maintenance" to the notices (on their own
  // thread: `wall` may take its time), "upgrade" to the upgrader (on its
  // own thread: a download), anything else to the plan runner.
  void on_command(const nlohmann::json& command);
  // For heartbeats: the plan's hash and state (nothing when link-only).
  nlohmann::json heartbeat_fields() const;

  bool runs_plans() const { return plan_ != nullptr; }
  PlanRunner& plan() { return *plan_; }  // runs_plans() only
  HealthScheduler& health() { return *health_; }
  ModelEndpoint& model_endpoint() { return *endpoint_; }
  MaintenanceNotices& maintenance() { return *maintenance_; }
  Upgrader& upgrader() { return *upgrader_; }
  HealthCollectors collectors() const;

 private:
  void sink(const proto::HealthSample& s);
  std::filesystem::path collectors_file() const;
  std::filesystem::path endpoint_plan_file() const;

  std::chrono::milliseconds stop_grace_;
  GuestEnv env_;
  std::unique_ptr<PlanRunner> plan_;
  mutable std::mutex mu_;
  HealthCollectors collectors_;  // guarded by mu_
  HealthScheduler::Sink sink_;   // guarded by mu_
  std::unique_ptr<ModelEndpoint> endpoint_;
  std::unique_ptr<HealthScheduler> health_;
  std::unique_ptr<MaintenanceNotices> maintenance_;
  // Last: it asks the plan whether it is busy, so it goes first.
  std::unique_ptr<Upgrader> upgrader_;
};

}  // namespace factory::agent
