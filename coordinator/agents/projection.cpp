#include "coordinator/agents/projection.hpp"

namespace factory::coordinator {

using nlohmann::json;

namespace {

json& object_at(json& parent, const char* key) {
  auto& v = parent[key];
  if (!v.is_object()) v = json::object();
  return v;
}

}  // namespace

std::string last_bytes(std::string_view tail, std::size_t max) {
  if (tail.size() <= max) return std::string(tail);
  tail.remove_prefix(tail.size() - max);
  while (!tail.empty() && (static_cast<unsigned char>(tail.front()) & 0xC0) == 0x80)
    tail.remove_prefix(1);
  return std::string(tail);
}

bool project_event(store::TenantRecord& t, const AgentEvent& ev) {
  json clean = ev.to_json();
  clean.erase("id");
  if (const auto* p = std::get_if<ProgressEvent>(&ev.body)) {
    auto& plan = object_at(t.status, "plan");
    auto& steps = object_at(plan, "steps");
    if (!steps.contains(p->step) && steps.size() >= kMaxProjectedSteps) return false;
    if (p->plan_hash) plan["hash"] = *p->plan_hash;
    auto& s = object_at(steps, p->step.c_str());
    // When the step began, on the agent's clock: a step that rebooted the
    // guest began before the reboot, not when it is verified after it.
    if (p->state == "started" && s.value("state", "") != "reboot_requested" && ev.time)
      s["started_at"] = *ev.time;
    for (auto& [k, v] : clean.items())
      if (k != "kind" && k != "step" && k != "plan_hash") s[k] = v;
    if (p->output_tail) s["output_tail"] = last_bytes(*p->output_tail);
    if (t.phase == "pending" || t.phase == "enrolled") t.phase = "provisioning";
    return true;
  }
  if (const auto* p = std::get_if<PlanEvent>(&ev.body)) {
    auto& plan = object_at(t.status, "plan");
    for (auto& [k, v] : clean.items())
      if (k != "kind") plan[k == "plan_hash" ? "hash" : k] = v;
    const std::string state = p->state.value_or("");
    if (state == "running")
      t.phase = "provisioning";
    else if (state == "succeeded")
      t.phase = "ready";
    else if (state == "failed")
      t.phase = "failed";
    return true;
  }
  // Health is the latest sample (store::Store::put_health), not the record.
  if (const auto* d = std::get_if<DiagnosisEvent>(&ev.body)) {
    auto& all = object_at(t.status, "diagnoses");
    if (!all.contains(d->diagnosis.code) && all.size() >= kMaxProjectedDiagnoses) return false;
    all[d->diagnosis.code] = clean;
    return true;
  }
  return false;
}

}  // namespace factory::coordinator
