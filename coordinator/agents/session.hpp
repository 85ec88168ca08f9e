#pragma once
// Sessions: one websocket connection from an agent, and the dispatch of its
// frames to enrollment, ingestion and the rest. Before enrollment (no client
// certificate) a connection may only enroll; after, it speaks for exactly
// one tenant, the one its certificate names, and only once it said hello.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "common/net/https_server.hpp"
#include "common/protocol.hpp"
#include "coordinator/agents/enrollment.hpp"
#include "coordinator/agents/ingestion.hpp"
#include "coordinator/feed/feed_state.hpp"
#include "coordinator/store/store.hpp"

namespace factory::coordinator {

class AgentSession;

// The tenants' live sessions, one per tenant: the newest hello wins.
class SessionRegistry {
 public:
  // Registers s for the tenant, closing the session it replaces.
  void attach(const std::string& tenant, const std::shared_ptr<AgentSession>& s);
  // Forgets s if it is still the tenant's session; false if it was not.
  bool detach(const std::string& tenant, const AgentSession* s);
  AgentSession* find(const std::string& tenant) const;

 private:
  std::map<std::string, std::shared_ptr<AgentSession>> by_tenant_;
};

// What every session works with; it outlives them all (AgentService owns it).
struct SessionContext {
  store::Store& store;
  feed::FeedState& feed;
  Enrollment& enrollment;
  Ingestion& ingestion;
  SessionRegistry& sessions;
  std::function<void(const std::string& tenant)> push_plan;  // after the tenant's hello
  std::string server_version;
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
  void on_close(std::string_view reason) override;

  void send(std::string_view type, nlohmann::json body, std::optional<uint64_t> ack = {});
  void close(std::string_view reason);

 private:
  std::string who() const;
  void send_error(const std::string& code, const std::string& message);
  void refuse(const Refusal& r);

  void handle_enroll(const proto::Envelope& env);
  void handle_hello(const proto::Envelope& env);
  void handle_event(const proto::Envelope& env);
  void handle_heartbeat(const proto::Envelope& env);
  void handle_renew(const proto::Envelope& env);

  SessionContext& ctx_;
  net::PeerInfo peer_;
  std::string tenant_;
  std::string refusal_;
  std::string agent_id_;
  std::shared_ptr<net::WsConnection> conn_;
  uint64_t out_seq_ = 0;
  bool hello_done_ = false;
};

}  // namespace factory::coordinator
