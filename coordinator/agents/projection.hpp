#pragma once
// Projection: what an agent's events make of its tenant's status (plan and
// step progress, health, diagnoses) and phase, as the feed shows them.
// It sees only decoded events (messages.hpp), and keeps the record bounded
// whatever the agent sends within its quota: a step id outside the
// tenant's plan is refused before it gets here (session.cpp), a tenant with
// no plan (a token-only one) has at most kMaxProjectedSteps, diagnosis
// codes at most kMaxProjectedDiagnoses, and each step keeps the last
// kProjectedTailBytes of its output (the event in the history keeps it all).
#include <cstddef>
#include <string>
#include <string_view>

#include "common/durations.hpp"
#include "coordinator/agents/messages.hpp"
#include "coordinator/store/store.hpp"

namespace factory::coordinator {

inline constexpr std::size_t kMaxProjectedSteps = 64;
inline constexpr std::size_t kMaxProjectedDiagnoses = 64;
inline constexpr std::size_t kProjectedTailBytes = 4096;

// The last `max` bytes of an output tail, starting on a character (a UTF-8
// continuation byte is never first).
std::string last_bytes(std::string_view tail, std::size_t max = kProjectedTailBytes);

// An agent_upgrade event applied to the tenant's upgrade journal
// (status.agent_upgrade): true when it changed it.
bool project_upgrade(store::TenantRecord& t, const proto::AgentUpgradeEvent& e);
// Whether a tenant's endpoint may count usage under `key`: "default", a
// named key it has, or one it had (a revoked key's name stays in its usage).
bool endpoint_key_known(const store::TenantRecord& t, const std::string& key);
// An endpoint_usage event folded into the tenant's endpoint usage, by the
// time the coordinator received it: true when counted (a key of its own).
bool project_endpoint_usage(store::TenantRecord& t, const proto::EndpointUsageEvent& u,
                            Clock::time_point received);

// Applies one agent event to the tenant's derived status and phase.
// Returns true when the record changed and should be persisted.
bool project_event(store::TenantRecord& t, const AgentEvent& event);

}  // namespace factory::coordinator
