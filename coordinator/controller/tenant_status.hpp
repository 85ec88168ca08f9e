#pragma once
// What a Tenant object's status says (factory.dev/v1alpha1, the CRD in
// coordinator/tenants/tenant_resource.cpp): computed from the tenant's
// record and what the controller saw on its last pass, with nothing read
// here. A pure function, so that a second pass over an unchanged tenant
// computes the same status and the controller writes nothing (`kubectl
// apply` of the same file twice: zero writes).
//
// Conditions, each with a CamelCase reason and a sentence:
//   Provisioned     the VM's objects exist (create finished), or why not
//   AgentConnected  the guest's agent is connected to a coordinator now
//   Ready           phase ready: the tier's plan ran to its end
//   Degraded        what is wrong now, first what matters most: objects
//                   edited or deleted by hand (Drift, then Repaired once put
//                   back), a spec edit that cannot be applied to a running
//                   tenant (SpecNotApplied), the agent's active diagnosis
//                   (its code, in CamelCase: GpuNotVisible)
// A condition keeps its lastTransitionTime while its status stays.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/store/tenant_record.hpp"

namespace factory::controller {

// What the controller knows of one Tenant beyond its record.
struct TenantFacts {
  std::int64_t generation = 0;
  // The record (nullopt: none yet, create has not run or failed before it).
  std::optional<store::TenantRecord> record;
  // From the status feed's view of the tenant (feed::TenantView): the agent's
  // connection and what is wrong now.
  bool agent_connected = false;
  std::string agent_state;               // "never_connected", "lost", ...
  nlohmann::json active_diagnoses;       // [{code, summary, fix, ...}] or null
  std::string create_error;              // the last create's error, "" when it did not fail
  std::string invalid_spec;              // why the object could not be read ("" when it could)
  std::vector<std::string> not_applied;  // spec fields that differ and cannot change
  std::vector<std::string> drift;        // objects missing or edited, seen this pass
  std::string repair_error;              // why the repair failed
  std::string gpu;                       // the card (resource name), "" unknown
  std::string endpoint_url;
};

// "gpu_not_visible" -> "GpuNotVisible" (a condition's reason is CamelCase).
std::string camel_case(const std::string& code);

// The new status. `previous` is the object's status now (or null): its
// conditions' lastTransitionTime are kept where the status is unchanged.
// `now` is an RFC 3339 time for new transitions.
nlohmann::json tenant_status(const TenantFacts& facts, const nlohmann::json& previous,
                             const std::string& now);

}  // namespace factory::controller
