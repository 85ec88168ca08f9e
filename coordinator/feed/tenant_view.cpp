#include "coordinator/feed/tenant_view.hpp"

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
    agent["state"] = t.agent.contains("agent_id") ? "unknown" : "never_connected";
    agent["version"] = t.agent.value("version", "");
    agent["hostname"] = t.agent.value("hostname", "");
    agent["last_seen"] = "";
  }
  agent["agent_id"] = t.agent.value("agent_id", "");
  agent["enrolled_at"] = t.agent.value("enrolled_at", "");
  agent["certificate_expires_at"] = t.agent.value("certificate_expires_at", "");
  nlohmann::json j = {{"name", t.name},   {"tier", t.tier},
                      {"phase", t.phase}, {"created_at", t.created_at},
                      {"agent", agent},   {"events_stored", store_.event_count(t.name)}};
  for (auto& [k, v] : t.status.items()) j[k] = v;
  if (!t.spec.empty()) j["spec"] = t.spec;
  return j;
}

nlohmann::json TenantView::tenants() const {
  nlohmann::json list = nlohmann::json::array();
  for (auto& t : store_.list_tenants()) list.push_back(tenant(t));
  return {{"tenants", list}};
}

}  // namespace factory::feed
