#pragma once
// The tenants as the status feed shows them: `GET /v1/tenants` (and so
// `factory status -o json`), and the record part of `GET /v1/tenants/{name}`.
// The field names are an interface (README.md, "The status feed"):
//
//   name, tier, phase, created_at, spec?
//   plan?            (once the agent reported one) {hash, tier, state, steps_done, steps_total,
//   message?,
//                     failed_step?, steps: {id: {state, attempt, message?, ...}}}
//   agent            the connection: {connected, state, version, hostname, ...}
//   health           the latest sample (contract/health_sample.hpp) with
//                    received_at, or null before the first
//   active_diagnoses what is wrong now: [{code, summary, fix, details,
//                    source: "plan"|"health", step?}]
//   diagnoses        diagnosis events by code, as the agent sent them
//   events_stored
#include <nlohmann/json.hpp>

#include "coordinator/feed/feed_state.hpp"
#include "coordinator/store/store.hpp"

namespace factory::feed {

class TenantView {
 public:
  TenantView(const store::Store& store, const FeedState& state) : store_(store), state_(state) {}

  nlohmann::json tenant(const store::TenantRecord& t) const;
  // The tenant's agent as the feed sees it now (nullopt: none connected
  // since the coordinator started).
  std::optional<AgentPresence> presence(const std::string& tenant) const {
    return state_.presence(tenant);
  }
  // {"tenants": [...]}, every tenant in the store.
  nlohmann::json tenants() const;

 private:
  const store::Store& store_;
  const FeedState& state_;
};

// What is wrong with the tenant now: the diagnosis of each step whose latest
// state is failed, then those of its latest health sample.
nlohmann::json active_diagnoses(const store::TenantStatus& status, const nlohmann::json& health);

}  // namespace factory::feed
