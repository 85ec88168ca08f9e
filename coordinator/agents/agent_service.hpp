#pragma once
// The coordinator's side of the agent protocol (contract/protocol.hpp), in
// parts that each do one job: sessions (session.hpp: the connection and its
// dispatch), enrollment and renewal (enrollment.hpp), ingestion of events
// (ingestion.hpp) and their projection onto the tenant (projection.hpp).
// AgentService owns them and is what the server wires: the websocket
// acceptor, and the few things the rest of the coordinator asks of agents.
// The agents' presence and counters go to the status feed (feed/).
// Thread-safe: sessions live on the io threads, the rest of the coordinator
// calls in from workers.
#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/net/server.hpp"
#include "common/worker_pool.hpp"
#include "coordinator/agents/endpoint_grant.hpp"
#include "coordinator/agents/enrollment.hpp"
#include "coordinator/agents/ingestion.hpp"
#include "coordinator/agents/quota.hpp"
#include "coordinator/agents/session.hpp"
#include "coordinator/enroll/ca.hpp"
#include "coordinator/enroll/tokens.hpp"
#include "coordinator/feed/feed_state.hpp"
#include "coordinator/store/store.hpp"

namespace factory::coordinator {

struct AgentServiceOptions {
  std::chrono::seconds cert_ttl{std::chrono::hours(24)};
  // How long after its expiry an agent's certificate may still renew itself.
  std::chrono::seconds renewal_grace{std::chrono::hours(24 * 90)};
  QuotaOptions quotas;  // per tenant (quota.hpp)
  std::string server_version = FACTORY_VERSION;
  // Signs model endpoints' certificates (endpoint_grant.hpp); none: their
  // CSRs are refused.
  std::optional<enroll::CertificateAuthority> endpoint_ca;
};

// What a tenant's plan is, if it has one: {"hash":..., "plan":{...}}.
using PlanProvider = std::function<std::optional<nlohmann::json>(const store::TenantRecord&)>;
// Command bodies for the tenant's agent; never waits (it reads the record given).
using PendingCommands = std::function<std::vector<nlohmann::json>(const store::TenantRecord&)>;

class AgentService {
 public:
  AgentService(store::Store& store, const enroll::CertificateAuthority& ca, enroll::Tokens& tokens,
               feed::FeedState& feed, WorkerPool& workers, AgentServiceOptions opts);
  AgentService(const AgentService&) = delete;
  AgentService& operator=(const AgentService&) = delete;

  // The websocket acceptor for /v1/agent.
  std::shared_ptr<net::WsHandler> accept(const net::HttpRequestIn& req, const net::PeerInfo& peer);

  void set_plan_provider(PlanProvider p) { plan_provider_ = std::move(p); }
  // Commands an agent is owed whenever it connects, after its plan (a host
  // drain's notice the guest has not confirmed): so a notice reaches an
  // agent connected to any replica, not only the one that decided it.
  void set_pending_commands(PendingCommands p) { pending_commands_ = std::move(p); }
  // Sends a command frame to the tenant's live agent; false if it is not connected.
  bool send_command(const std::string& tenant, const nlohmann::json& body);
  // What the tenant's connected agent said its build can do (its hello's
  // features); nullopt when none is connected.
  std::optional<std::vector<std::string>> agent_features(const std::string& tenant) const;
  // The step ids progress may name, when they are not the plan's sent at
  // hello (a tier upgrade's new plan). Unset: the plan's.
  void set_plan_step_ids(
      std::function<std::optional<std::vector<std::string>>(const store::TenantRecord&)> f) {
    plan_step_ids_ = std::move(f);
  }
  // Sends the tenant's plan to its connected agent (on hello).
  void push_plan(const std::string& tenant);
  // Sends the tenant's endpoint frame (its key's hash, after a rotation) to
  // its connected agent; false when it is not connected or has no endpoint.
  bool push_endpoint(const std::string& tenant);
  // Forgets the tenant's agent identity: its certificate stops working now,
  // its connection ends, and nothing of it stays on show (presence,
  // counters, quota state). May wait on the store: workers only.
  Status revoke(const std::string& tenant);
  std::size_t connected_count() const;

 private:
  std::string step_kind(const store::TenantRecord& t, const std::string& step) const;
  std::optional<std::vector<std::string>> plan_steps(const store::TenantRecord& t) const;

  store::Store& store_;
  feed::FeedState& feed_;
  Enrollment enrollment_;
  Ingestion ingestion_;
  EndpointGrant endpoints_;
  SessionRegistry sessions_;
  PlanProvider plan_provider_;
  PendingCommands pending_commands_;
  std::function<std::optional<std::vector<std::string>>(const store::TenantRecord&)> plan_step_ids_;
  SessionContext ctx_;
};

}  // namespace factory::coordinator
