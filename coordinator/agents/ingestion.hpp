#pragma once
// Ingestion: an enrolled agent's events, checked, stored exactly once (a
// replay after a reconnect is acknowledged and dropped), and projected onto
// its tenant's status (projection.hpp).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "coordinator/agents/refusal.hpp"
#include "coordinator/feed/feed_state.hpp"
#include "coordinator/store/store.hpp"

namespace factory::coordinator {

class Ingestion {
 public:
  Ingestion(store::Store& store, feed::FeedState& feed) : store_(store), feed_(feed) {}

  // One event frame's body from the tenant's agent. The answer is the ack's
  // body; a refused event is not acknowledged, so the agent keeps it.
  Answer<nlohmann::json> ingest(const std::string& tenant, const std::string& agent_id,
                                const nlohmann::json& event);

 private:
  store::Store& store_;
  feed::FeedState& feed_;
};

}  // namespace factory::coordinator
