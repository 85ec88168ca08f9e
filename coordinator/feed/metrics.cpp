#include "coordinator/feed/metrics.hpp"

#include <map>
#include <sstream>

namespace factory::feed {

std::string render_metrics(const store::Store& store, const FeedState& state) {
  std::ostringstream o;
  auto gauge = [&](const char* name, const char* help) {
    o << "# HELP " << name << " " << help << "\n# TYPE " << name << " gauge\n";
  };
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    o << "# HELP " << name << " " << help << "\n# TYPE " << name << " counter\n"
      << name << " " << v << "\n";
  };
  gauge("factory_agents_connected", "Agents connected to this coordinator now.");
  o << "factory_agents_connected " << state.connected_count() << "\n";
  std::map<std::string, int> phases;
  for (auto p : {"pending", "enrolled", "provisioning", "ready", "failed"}) phases[p] = 0;
  auto tenants = store.list_tenants();
  for (auto& t : tenants) phases[t.phase]++;
  gauge("factory_tenants", "Tenants by lifecycle phase.");
  for (auto& [p, n] : phases) o << "factory_tenants{phase=\"" << p << "\"} " << n << "\n";
  auto presence = state.all();
  gauge("factory_tenant_agent_connected", "1 when the tenant's agent is connected.");
  for (auto& t : tenants) {
    auto it = presence.find(t.name);
    o << "factory_tenant_agent_connected{tenant=\"" << t.name << "\"} "
      << (it != presence.end() && it->second.connected ? 1 : 0) << "\n";
  }
  gauge("factory_agent_spool_dropped_events",
        "Events the tenant's agent dropped because its spool was full (its last heartbeat).");
  for (auto& t : tenants) {
    auto it = presence.find(t.name);
    o << "factory_agent_spool_dropped_events{tenant=\"" << t.name << "\"} "
      << (it != presence.end() ? it->second.dropped_events : 0) << "\n";
  }
  const AgentCounters& m = state.counters();
  counter("factory_enrollments_accepted_total", "Agent enrollments accepted.",
          m.enrollments_accepted);
  counter("factory_enrollments_refused_total", "Agent enrollments refused (bad token or CSR).",
          m.enrollments_refused);
  counter("factory_agent_connections_refused_total",
          "Agent connections refused (revoked certificate, wrong tenant).", m.connections_refused);
  counter("factory_events_stored_total", "Agent events stored.", m.events_stored);
  counter("factory_events_duplicate_total", "Replayed agent events dropped as duplicates.",
          m.events_duplicate);
  counter("factory_frames_rejected_total", "Malformed frames from agents.", m.frames_rejected);
  counter("factory_frames_unknown_type_total", "Frames of an unknown type, ignored.",
          m.frames_unknown_type);
  counter("factory_certificates_renewed_total", "Agent certificates renewed.",
          m.certificates_renewed);
  counter("factory_store_failures_total",
          "Agent events the store could not write (the session was closed; the agent resends).",
          m.store_failures);
  // Per tenant: what its agent sent that was not kept, and what a quota
  // refused. Tenant names are DNS labels and reasons a fixed set, so the
  // label values need no escaping; only series that counted something appear.
  auto per_tenant = [&](const char* name, const char* help, const char* label,
                        const FeedState::TenantCounts& counts) {
    o << "# HELP " << name << " " << help << "\n# TYPE " << name << " counter\n";
    for (auto& [key, n] : counts)
      o << name << "{tenant=\"" << key.first << "\"," << label << "=\"" << key.second << "\"} " << n
        << "\n";
  };
  per_tenant("factory_agent_messages_rejected_total",
             "Agent messages or fields not kept (refused or dropped), by reason.", "reason",
             state.rejected());
  per_tenant("factory_agent_quota_refusals_total",
             "Agent messages refused because the tenant was over a quota (agents.quota).", "quota",
             state.over_quota());
  counter("factory_events_expired_total",
          "Stored agent events dropped by retention, oldest first (agents.quota.max_events_stored, "
          "max_event_age).",
          store.stats().events_expired);
  return o.str();
}

}  // namespace factory::feed
