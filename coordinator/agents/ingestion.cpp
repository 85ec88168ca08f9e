#include "coordinator/agents/ingestion.hpp"

#include "common/durations.hpp"

namespace factory::coordinator {

Answer<store::StoredEvent> Ingestion::check(const std::string& tenant, const nlohmann::json& b) {
  if (!b.contains("id") || !b["id"].is_number_unsigned() || b["id"].get<uint64_t>() == 0 ||
      !b.contains("kind") || !b["kind"].is_string()) {
    ++feed_.counters().frames_rejected;
    return Refusal{"bad_event", "an event needs a positive integer 'id' and a string 'kind'", ""};
  }
  const std::string now = format_rfc3339(Clock::now());
  feed_.agent_seen(tenant, now);
  store::StoredEvent e;
  e.id = b["id"].get<uint64_t>();
  e.received_at = now;
  e.event = b;
  return e;
}

}  // namespace factory::coordinator
