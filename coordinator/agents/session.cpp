#include "coordinator/agents/session.hpp"

#include <spdlog/spdlog.h>

#include "common/durations.hpp"

namespace factory::coordinator {

void SessionRegistry::attach(const std::string& tenant, const std::shared_ptr<AgentSession>& s) {
  if (auto it = by_tenant_.find(tenant); it != by_tenant_.end() && it->second != s) {
    spdlog::info("agents: tenant {} reconnected; closing its previous connection", tenant);
    it->second->close("replaced by a newer connection");
  }
  by_tenant_[tenant] = s;
}

bool SessionRegistry::detach(const std::string& tenant, const AgentSession* s) {
  auto it = by_tenant_.find(tenant);
  if (it == by_tenant_.end() || it->second.get() != s) return false;
  by_tenant_.erase(it);
  return true;
}

AgentSession* SessionRegistry::find(const std::string& tenant) const {
  auto it = by_tenant_.find(tenant);
  return it == by_tenant_.end() ? nullptr : it->second.get();
}

void AgentSession::on_open(std::shared_ptr<net::WsConnection> conn) {
  conn_ = conn;
  if (!refusal_.empty()) {
    ++ctx_.feed.counters().connections_refused;
    spdlog::warn("agents: refusing {} ({})", peer_.remote, refusal_);
    send_error("unauthenticated", refusal_);
    conn->close("unauthenticated");
  }
}

void AgentSession::on_message(std::string_view text) {
  if (!refusal_.empty()) return;
  auto env = proto::parse(text);
  if (!env) {
    ++ctx_.feed.counters().frames_rejected;
    spdlog::warn("agents: bad frame from {} ({}): {}", who(), peer_.remote, env.error().message);
    send_error("bad_frame", env.error().message);
    return;
  }
  const std::string& type = env->type;
  if (tenant_.empty()) {
    if (type == proto::type::kEnroll) return handle_enroll(*env);
    send_error("unauthenticated", "this connection has no client certificate: it may only enroll");
    conn_->close("unauthenticated");
    return;
  }
  if (type == proto::type::kHello) return handle_hello(*env);
  if (!hello_done_) {
    send_error("bad_sequence", "send hello first");
    return;
  }
  if (type == proto::type::kEvent) return handle_event(*env);
  if (type == proto::type::kHeartbeat) return handle_heartbeat(*env);
  if (type == proto::type::kRenew) return handle_renew(*env);
  if (type == proto::type::kAck) return;
  if (type == proto::type::kError) {
    spdlog::warn("agents: {} reports an error: {}", who(), env->body.value("message", ""));
    return;
  }
  ++ctx_.feed.counters().frames_unknown_type;
  spdlog::warn("agents: ignoring frame of unknown type '{}' from {}", type, who());
}

void AgentSession::on_close(std::string_view reason) {
  if (tenant_.empty() || !hello_done_) return;
  if (ctx_.sessions.detach(tenant_, this)) {
    ctx_.feed.agent_disconnected(tenant_, format_rfc3339(Clock::now()));
    spdlog::info("agents: {} disconnected ({})", who(), reason);
  }
}

void AgentSession::send(std::string_view type, nlohmann::json body, std::optional<uint64_t> ack) {
  if (!conn_) return;
  proto::Envelope e;
  e.type = std::string(type);
  e.seq = ++out_seq_;
  e.ack = ack;
  e.body = std::move(body);
  if (!conn_->send(proto::serialize(e))) {
    // The agent is not reading; it will reconnect and resume from its spool.
    spdlog::warn("agents: send queue to {} is full; dropping the connection", who());
    conn_->close("send queue full");
  }
}

void AgentSession::close(std::string_view reason) {
  if (conn_) conn_->close(reason);
}

std::string AgentSession::who() const {
  return tenant_.empty() ? "unenrolled agent" : "tenant " + tenant_;
}

void AgentSession::send_error(const std::string& code, const std::string& message) {
  send(proto::type::kError, {{"code", code}, {"message", message}});
}

void AgentSession::refuse(const Refusal& r) {
  send_error(r.code, r.message);
  if (!r.close_reason.empty()) conn_->close(r.close_reason);
}

void AgentSession::handle_enroll(const proto::Envelope& env) {
  auto answer = ctx_.enrollment.enroll(env.body, peer_.remote);
  if (auto* no = std::get_if<Refusal>(&answer)) return refuse(*no);
  send(proto::type::kEnrolled, std::get<nlohmann::json>(std::move(answer)));
  conn_->close("enrolled; reconnect with the certificate");
}

void AgentSession::handle_hello(const proto::Envelope& env) {
  const auto& b = env.body;
  if (b.contains("tenant") && b["tenant"].is_string() &&
      b["tenant"].get<std::string>() != tenant_) {
    ++ctx_.feed.counters().connections_refused;
    spdlog::warn("agents: {} ({}) claimed to be tenant {}; refused", who(), peer_.remote,
                 b["tenant"].get<std::string>());
    send_error("permission_denied", "this certificate is for tenant " + tenant_ +
                                        "; it cannot act as tenant " +
                                        b["tenant"].get<std::string>());
    conn_->close("permission denied");
    return;
  }
  auto rec = ctx_.store.get_tenant(tenant_);
  agent_id_ = rec ? rec->agent.value("agent_id", "") : "";
  ctx_.sessions.attach(tenant_, shared_from_this());
  hello_done_ = true;
  feed::AgentPresence live;
  live.agent_id = agent_id_;
  live.version = b.value("agent_version", "");
  live.hostname = b.value("hostname", "");
  live.remote = peer_.remote;
  live.connected_since = format_rfc3339(Clock::now());
  live.last_seen = live.connected_since;
  if (rec && (rec->agent.value("version", "") != live.version)) {
    auto r = *rec;
    r.agent["version"] = live.version;
    (void)ctx_.store.put_tenant(r);
  }
  spdlog::info("agents: tenant {} connected from {} (agent {} {})", tenant_, peer_.remote,
               agent_id_, live.version);
  ctx_.feed.agent_connected(tenant_, std::move(live));
  send(proto::type::kWelcome, {{"tenant", tenant_},
                               {"agent_id", agent_id_},
                               {"server_version", ctx_.server_version},
                               {"last_event_id", ctx_.store.last_event_id(tenant_, agent_id_)}});
  ctx_.push_plan(tenant_);
}

void AgentSession::handle_event(const proto::Envelope& env) {
  auto answer = ctx_.ingestion.ingest(tenant_, agent_id_, env.body);
  if (auto* no = std::get_if<Refusal>(&answer)) return refuse(*no);
  send(proto::type::kAck, std::get<nlohmann::json>(std::move(answer)), env.seq);
}

void AgentSession::handle_heartbeat(const proto::Envelope& env) {
  ctx_.feed.agent_seen(tenant_, format_rfc3339(Clock::now()));
  send(proto::type::kAck, nlohmann::json::object(), env.seq);
}

void AgentSession::handle_renew(const proto::Envelope& env) {
  auto answer = ctx_.enrollment.renew(tenant_, env.body);
  if (auto* no = std::get_if<Refusal>(&answer)) return refuse(*no);
  send(proto::type::kCertificate, std::get<nlohmann::json>(std::move(answer)), env.seq);
}

}  // namespace factory::coordinator
