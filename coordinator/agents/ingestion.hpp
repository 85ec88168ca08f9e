#pragma once
// Ingestion: an enrolled agent's messages, checked before anything is kept.
// Events are stored exactly once (a replay after a reconnect is
// acknowledged and dropped by the store) and projected onto the tenant's
// status (projection.hpp). Health samples are state: parsed into the typed
// sample (common/health_sample.hpp) with every field bounded, what breaks a
// rule dropped and counted (factory_agent_messages_rejected_total), and
// kept as the tenant's latest; an agent sending them faster than any
// schedule would is slowed by dropping the excess.
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "coordinator/agents/refusal.hpp"
#include "coordinator/feed/feed_state.hpp"
#include "coordinator/store/store.hpp"

namespace factory::coordinator {

struct HealthIntake {
  // A tenant may send this many samples at once, then this many a second
  // (the agent's shortest interval is 100 ms; its default 10 s).
  double burst = 20;
  double per_second = 10;
};

class Ingestion {
 public:
  explicit Ingestion(feed::FeedState& feed, HealthIntake intake = {})
      : feed_(feed), intake_(intake) {}

  // One event frame's body from the tenant's agent: the event to store, or
  // why not (a refused event is not acknowledged, so the agent keeps it).
  Answer<store::StoredEvent> check(const std::string& tenant, const nlohmann::json& event);

  // One health frame's body: the sample to keep as the tenant's latest (its
  // JSON with "received_at"), or nullopt when it is over the tenant's rate.
  // Thread-safe.
  std::optional<nlohmann::json> health(const std::string& tenant, const nlohmann::json& body);

 private:
  bool admit(const std::string& tenant);
  // At most one warning a minute per tenant: the counter has the rest.
  bool may_warn(const std::string& tenant);

  feed::FeedState& feed_;
  HealthIntake intake_;
  struct Bucket {
    double tokens = 0;
    std::chrono::steady_clock::time_point at{};
    std::chrono::steady_clock::time_point warned{};
  };
  std::mutex mu_;
  std::map<std::string, Bucket> buckets_;
};

}  // namespace factory::coordinator
