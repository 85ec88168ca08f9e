#pragma once
// Sessions: one websocket connection from an agent, and the dispatch of its
// frames to enrollment, ingestion and the rest. Before enrollment (no client
// certificate) a connection may only enroll; after, it speaks for exactly
// one tenant, the one its certificate names, and only once it said hello. A
// connection with an expired certificate (still on the tenant's record,
// within the renewal grace) may only renew: no hello, no events.
// Every frame is decoded into its type (messages.hpp) before anything of it
// is used, and every frame of an enrolled agent passes its tenant's quota
// first (ingestion.hpp).
//
// Threads: a session's callbacks run on its connection's io thread and
// never wait there. What may wait goes elsewhere and comes back through the
// connection's post(): enrollment and renewal (a signature, a token book and
// store write) run on the worker pool; an event is queued to the store's
// writer and acknowledged once it is durable. Other threads reach a session
// only through deliver() and end(), which are thread-safe.
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "common/log.hpp"
#include "common/net/server.hpp"
#include "common/worker_pool.hpp"
#include "contract/protocol.hpp"
#include "coordinator/agents/endpoint_grant.hpp"
#include "coordinator/agents/enrollment.hpp"
#include "coordinator/agents/ingestion.hpp"
#include "coordinator/feed/feed_state.hpp"
#include "coordinator/store/store.hpp"

namespace factory::coordinator {

class AgentSession;

// The tenants' live sessions, one per tenant: the newest hello wins.
// Thread-safe: sessions of different io threads attach and detach here.
class SessionRegistry {
 public:
  // Registers s for the tenant, ending the session it replaces.
  void attach(const std::string& tenant, const std::shared_ptr<AgentSession>& s);
  // Forgets s if it is still the tenant's session; false if it was not.
  bool detach(const std::string& tenant, const AgentSession* s);
  std::shared_ptr<AgentSession> find(const std::string& tenant) const;
  std::size_t size() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<AgentSession>> by_tenant_;
};

// What every session works with; it outlives them all (AgentService owns it).
struct SessionContext {
  store::Store& store;
  feed::FeedState& feed;
  Enrollment& enrollment;
  Ingestion& ingestion;
  SessionRegistry& sessions;
  WorkerPool& workers;
  EndpointGrant& endpoints;
  std::function<void(const std::string& tenant)> push_plan;  // after the tenant's hello
  // The kind of a step of the tenant's plan ("" when unknown): labels the
  // step duration metric with what the catalog says, not what the agent does.
  std::function<std::string(const store::TenantRecord&, const std::string& step)> step_kind;
  // The step ids of the plan the tenant's agent is given (nullopt: it has
  // none, a token-only tenant): progress for any other step is refused.
  std::function<std::optional<std::vector<std::string>>(const store::TenantRecord&)> plan_steps;
  std::string server_version;
  // "could not store event": when the disk is full every session says it,
  // and every agent comes back to say it again.
  LogThrottle store_failure_log{};
};

class AgentSession : public net::WsHandler, public std::enable_shared_from_this<AgentSession> {
 public:
  // tenant: the one the client certificate names ("" for none: enroll only);
  // refusal: why the certificate may not speak for it ("" when it may).
  AgentSession(SessionContext& ctx, net::PeerInfo peer, std::string tenant, std::string refusal)
      : ctx_(ctx),
        peer_(std::move(peer)),
        tenant_(std::move(tenant)),
        refusal_(std::move(refusal)) {}

  void on_open(std::shared_ptr<net::WsConnection> conn) override;
  void on_message(std::string_view text) override;
  void on_close(const net::CloseInfo& info) override;

  // Thread-safe: a frame to the agent (a plan, a command), sent from the
  // session's own io thread.
  void deliver(std::string type, nlohmann::json body);
  // Thread-safe: what the agent's hello said its build can do (features).
  std::vector<std::string> features() const;
  // Thread-safe: ends the connection; `why` is what the feed shows
  // ("replaced", "revoked") and the close frame's reason.
  void end(const std::string& why, const std::string& reason);

 private:
  std::string who() const;
  void send(std::string_view type, nlohmann::json body, std::optional<uint64_t> ack = {});
  void send_error(const std::string& code, const std::string& message,
                  const nlohmann::json& extra = nlohmann::json::object());
  void refuse(const Refusal& r);

  void handle_enroll(const proto::Envelope& env);
  void handle_hello(const proto::Envelope& env);
  void handle_event(const proto::Envelope& env);
  void handle_heartbeat(const proto::Envelope& env);
  void handle_health(const nlohmann::json& body);
  // Records the card faults a sample shows that the tenant's record does
  // not hold yet, and announces each once (card_faults.hpp).
  void note_card_faults(const store::LatestHealth& health);
  void handle_renew(const proto::Envelope& env);
  void handle_endpoint_csr(const proto::Envelope& env);
  bool tier_upgrade_step(const std::string& step);

  SessionContext& ctx_;
  net::PeerInfo peer_;
  std::string tenant_;
  std::string refusal_;
  std::string agent_id_;
  std::shared_ptr<net::WsConnection> conn_;
  uint64_t out_seq_ = 0;
  bool hello_done_ = false;
  bool closed_ = false;
  // A refusal ended this connection (over quota, ...): what still arrives is
  // not read, so nothing after the refused frame is stored or acknowledged.
  bool ending_ = false;
  bool enrolling_ = false;  // one enrollment (or renewal) in flight at a time
  bool renewing_ = false;
  // Endpoint certificates signed for this session: a few are plenty (one
  // per session, one more as it nears expiry); more is a guest wasting our
  // signatures.
  int endpoint_signatures_ = 0;
  bool endpoint_signing_ = false;
  std::string ended_as_;  // set by end(): how the feed shows this disconnect
  // The steps of the plan sent at hello; nullopt when the tenant has none.
  std::optional<std::unordered_set<std::string>> plan_steps_;
  mutable std::mutex features_mu_;
  std::vector<std::string> features_;
  // The card fault keys the tenant's record holds (read once, then kept
  // here), so a sample that shows only known faults writes nothing.
  std::set<std::string> fault_keys_;
  bool fault_keys_read_ = false;
  // Set by the store's writer when one of this session's events could not be
  // stored: no later one may be (store::Store::append_event).
  std::shared_ptr<std::atomic<bool>> store_failed_ = std::make_shared<std::atomic<bool>>(false);
};

}  // namespace factory::coordinator
