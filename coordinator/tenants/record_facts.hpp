#pragma once
// Small facts about a tenant's record that the tenants service, its
// maintenance and the Tenant controller all read the same way.
#include <string>

#include "common/durations.hpp"
#include "coordinator/store/tenant_record.hpp"

namespace factory::tenants {

// Now, as the record writes times (RFC 3339, UTC).
inline std::string now_str() {
  return format_rfc3339(Clock::now());
}

// A token-only tenant (`factory token create`) has neither tier nor VM.
inline bool has_vm(const store::TenantRecord& t) {
  return !t.tier.empty() || t.status.kube.has_value();
}

// status.kube.state: creating | created | failed, "" before any.
inline std::string kube_state(const store::TenantRecord& t) {
  return t.status.kube ? t.status.kube->state.value_or("") : "";
}

// The state of the tenant's maintenance journal, "" when none.
inline std::string maintenance_state(const store::TenantRecord& t) {
  return t.status.maintenance ? t.status.maintenance->state.value_or("") : "";
}

// A host drain keeps the tenant's VM off: stopping or drained.
inline bool held_off_by_maintenance(const store::TenantRecord& t) {
  const std::string s = maintenance_state(t);
  return s == "stopping" || s == "drained";
}

}  // namespace factory::tenants
