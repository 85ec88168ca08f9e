#pragma once
// What the status feed knows beyond the store: the agents' live presence and
// the agents endpoint's counters. The agents module writes them as things
// happen, from any io thread; the feed only reads them (tenant_view.hpp,
// metrics.hpp). In memory only: after a restart every agent counts as
// disconnected until its hello. Thread-safe.
//
// Replicas (the bus on the store's feed log, event_bus.hpp): an agent is
// connected to one replica, and every replica shows it. The `agent` events
// of the others, as they come back from the log, set and end presence here
// (AgentPresence::replica names the replica that holds the connection); each
// replica also sends, at every bus heartbeat (events.heartbeat, 15 s), a
// note listing the agents connected to it, which tells a replica that
// started later about agents that connected before it. The rule for a
// replica that dies without a word (kill -9, a node lost): an agent it held
// is shown connected only while that replica has been heard from (any event
// or note of its own) within replica_ttl (four heartbeats, 60 s, as the
// coordinator sets it); past that
// it is shown disconnected, state "lost", until it connects again
// (anywhere). Which connection wins: the newest in the log's order. A
// replica's own connection is newer than another's `connected` that the log
// put before it, and only the replica that holds a connection may end it.
// Counters and spool figures stay per replica.
#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "coordinator/feed/event_bus.hpp"
#include "coordinator/store/store.hpp"

namespace factory::feed {

// A tenant's agent as the coordinator sees it now.
struct AgentPresence {
  std::string agent_id, version, hostname, remote;
  std::string connected_since, last_seen;  // RFC 3339
  bool connected = false;
  // How the last connection ended: "" while connected; "stopped" or
  // "rebooting" when the agent said so in its close frame (a planned stop);
  // "lost" when the connection just went (a crash, the network, a timeout);
  // "revoked", "replaced" when the coordinator ended it.
  std::string disconnect;
  // With replicas: "" when the connection is to this coordinator, else the
  // replica holding it (its feed log origin).
  std::string replica;
  std::string disconnect_detail;  // the close reason as given
  // Events the agent's spool had to drop (it was full during an outage), as
  // its last heartbeat said.
  std::uint64_t dropped_events = 0;
  std::uint64_t pending_events = 0;
};

// Counters of the agents endpoint, exported as Prometheus metrics.
struct AgentCounters {
  std::atomic<std::uint64_t> enrollments_accepted{0};
  std::atomic<std::uint64_t> enrollments_refused{0};
  std::atomic<std::uint64_t> connections_refused{0};
  std::atomic<std::uint64_t> events_stored{0};
  std::atomic<std::uint64_t> events_duplicate{0};
  std::atomic<std::uint64_t> frames_rejected{0};
  std::atomic<std::uint64_t> frames_unknown_type{0};
  std::atomic<std::uint64_t> certificates_renewed{0};
  std::atomic<std::uint64_t> store_failures{0};
};

// A Prometheus histogram of plan step durations, per tier, step kind and
// result (succeeded | failed).
struct StepDurations {
  // Upper bounds in seconds: a quick check to the hour a model pull may take.
  static constexpr std::array<double, 12> kBuckets = {1,   5,   15,   30,   60,   120,
                                                      300, 600, 1200, 1800, 3600, 7200};
  struct Series {
    std::array<std::uint64_t, kBuckets.size()> buckets{};  // cumulative, as exposed
    std::uint64_t count = 0;
    double sum = 0;
  };
  // (tier, kind, result) -> series
  std::map<std::array<std::string, 3>, Series> series;
};

class FeedState {
 public:
  explicit FeedState(EventBusOptions bus = {})
      : replica_ttl_(bus.replica_ttl), bus_(hooked(std::move(bus))) {}

  // The agent said hello: it is the tenant's one connected agent now.
  void agent_connected(const std::string& tenant, AgentPresence presence);
  // It sent something (an event, a heartbeat) at `at`.
  void agent_seen(const std::string& tenant, const std::string& at);
  // What its heartbeat says about its spool.
  void agent_spool(const std::string& tenant, std::uint64_t pending, std::uint64_t dropped);
  // Its connection ended at `at`, for `how` (see AgentPresence::disconnect).
  void agent_disconnected(const std::string& tenant, const std::string& at, const std::string& how,
                          const std::string& detail);
  // A health sample taken in as the tenant's latest: a `health` event with
  // it and the diagnoses it makes active.
  void health_changed(const std::string& tenant, const store::LatestHealth& sample);
  // An agent event stored (on the store's writer): a `progress`, `plan` or
  // `diagnosis` event, and a `phase` event when `after` (the record as the
  // event left it, when it changed) has a new phase.
  void event_stored(const std::string& tenant, nlohmann::json event,
                    const store::TenantRecord* after);
  // A phase the tenant has now (set outside the agents' events: a new
  // tenant, an enrollment); published when it differs from the last one.
  void phase_now(const std::string& tenant, const std::string& phase);

