#include "coordinator/controller/tenant_status.hpp"

#include <cctype>

#include "common/validation.hpp"
#include "coordinator/tenants/record_facts.hpp"

namespace factory::controller {

using tenants::kube_state;

using nlohmann::json;

namespace {

// A condition's message has a schema bound (4096); what an agent said is
// bounded by its reader already, this keeps the sentence short too.
constexpr std::size_t kMaxMessage = 1024;

std::string bounded(std::string s) {
  if (s.size() > kMaxMessage) s = s.substr(0, kMaxMessage - 3) + "...";
  return s;
}

json condition(const char* type, bool status, const std::string& reason, const std::string& message,
               std::int64_t generation) {
  return {{"type", type},
          {"status", status ? "True" : "False"},
          {"reason", reason},
          {"message", bounded(message)},
          {"observedGeneration", generation}};
}

// The step the agent is on: none once the plan succeeded; the failed one;
// else the one under way (or waiting on its reboot).
std::string current_step(const store::TenantRecord& r) {
  if (!r.status.plan) return "";
  const auto& plan = *r.status.plan;
  if (plan.state && *plan.state == "succeeded") return "";
  if (plan.failed_step && !plan.failed_step->empty()) return *plan.failed_step;
  if (plan.steps)
    for (const auto& [id, step] : *plan.steps)
      if (step.state && (*step.state == "running" || *step.state == "started" ||
                         *step.state == "reboot_requested"))
        return id;
  return "";
}

json degraded(const TenantFacts& f, const json& previous_degraded) {
  const std::int64_t g = f.generation;
  if (!f.invalid_spec.empty())
    return condition("Degraded", true, "InvalidSpec",
                     f.invalid_spec + ": fix the Tenant's spec, nothing was changed", g);
  if (!f.drift.empty() && !f.repair_error.empty())
    return condition("Degraded", true, "Drift",
                     "changed by hand: " + validation::join(f.drift, "; ") +
                         "; putting it back failed: " + f.repair_error,
                     g);
  if (!f.drift.empty())
    return condition("Degraded", false, "Repaired",
                     "changed by hand and put back: " + validation::join(f.drift, "; "), g);
  if (!f.create_error.empty())
    return condition("Degraded", true, "CreateFailed",
                     f.create_error + " (the controller tries again at its next pass)", g);
  if (!f.not_applied.empty())
    return condition("Degraded", true, "SpecNotApplied",
                     "spec changed where a running tenant cannot change (" +
                         validation::join(f.not_applied, "; ") +
                         "): it runs as first created; to change it, delete the Tenant and "
                         "apply it again (its VM and disk are made anew)",
                     g);
  if (f.active_diagnoses.is_array() && !f.active_diagnoses.empty()) {
    const json& d = f.active_diagnoses[0];
    std::string msg = d.value("summary", std::string("a diagnosis"));
    if (!d.value("fix", std::string()).empty()) msg += ". Fix: " + d.value("fix", std::string());
    return condition("Degraded", true, camel_case(d.value("code", std::string("Diagnosis"))), msg,
                     g);
  }
  const std::string phase = f.record ? f.record->phase : "";
  if (phase == "failed" || phase == "degraded")
    return condition("Degraded", true, camel_case(phase),
                     "the tenant is " + phase + " with no diagnosis: see `factory tenant show`", g);
  // A repair reported earlier stays said until something else is.
  if (previous_degraded.is_object() && previous_degraded.value("status", "") == "False" &&
      previous_degraded.value("reason", "") == "Repaired") {
    json kept = previous_degraded;
    kept["observedGeneration"] = g;
    kept.erase("lastTransitionTime");
    return kept;
  }
  return condition("Degraded", false, "Healthy", "nothing is wrong that Factory knows of", g);
}

}  // namespace

std::string camel_case(const std::string& code) {
  std::string out;
  bool up = true;
  for (char c : code) {
    if (c == '_' || c == '-' || c == ' ' || c == '.') {
      up = true;
      continue;
    }
    if (!std::isalnum(static_cast<unsigned char>(c))) continue;
    out += up ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
    up = false;
  }
  return out.empty() ? "Unknown" : out.substr(0, 128);
}

json tenant_status(const TenantFacts& f, const json& previous, const std::string& now) {
  const std::int64_t g = f.generation;
  const store::TenantRecord* r = f.record ? &*f.record : nullptr;
  const std::string phase = r                         ? r->phase
                            : !f.invalid_spec.empty() ? "invalid"
                            : !f.create_error.empty() ? "failed"
                                                      : "creating";
  std::vector<json> conds;

  const std::string ks = r ? kube_state(*r) : "";
  if (ks == "created")
    conds.push_back(condition("Provisioned", true, "Created", "the VM and its objects exist", g));
  else if (!f.create_error.empty() || ks == "failed")
    conds.push_back(condition("Provisioned", false, "CreateFailed",
                              !f.create_error.empty()
                                  ? f.create_error
                                  : r->status.kube->error.value_or("the create failed"),
                              g));
  else if (!f.invalid_spec.empty())
    conds.push_back(condition("Provisioned", false, "InvalidSpec", f.invalid_spec, g));
  else
    conds.push_back(condition("Provisioned", false, "Creating", "the VM is being created", g));

  if (f.agent_connected)
    conds.push_back(
        condition("AgentConnected", true, "Connected", "the guest's agent is connected", g));
  else
    conds.push_back(
        condition("AgentConnected", false,
                  camel_case(f.agent_state.empty() ? "never_connected" : f.agent_state),
                  f.agent_state.empty() || f.agent_state == "never_connected"
                      ? "the guest's agent has not connected yet (the VM boots, then enrolls)"
                      : "the guest's agent is not connected (" + f.agent_state + ")",
                  g));

  const std::string maint = r ? tenants::maintenance_state(*r) : "";
  const bool in_maintenance =
      maint == "noticed" || maint == "stopping" || maint == "drained" || maint == "starting";
  const std::string node = in_maintenance ? r->status.maintenance->node.value_or("") : "";
  if (in_maintenance && maint != "noticed")
    // Off, or coming back, for a host drain: not a failure of the tenant's.
    conds.push_back(condition("Ready", false,
                              camel_case(maint == "starting" ? "undraining" : maint),
                              "stopped for maintenance of node " + node +
                                  " (`factory host undrain " + node + "` brings it back)",
                              g));
  else if (phase == "ready")
    conds.push_back(condition("Ready", true, "Ready", "the tier's plan ran to its end", g));
  else
    conds.push_back(condition("Ready", false, camel_case(phase), "phase " + phase, g));

  json prev_conds = previous.is_object() ? previous.value("conditions", json::array()) : json();
  json prev_degraded;
  if (prev_conds.is_array())
    for (const auto& c : prev_conds)
      if (c.is_object() && c.value("type", "") == "Degraded") prev_degraded = c;
  conds.push_back(degraded(f, prev_degraded));

  // A transition time moves only when the status does.
  for (auto& c : conds) {
    std::string when = now;
    if (prev_conds.is_array())
      for (const auto& p : prev_conds)
        if (p.is_object() && p.value("type", "") == c["type"] &&
            p.value("status", "") == c["status"] && p.contains("lastTransitionTime"))
          when = p.value("lastTransitionTime", now);
    c["lastTransitionTime"] = when;
  }

  json status = {{"phase", phase}, {"observedGeneration", g}, {"conditions", conds}};
  if (r) {
    if (auto step = current_step(*r); !step.empty()) status["step"] = step;
  }
  if (!f.gpu.empty()) status["gpu"] = f.gpu;
  if (!f.endpoint_url.empty()) status["endpointURL"] = f.endpoint_url;
  if (in_maintenance)
    status["maintenance"] = {{"state", maint},
                             {"node", node},
                             {"deadline", r->status.maintenance->deadline.value_or("")}};
  return status;
}

}  // namespace factory::controller
