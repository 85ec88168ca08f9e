#pragma once
// Ingestion: what an enrolled agent sends, decoded and metered before
// anything of it is kept. Every frame first passes the tenant's quota
// (quota.hpp); an event is then decoded field by field (messages.hpp), what
// the decoder dropped is counted per tenant and reason, and the event is
// stored exactly once (a replay after a reconnect is acknowledged and
// dropped by the store) and projected onto its tenant's status
// (projection.hpp). Health samples are state: parsed into the typed sample
// (contract/health_sample.hpp) with every field bounded, what breaks a rule
// dropped and counted (factory_agent_messages_rejected_total), and kept as
// the tenant's latest; an agent sending them faster than any schedule would
// is slowed by dropping the excess.
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/agents/messages.hpp"
#include "coordinator/agents/quota.hpp"
#include "coordinator/agents/refusal.hpp"
#include "coordinator/feed/feed_state.hpp"
#include "coordinator/store/store.hpp"

namespace factory::coordinator {

// An event ready for the store: its stored form (its JSON serialized once,
// here), its decoded one (for the projection) and the same JSON as a tree
// (for the feed, which takes it: moved along, never copied).
struct IngestedEvent {
  store::StoredEvent stored;
  AgentEvent event;
  nlohmann::json tree;
};

struct HealthIntake {
  // A tenant may send this many samples at once, then this many a second
  // (the agent's shortest interval is 100 ms; its default 10 s).
  double burst = 20;
  double per_second = 10;
};

class Ingestion {
 public:
  Ingestion(feed::FeedState& feed, QuotaOptions quotas, HealthIntake intake = {})
      : feed_(feed), quotas_(quotas), intake_(intake) {}

  // Every frame of an enrolled agent, before it is read: a refusal (which
  // closes the connection) when the tenant is over a quota. event_bytes:
  // the frame's size for an event, 0 for any other frame.
  std::optional<Refusal> admit(const std::string& tenant, std::size_t event_bytes);

  // One event frame's body from the tenant's agent: the event to store, or
  // why not (a refused event is not acknowledged).
  Answer<IngestedEvent> check(const std::string& tenant, const nlohmann::json& event);

  // What a decoder dropped from a message of type `type` (counted and, a few
  // a minute per tenant, logged). tenant "" for a connection without one.
  void count(const std::string& tenant, const std::string& type, const Rejections& rejected);
  // A message refused before any decoder saw it (a bad envelope).
  void count(const std::string& tenant, const std::string& reason);

  // The tenant is gone: its quota state goes with it.
  void forget(const std::string& tenant);

  // One health frame's body: the sample to keep as the tenant's latest,
  // or null when it is over the tenant's rate or no sample at all.
  // Thread-safe.
  std::shared_ptr<const store::LatestHealth> health(const std::string& tenant,
                                                    const nlohmann::json& body);

 private:
  bool may_log(const std::string& tenant);
  bool admit_health(const std::string& tenant);

  feed::FeedState& feed_;
  TenantQuotas quotas_;
  HealthIntake intake_;
  std::mutex log_mu_;
  struct LogWindow {
    std::chrono::steady_clock::time_point start{};
    int lines = 0;
  };
  std::map<std::string, LogWindow> log_windows_;
  struct Bucket {
    double tokens = 0;
    std::chrono::steady_clock::time_point at{};
  };
  std::mutex mu_;
  std::map<std::string, Bucket> buckets_;
};

}  // namespace factory::coordinator
