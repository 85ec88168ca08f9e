#pragma once
// Projection: what an agent's events make of its tenant's status (plan and
// step progress, health, diagnoses) and phase, as the feed shows them.
#include <nlohmann/json.hpp>

#include "coordinator/store/store.hpp"

namespace factory::coordinator {

// Applies one agent event to the tenant's derived status and phase.
// Returns true when the record changed and should be persisted.
bool project_event(store::TenantRecord& t, const nlohmann::json& event);

}  // namespace factory::coordinator
