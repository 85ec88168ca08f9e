#include "coordinator/agents/ingestion.hpp"

#include <spdlog/spdlog.h>

#include "common/durations.hpp"
#include "coordinator/agents/projection.hpp"

namespace factory::coordinator {

Answer<nlohmann::json> Ingestion::ingest(const std::string& tenant, const std::string& agent_id,
                                         const nlohmann::json& b) {
  auto& counters = feed_.counters();
  if (!b.contains("id") || !b["id"].is_number_unsigned() || b["id"].get<uint64_t>() == 0 ||
      !b.contains("kind") || !b["kind"].is_string()) {
    ++counters.frames_rejected;
    return Refusal{"bad_event", "an event needs a positive integer 'id' and a string 'kind'", ""};
  }
  const std::string now = format_rfc3339(Clock::now());
  feed_.agent_seen(tenant, now);
  store::StoredEvent e;
  e.agent_id = agent_id;
  e.id = b["id"].get<uint64_t>();
  e.received_at = now;
  e.event = b;
  auto stored = store_.append_event(tenant, e);
  if (!stored) {
    spdlog::error("agents: could not store event {} of {}: {}", e.id, tenant,
                  stored.error().message);
    return Refusal{"store_failed", "event not stored; it will be resent", ""};
  }
  if (*stored) {
    ++counters.events_stored;
    auto rec = store_.get_tenant(tenant);
    if (rec && project_event(*rec, b)) {
      if (auto st = store_.put_tenant(*rec); !st.ok())
        spdlog::error("agents: status of {} not saved: {}", tenant, st.error().message);
    }
  } else {
    ++counters.events_duplicate;
  }
  return nlohmann::json{{"event_id", e.id}};
}

}  // namespace factory::coordinator
