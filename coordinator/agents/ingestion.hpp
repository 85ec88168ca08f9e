#pragma once
// Ingestion: an enrolled agent's events, checked before they are stored
// exactly once (a replay after a reconnect is acknowledged and dropped by
// the store) and projected onto its tenant's status (projection.hpp).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "coordinator/agents/refusal.hpp"
#include "coordinator/feed/feed_state.hpp"
#include "coordinator/store/store.hpp"

namespace factory::coordinator {

class Ingestion {
 public:
  explicit Ingestion(feed::FeedState& feed) : feed_(feed) {}

  // One event frame's body from the tenant's agent: the event to store, or
  // why not (a refused event is not acknowledged, so the agent keeps it).
  Answer<store::StoredEvent> check(const std::string& tenant, const nlohmann::json& event);

 private:
  feed::FeedState& feed_;
};

}  // namespace factory::coordinator
