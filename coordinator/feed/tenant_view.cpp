#include "coordinator/feed/tenant_view.hpp"

#include <cmath>

#include "common/durations.hpp"

namespace factory::feed {

nlohmann::json TenantView::tenant(const store::TenantRecord& t) const {
  nlohmann::json agent = {{"connected", false}};
  if (auto l = state_.presence(t.name)) {
    agent["connected"] = l->connected;
    agent["version"] = l->version;
    agent["hostname"] = l->hostname;
    agent["connected_since"] = l->connected ? l->connected_since : "";
    agent["last_seen"] = l->last_seen;
    agent["remote_address"] = l->remote;
    // connected | stopped | rebooting | lost | revoked | replaced
    agent["state"] = l->connected ? "connected" : l->disconnect;
    if (!l->connected && !l->disconnect_detail.empty())
      agent["disconnect_reason"] = l->disconnect_detail;
    agent["dropped_events"] = l->dropped_events;
    agent["pending_events"] = l->pending_events;
  } else {
    agent["state"] = t.agent.agent_id ? "unknown" : "never_connected";
    agent["version"] = t.agent.version.value_or("");
    agent["hostname"] = t.agent.hostname.value_or("");
    agent["last_seen"] = "";
  }
  agent["agent_id"] = t.agent.agent_id.value_or("");
  agent["enrolled_at"] = t.agent.enrolled_at.value_or("");
  agent["certificate_expires_at"] = t.agent.certificate_expires_at.value_or("");
  nlohmann::json j = {{"name", t.name},   {"tier", t.tier},
                      {"phase", t.phase}, {"created_at", t.created_at},
                      {"agent", agent},   {"events_stored", store_.event_count(t.name)}};
  // The status's JSON is the view's top level.
  const nlohmann::json status = t.status.to_json();
  for (auto& [k, v] : status.items()) j[k] = v;
  // The plans a tier upgrade keeps are the coordinator's to send, not to
  // show: their hashes say which they are (`tenant show` lists their pins).
  if (j.contains("tier_plan")) j["tier_plan"].erase("plan");
  if (j.contains("tier_upgrade")) j["tier_upgrade"].erase("to_plan");
  // GPU usage's intervals are `factory usage`'s to report: the view says
  // what it adds up to, and whether an interval is open.
  if (t.status.gpu_usage) {
    const store::GpuUsage& u = *t.status.gpu_usage;
    double total = 0;
    for (const auto& [m, s] : u.gpu_seconds_total()) total += s;
    nlohmann::json v = {{"gpu_model", u.gpu_model()},
                        {"gpu_seconds_total", std::llround(total)},
                        {"gpu_busy_seconds_total", std::llround(u.busy_seconds_total())}};
    if (u.open()) v["running_since"] = format_rfc3339(Clock::from_time_t(u.open()->start));
    j["gpu_usage"] = v;
  }
  // Health is the store's latest sample; a record written before health
  // was state may still hold an old copy, which is not it.
  auto health = store_.get_health(t.name);
  j["health"] = health ? health->to_json() : nlohmann::json(nullptr);
  if (!j.contains("diagnoses")) j["diagnoses"] = nlohmann::json::object();
  j["active_diagnoses"] = active_diagnoses(t.status, j["health"]);
  if (nlohmann::json spec = t.spec.to_json(); !spec.empty()) j["spec"] = std::move(spec);
  return j;
}

nlohmann::json active_diagnoses(const store::TenantStatus& status, const nlohmann::json& health) {
  nlohmann::json out = nlohmann::json::array();
  auto add = [&](const nlohmann::json& d, const std::string& source, const std::string& step) {
    if (!d.is_object() || !d.contains("code") || !d["code"].is_string()) return;
    nlohmann::json a = {{"code", d["code"]},
                        {"summary", d.value("summary", "")},
                        {"fix", d.value("fix", "")},
                        {"details", d.value("details", nlohmann::json::object())},
                        {"source", source}};
    if (!step.empty()) a["step"] = step;
    out.push_back(std::move(a));
  };
  if (status.plan && status.plan->steps)
    for (const auto& [id, s] : *status.plan->steps)
      if (s.state == "failed" && s.diagnosis) add(s.diagnosis->to_json(), "plan", id);
  if (health.is_object())
    for (const char* section : {"gpu", "ollama", "k8s"})
      if (health.contains(section) && health[section].is_object())
        for (const auto& d : health[section].value("diagnoses", nlohmann::json::array()))
          add(d, "health", "");
  return out;
}

nlohmann::json TenantView::tenants() const {
  nlohmann::json list = nlohmann::json::array();
  for (auto& t : store_.list_tenants()) list.push_back(tenant(t));
  nlohmann::json out = {{"tenants", list}};
  // The agent binary served now: what an upgrade would install.
  if (auto bin = state_.agent_binary(); !bin.is_null()) out["agent_binary"] = std::move(bin);
  return out;
}

}  // namespace factory::feed
