#pragma once
// What the status feed knows beyond the store: the agents' live presence and
// the agents endpoint's counters. The agents module writes them as things
// happen; the feed only reads them (tenant_view.hpp, metrics.hpp). In memory
// only: after a restart every agent counts as disconnected until its hello.
// Runs on the server's io_context thread; no locks.
#include <cstdint>
#include <map>
#include <string>

namespace factory::feed {

// A tenant's agent as the coordinator sees it now.
struct AgentPresence {
  std::string agent_id, version, hostname, remote;
  std::string connected_since, last_seen;  // RFC 3339
  bool connected = false;
};

// Counters of the agents endpoint, exported as Prometheus metrics.
struct AgentCounters {
  uint64_t enrollments_accepted = 0;
  uint64_t enrollments_refused = 0;
  uint64_t connections_refused = 0;
  uint64_t events_stored = 0;
  uint64_t events_duplicate = 0;
  uint64_t frames_rejected = 0;
  uint64_t frames_unknown_type = 0;
  uint64_t certificates_renewed = 0;
};

class FeedState {
 public:
  // The agent said hello: it is the tenant's one connected agent now.
  void agent_connected(const std::string& tenant, AgentPresence presence);
  // It sent something (an event, a heartbeat) at `at`.
  void agent_seen(const std::string& tenant, const std::string& at);
  // Its connection ended at `at`.
  void agent_disconnected(const std::string& tenant, const std::string& at);

  // nullptr when no agent of the tenant connected since the coordinator started.
  const AgentPresence* presence(const std::string& tenant) const;
  size_t connected_count() const;

  AgentCounters& counters() { return counters_; }
  const AgentCounters& counters() const { return counters_; }

 private:
  std::map<std::string, AgentPresence> presence_;
  AgentCounters counters_;
};

}  // namespace factory::feed
