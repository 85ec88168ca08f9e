#include "coordinator/agents/projection.hpp"

namespace factory::coordinator {

bool project_event(store::TenantRecord& t, const nlohmann::json& ev) {
  const std::string kind = ev.value("kind", "");
  nlohmann::json clean = ev;
  clean.erase("id");
  if (kind == "progress") {
    auto& plan = t.status["plan"];
    if (!plan.is_object()) plan = nlohmann::json::object();
    std::string step = ev.value("step", "");
    if (step.empty()) return false;
    if (ev.contains("plan_hash")) plan["hash"] = ev["plan_hash"];
    auto& steps = plan["steps"];
    if (!steps.is_object()) steps = nlohmann::json::object();
    auto& s = steps[step];
    if (!s.is_object()) s = nlohmann::json::object();
    // When the step began, on the agent's clock: a step that rebooted the
    // guest began before the reboot, not when it is verified after it.
    if (ev.value("state", "") == "started" && s.value("state", "") != "reboot_requested" &&
        ev.contains("time"))
      s["started_at"] = ev["time"];
    for (auto& [k, v] : clean.items())
      if (k != "kind" && k != "step" && k != "plan_hash") s[k] = v;
    if (t.phase == "pending" || t.phase == "enrolled") t.phase = "provisioning";
    return true;
  }
  if (kind == "plan") {
    auto& plan = t.status["plan"];
    if (!plan.is_object()) plan = nlohmann::json::object();
    for (auto& [k, v] : clean.items())
      if (k != "kind") plan[k == "plan_hash" ? "hash" : k] = v;
    std::string state = ev.value("state", "");
    if (state == "running")
      t.phase = "provisioning";
    else if (state == "succeeded")
      t.phase = "ready";
    else if (state == "failed")
      t.phase = "failed";
    return true;
  }
  // Health is the latest sample (store::Store::put_health), not the record.
  if (kind == "diagnosis") {
    auto& d = t.status["diagnoses"];
    if (!d.is_object()) d = nlohmann::json::object();
    d[ev.value("code", "unknown")] = clean;
    return true;
  }
  return false;
}

}  // namespace factory::coordinator
