#pragma once
// The coordinator's side of the agent protocol (common/protocol.hpp): who is
// connected, enrollment of new agents, storing their events exactly once,
// projecting events onto the tenant's status, and sending plans and commands.
// Runs on the server's io_context thread; no locks.
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/net/https_server.hpp"
#include "coordinator/enroll/ca.hpp"
#include "coordinator/enroll/tokens.hpp"
#include "coordinator/store/store.hpp"

namespace factory::coordinator {

struct AgentServiceOptions {
  std::chrono::seconds cert_ttl{std::chrono::hours(24)};
  std::string server_version = FACTORY_VERSION;
};

// Counters the status feed exports as Prometheus metrics.
struct AgentMetrics {
  uint64_t enrollments_accepted = 0;
  uint64_t enrollments_refused = 0;
  uint64_t connections_refused = 0;
  uint64_t events_stored = 0;
  uint64_t events_duplicate = 0;
  uint64_t frames_rejected = 0;
  uint64_t frames_unknown_type = 0;
  uint64_t certificates_renewed = 0;
};

// What a tenant's plan is, if it has one: {"hash":..., "plan":{...}}.
using PlanProvider = std::function<std::optional<nlohmann::json>(const store::TenantRecord&)>;

class AgentService {
 public:
  AgentService(store::Store& store, const enroll::CertificateAuthority& ca,
               enroll::TokenBook& tokens, AgentServiceOptions opts);
  ~AgentService();

  // The websocket acceptor for /v1/agent.
  std::shared_ptr<net::WsHandler> accept(const net::HttpRequestIn& req, const net::PeerInfo& peer);

  void set_plan_provider(PlanProvider p) { plan_provider_ = std::move(p); }
  // Sends a command frame to the tenant's live agent; false if it is not connected.
  bool send_command(const std::string& tenant, const nlohmann::json& body);
  // Re-sends the plan to a connected agent (after the tenant's tier changed, or retry).
  void push_plan(const std::string& tenant);
  // Forgets the tenant's agent identity: its certificate stops working now.
  Status revoke(const std::string& tenant);

  struct Live {
    std::string agent_id, version, hostname, remote;
    std::string connected_since, last_seen;
    bool connected = false;
  };
  std::optional<Live> live(const std::string& tenant) const;
  // {"tenants":[...]} as `factory status -o json` prints it.
  nlohmann::json status_json() const;
  nlohmann::json tenant_json(const store::TenantRecord& t) const;
  const AgentMetrics& metrics() const { return metrics_; }
  size_t connected_count() const;

 private:
  class Session;
  friend class Session;

  store::Store& store_;
  const enroll::CertificateAuthority& ca_;
  enroll::TokenBook& tokens_;
  AgentServiceOptions opts_;
  PlanProvider plan_provider_;
  AgentMetrics metrics_;
  std::map<std::string, std::shared_ptr<Session>> sessions_;  // by tenant, authenticated only
  std::map<std::string, Live> live_;
};

// Applies one agent event to the tenant's derived status and phase.
// Returns true when the record changed and should be persisted.
bool project_event(store::TenantRecord& t, const nlohmann::json& event);

}  // namespace factory::coordinator
