#pragma once
// Projection: what an agent's events make of its tenant's status (plan and
// step progress, health, diagnoses) and phase, as the feed shows them.
// It sees only decoded events (messages.hpp), and keeps the record bounded:
// an agent that invents step ids or diagnosis codes without end adds no
// more than kMaxProjectedSteps / kMaxProjectedDiagnoses entries.
#include <cstddef>

#include "coordinator/agents/messages.hpp"
#include "coordinator/store/store.hpp"

namespace factory::coordinator {

inline constexpr std::size_t kMaxProjectedSteps = 256;
inline constexpr std::size_t kMaxProjectedDiagnoses = 64;

// Applies one agent event to the tenant's derived status and phase.
// Returns true when the record changed and should be persisted.
bool project_event(store::TenantRecord& t, const AgentEvent& event);

}  // namespace factory::coordinator