  // The tenant is gone: nothing about its agent is shown any more (its
  // counters below go too). A disconnect reported after this adds nothing.
  void forget(const std::string& tenant);

  // What the agents module did not keep of a tenant's messages, by reason
  // (coordinator/agents/messages.hpp, a health field out of range, a message
  // over its rate): factory_agent_messages_rejected_total.
  void count_rejected(const std::string& tenant, const std::string& reason, std::uint64_t n = 1);
  // Messages refused because the tenant was over a quota, by quota:
  // factory_agent_quota_refusals_total.
  void count_over_quota(const std::string& tenant, const std::string& quota);
  using TenantCounts = std::map<std::pair<std::string, std::string>, std::uint64_t>;
  TenantCounts rejected() const;
  TenantCounts over_quota() const;
  // A health sample taken in as the tenant's latest.
  void count_health_sample(const std::string& tenant);
  std::map<std::string, std::uint64_t> health_samples() const;
  // An event stored, by its kind (progress, plan, ...; anything else "other").
  void count_event(const std::string& kind);
  std::map<std::string, std::uint64_t> events_by_kind() const;
  // A plan step that finished after `seconds`.
  void observe_step(const std::string& tier, const std::string& kind, const std::string& result,
                    double seconds);
  StepDurations step_durations() const;

  // The agent binary this coordinator serves (tenants::AgentBinarySnapshot
  // as JSON: path, sha256, size, version or no_version), set by the server
  // whenever it is read again: factory_agent_binary_info, and GET
  // /v1/tenants's "agent_binary". Null until set.
  void set_agent_binary(nlohmann::json info);
  nlohmann::json agent_binary() const;
  // An agent upgrade ended (upgraded, rolled_back, refused, failed), as the
  // leader's rollout pass saw it: factory_agent_upgrades_total{result}.
  void count_agent_upgrade(const std::string& result);
  std::map<std::string, std::uint64_t> agent_upgrades() const;

  // nullopt when no agent of the tenant connected since the coordinator started.
  std::optional<AgentPresence> presence(const std::string& tenant) const;
  std::map<std::string, AgentPresence> all() const;
  std::size_t connected_count() const;

  // Leader election (replicas on one store): this replica's name and
  // whether it leads now; absent when there is no election.
  struct Leadership {
    std::string replica;
    bool leading = false;
  };
  void set_leadership(const std::string& replica, bool leading);
  std::optional<Leadership> leadership() const;

  // What GET /v1/events streams.
  EventBus& bus() { return bus_; }
  const EventBus& bus() const { return bus_; }

  AgentCounters& counters() { return counters_; }
  const AgentCounters& counters() const { return counters_; }

 private:
  // The bus's options with FeedState's hooks on the log (the caller's kept).
  EventBusOptions hooked(EventBusOptions o);
  // An event back from the log (its thread): the other replicas' agents.
  void from_log(const FeedEvent& e, bool own, bool live);
  void apply_note_locked(const FeedEvent& e);
  // With mu_ held: the note listing the agents connected here.
  void send_note();
  // With mu_ held: `p` as shown now (a connection held by a replica not
  // heard from within replica_ttl_ is shown lost).
  AgentPresence shown_locked(AgentPresence p, std::chrono::steady_clock::time_point now) const;

  mutable std::mutex mu_;
  std::map<std::string, AgentPresence> presence_;
  const std::chrono::milliseconds replica_ttl_;
  // When each other replica was last heard from (its live events and notes).
  std::map<std::string, std::chrono::steady_clock::time_point> heard_;
  // The log id of this replica's latest `connected` of each tenant's agent;
  // 0 while it has not come back from the log.
  std::map<std::string, std::uint64_t> local_connect_id_;
  TenantCounts rejected_, over_quota_;
  std::map<std::string, std::uint64_t> health_samples_;
  std::map<std::string, std::uint64_t> events_by_kind_;
  StepDurations steps_;
  AgentCounters counters_;
  std::map<std::string, std::string> phases_;  // the last phase published, per tenant
  std::optional<Leadership> leadership_;
  nlohmann::json agent_binary_;
  std::map<std::string, std::uint64_t> agent_upgrades_;
  EventBus bus_;
};

}  // namespace factory::feed
