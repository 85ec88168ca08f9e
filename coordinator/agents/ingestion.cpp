#include "coordinator/agents/ingestion.hpp"

#include <spdlog/spdlog.h>

#include "common/durations.hpp"
#include "common/health_sample.hpp"

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

bool Ingestion::admit(const std::string& tenant) {
  auto now = std::chrono::steady_clock::now();
  std::lock_guard lk(mu_);
  auto [it, fresh] = buckets_.try_emplace(tenant);
  Bucket& b = it->second;
  if (fresh) {
    b.tokens = intake_.burst;
  } else {
    double elapsed = std::chrono::duration<double>(now - b.at).count();
    b.tokens = std::min(intake_.burst, b.tokens + elapsed * intake_.per_second);
  }
  b.at = now;
  if (b.tokens < 1) return false;
  b.tokens -= 1;
  return true;
}

bool Ingestion::may_warn(const std::string& tenant) {
  auto now = std::chrono::steady_clock::now();
  std::lock_guard lk(mu_);
  Bucket& b = buckets_[tenant];
  if (b.warned != std::chrono::steady_clock::time_point{} &&
      now - b.warned < std::chrono::minutes(1))
    return false;
  b.warned = now;
  return true;
}

std::optional<nlohmann::json> Ingestion::health(const std::string& tenant,
                                                const nlohmann::json& body) {
  const std::string now = format_rfc3339(Clock::now());
  feed_.agent_seen(tenant, now);
  if (!admit(tenant)) {
    feed_.count_rejected(tenant, "rate_limited");
    return std::nullopt;
  }
  proto::HealthRejects rejects;
  proto::HealthSample sample = proto::parse_health_sample(body, rejects);
  for (const auto& [reason, n] : rejects.by_reason) feed_.count_rejected(tenant, reason, n);
  if (!rejects.empty() && may_warn(tenant)) {
    // The paths are the coordinator's own words (keys and indices), never
    // the guest's values.
    std::string fields;
    for (const auto& f : rejects.fields) fields += (fields.empty() ? "" : ", ") + f;
    spdlog::warn("agents: tenant {}: health fields dropped: {}", tenant, fields);
  }
  if (rejects.by_reason.count("bad_message")) return std::nullopt;
  feed_.count_health_sample(tenant);
  nlohmann::json kept = sample.to_json();
  kept["received_at"] = now;
  return kept;
}

}  // namespace factory::coordinator
