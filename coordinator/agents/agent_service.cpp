#include "coordinator/agents/agent_service.hpp"

#include <spdlog/spdlog.h>

#include "common/durations.hpp"
#include "common/pki.hpp"
#include "common/protocol.hpp"

namespace factory::coordinator {

namespace {

std::string now_str() { return format_rfc3339(Clock::now()); }

std::string normalize_serial(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  size_t nz = s.find_first_not_of('0');
  return nz == std::string::npos ? "0" : s.substr(nz);
}

bool serial_listed(const nlohmann::json& list, const std::string& serial) {
  if (!list.is_array()) return false;
  std::string want = normalize_serial(serial);
  for (auto& s : list)
    if (s.is_string() && normalize_serial(s.get<std::string>()) == want) return true;
  return false;
}

}  // namespace

// One websocket connection from an agent. Before enrollment (no client
// certificate) it can only enroll; after, it speaks for exactly one tenant:
// the one its certificate names.
class AgentService::Session : public net::WsHandler,
                              public std::enable_shared_from_this<AgentService::Session> {
 public:
  Session(AgentService& svc, net::PeerInfo peer, std::string tenant, std::string refusal)
      : svc_(svc), peer_(std::move(peer)), tenant_(std::move(tenant)), refusal_(std::move(refusal)) {}

  void on_open(std::shared_ptr<net::WsConnection> conn) override {
    conn_ = conn;
    if (!refusal_.empty()) {
      ++svc_.metrics_.connections_refused;
      spdlog::warn("agents: refusing {} ({})", peer_.remote, refusal_);
      send_error("unauthenticated", refusal_);
      conn->close("unauthenticated");
    }
  }

  void on_message(std::string_view text) override {
    if (!refusal_.empty()) return;
    auto env = proto::parse(text);
    if (!env) {
      ++svc_.metrics_.frames_rejected;
      spdlog::warn("agents: bad frame from {} ({}): {}", who(), peer_.remote, env.error().message);
      send_error("bad_frame", env.error().message);
      return;
    }
    const std::string& type = env->type;
    if (tenant_.empty()) {
      if (type == proto::type::kEnroll) return handle_enroll(*env);
      send_error("unauthenticated",
                 "this connection has no client certificate: it may only enroll");
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
    ++svc_.metrics_.frames_unknown_type;
    spdlog::warn("agents: ignoring frame of unknown type '{}' from {}", type, who());
  }

  void on_close(std::string_view reason) override {
    if (tenant_.empty() || !hello_done_) return;
    auto it = svc_.sessions_.find(tenant_);
    if (it != svc_.sessions_.end() && it->second.get() == this) {
      svc_.sessions_.erase(it);
      auto& live = svc_.live_[tenant_];
      live.connected = false;
      live.last_seen = now_str();
      spdlog::info("agents: {} disconnected ({})", who(), reason);
    }
  }

  void send(std::string_view type, nlohmann::json body, std::optional<uint64_t> ack = {}) {
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

  void close(std::string_view reason) {
    if (conn_) conn_->close(reason);
  }

 private:
  std::string who() const { return tenant_.empty() ? "unenrolled agent" : "tenant " + tenant_; }

  void send_error(const std::string& code, const std::string& message) {
    send(proto::type::kError, {{"code", code}, {"message", message}});
  }

  void handle_enroll(const proto::Envelope& env) {
    const auto& b = env.body;
    if (!b.contains("token") || !b["token"].is_string() || !b.contains("csr") ||
        !b["csr"].is_string()) {
      ++svc_.metrics_.enrollments_refused;
      send_error("bad_request", "enroll needs 'token' and 'csr'");
      return;
    }
    const std::string token = b["token"].get<std::string>();
    const std::string csr = b["csr"].get<std::string>();
    std::string token_id = token.substr(0, token.find('.'));
    if (token_id.size() > 16) token_id = "?";
    // Check the CSR before the token is spent: a malformed CSR must not cost
    // the guest its one-time token.
    if (auto probe = svc_.ca_.sign_agent_csr(csr, "probe", std::chrono::seconds(60)); !probe) {
      ++svc_.metrics_.enrollments_refused;
      spdlog::warn("agents: enrollment from {} refused: {}", peer_.remote, probe.error().message);
      send_error("enrollment_refused", probe.error().message);
      conn_->close("enrollment refused");
      return;
    }
    auto tenant = svc_.tokens_.redeem(token);
    if (!tenant) {
      ++svc_.metrics_.enrollments_refused;
      spdlog::warn("agents: enrollment from {} with token {} refused: {}", peer_.remote, token_id,
                   tenant.error().message);
      send_error("enrollment_refused", tenant.error().message);
      conn_->close("enrollment refused");
      return;
    }
    auto cert = svc_.ca_.sign_agent_csr(csr, *tenant, svc_.opts_.cert_ttl);
    if (!cert) {
      ++svc_.metrics_.enrollments_refused;
      send_error("enrollment_refused", cert.error().message);
      conn_->close("enrollment refused");
      return;
    }
    auto rec = svc_.store_.get_tenant(*tenant).value_or(store::TenantRecord{});
    if (rec.name.empty()) {
      rec.name = *tenant;
      rec.created_at = now_str();
    }
    std::string agent_id = pki::random_hex(8);
    rec.agent = {{"agent_id", agent_id},
                 {"cert_serials", nlohmann::json::array({cert->serial_hex})},
                 {"certificate_expires_at", format_rfc3339(cert->not_after)},
                 {"enrolled_at", now_str()},
                 {"hostname", env.body.value("hostname", "")},
                 {"version", env.body.value("agent_version", "")}};
    if (rec.phase == "pending") rec.phase = "enrolled";
    if (auto st = svc_.store_.put_tenant(rec); !st.ok()) {
      spdlog::error("agents: enrollment of {} not recorded: {}", *tenant, st.error().message);
      send_error("internal", "the coordinator could not record the enrollment; retry later");
      conn_->close("internal");
      return;
    }
    ++svc_.metrics_.enrollments_accepted;
    spdlog::info("agents: tenant {} enrolled agent {} from {} (token {}, certificate {})", *tenant,
                 agent_id, peer_.remote, token_id, cert->serial_hex);
    send(proto::type::kEnrolled, {{"tenant", *tenant},
                                  {"agent_id", agent_id},
                                  {"certificate", cert->certificate_pem},
                                  {"ca", svc_.ca_.certificate_pem()},
                                  {"expires_at", format_rfc3339(cert->not_after)}});
    conn_->close("enrolled; reconnect with the certificate");
  }

  void handle_hello(const proto::Envelope& env) {
    const auto& b = env.body;
    if (b.contains("tenant") && b["tenant"].is_string() && b["tenant"].get<std::string>() != tenant_) {
      ++svc_.metrics_.connections_refused;
      spdlog::warn("agents: {} ({}) claimed to be tenant {}; refused", who(), peer_.remote,
                   b["tenant"].get<std::string>());
      send_error("permission_denied", "this certificate is for tenant " + tenant_ +
                                          "; it cannot act as tenant " + b["tenant"].get<std::string>());
      conn_->close("permission denied");
      return;
    }
    auto rec = svc_.store_.get_tenant(tenant_);
    agent_id_ = rec ? rec->agent.value("agent_id", "") : "";
    if (auto it = svc_.sessions_.find(tenant_); it != svc_.sessions_.end() && it->second.get() != this) {
      spdlog::info("agents: tenant {} reconnected; closing its previous connection", tenant_);
      it->second->close("replaced by a newer connection");
    }
    hello_done_ = true;
    svc_.sessions_[tenant_] = shared_from_this();
    auto& live = svc_.live_[tenant_];
    live.connected = true;
    live.agent_id = agent_id_;
    live.version = b.value("agent_version", "");
    live.hostname = b.value("hostname", "");
    live.remote = peer_.remote;
    live.connected_since = now_str();
    live.last_seen = live.connected_since;
    if (rec && (rec->agent.value("version", "") != live.version)) {
      auto r = *rec;
      r.agent["version"] = live.version;
      (void)svc_.store_.put_tenant(r);
    }
    spdlog::info("agents: tenant {} connected from {} (agent {} {})", tenant_, peer_.remote,
                 agent_id_, live.version);
    send(proto::type::kWelcome,
         {{"tenant", tenant_},
          {"agent_id", agent_id_},
          {"server_version", svc_.opts_.server_version},
          {"last_event_id", svc_.store_.last_event_id(tenant_, agent_id_)}});
    svc_.push_plan(tenant_);
  }

  void handle_event(const proto::Envelope& env) {
    const auto& b = env.body;
    if (!b.contains("id") || !b["id"].is_number_unsigned() || b["id"].get<uint64_t>() == 0 ||
        !b.contains("kind") || !b["kind"].is_string()) {
      ++svc_.metrics_.frames_rejected;
      send_error("bad_event", "an event needs a positive integer 'id' and a string 'kind'");
      return;
    }
    touch();
    store::StoredEvent e;
    e.agent_id = agent_id_;
    e.id = b["id"].get<uint64_t>();
    e.received_at = now_str();
    e.event = b;
    auto stored = svc_.store_.append_event(tenant_, e);
    if (!stored) {
      // Not acknowledged: the agent keeps it and sends it again.
      spdlog::error("agents: could not store event {} of {}: {}", e.id, tenant_,
                    stored.error().message);
      send_error("store_failed", "event not stored; it will be resent");
      return;
    }
    if (*stored) {
      ++svc_.metrics_.events_stored;
      auto rec = svc_.store_.get_tenant(tenant_);
      if (rec && project_event(*rec, b)) {
        if (auto st = svc_.store_.put_tenant(*rec); !st.ok())
          spdlog::error("agents: status of {} not saved: {}", tenant_, st.error().message);
      }
    } else {
      ++svc_.metrics_.events_duplicate;
    }
    send(proto::type::kAck, {{"event_id", e.id}}, env.seq);
  }

  void handle_heartbeat(const proto::Envelope& env) {
    touch();
    send(proto::type::kAck, nlohmann::json::object(), env.seq);
  }

  void handle_renew(const proto::Envelope& env) {
    if (!env.body.contains("csr") || !env.body["csr"].is_string()) {
      send_error("bad_request", "renew needs 'csr'");
      return;
    }
    auto cert = svc_.ca_.sign_agent_csr(env.body["csr"].get<std::string>(), tenant_,
                                        svc_.opts_.cert_ttl);
    if (!cert) {
      send_error("renewal_refused", cert.error().message);
      return;
    }
    auto rec = svc_.store_.get_tenant(tenant_);
    if (!rec) {
      send_error("renewal_refused", "tenant " + tenant_ + " no longer exists");
      return;
    }
    // Keep the previous serial valid until the agent reconnects with the new one.
    auto serials = rec->agent.value("cert_serials", nlohmann::json::array());
    serials.push_back(cert->serial_hex);
    while (serials.size() > 2) serials.erase(serials.begin());
    rec->agent["cert_serials"] = serials;
    rec->agent["certificate_expires_at"] = format_rfc3339(cert->not_after);
    if (auto st = svc_.store_.put_tenant(*rec); !st.ok()) {
      send_error("internal", "renewal not recorded; retry later");
      return;
    }
    ++svc_.metrics_.certificates_renewed;
    spdlog::info("agents: renewed the certificate of {} (serial {}, until {})", tenant_,
                 cert->serial_hex, format_rfc3339(cert->not_after));
    send(proto::type::kCertificate, {{"certificate", cert->certificate_pem},
                                     {"expires_at", format_rfc3339(cert->not_after)}},
         env.seq);
  }

  void touch() {
    auto it = svc_.live_.find(tenant_);
    if (it != svc_.live_.end()) it->second.last_seen = now_str();
  }

  AgentService& svc_;
  net::PeerInfo peer_;
  std::string tenant_;
  std::string refusal_;
  std::string agent_id_;
  std::shared_ptr<net::WsConnection> conn_;
  uint64_t out_seq_ = 0;
  bool hello_done_ = false;
};

AgentService::AgentService(store::Store& store, const enroll::CertificateAuthority& ca,
                           enroll::TokenBook& tokens, AgentServiceOptions opts)
    : store_(store), ca_(ca), tokens_(tokens), opts_(std::move(opts)) {}

AgentService::~AgentService() = default;

std::shared_ptr<net::WsHandler> AgentService::accept(const net::HttpRequestIn& req,
                                                     const net::PeerInfo& peer) {
  if (req.path != proto::kAgentPath) return nullptr;
  if (!peer.has_client_cert) return std::make_shared<Session>(*this, peer, "", "");
  std::string refusal;
  if (peer.subject_o != "factory-agent") {
    refusal = "the client certificate is not an agent certificate";
  } else {
    auto rec = store_.get_tenant(peer.subject_cn);
    if (!rec)
      refusal = "tenant " + peer.subject_cn + " no longer exists; this agent's certificate is void";
    else if (!serial_listed(rec->agent.value("cert_serials", nlohmann::json::array()),
                            peer.serial_hex))
      refusal = "certificate " + peer.serial_hex + " of tenant " + peer.subject_cn +
                " was revoked or replaced; enroll again with a new token";
  }
  return std::make_shared<Session>(*this, peer, peer.subject_cn, refusal);
}

bool AgentService::send_command(const std::string& tenant, const nlohmann::json& body) {
  auto it = sessions_.find(tenant);
  if (it == sessions_.end()) return false;
  it->second->send(proto::type::kCommand, body);
  return true;
}

void AgentService::push_plan(const std::string& tenant) {
  auto it = sessions_.find(tenant);
  if (it == sessions_.end() || !plan_provider_) return;
  auto rec = store_.get_tenant(tenant);
  if (!rec) return;
  if (auto plan = plan_provider_(*rec)) it->second->send(proto::type::kPlan, *plan);
}

Status AgentService::revoke(const std::string& tenant) {
  auto rec = store_.get_tenant(tenant);
  if (rec) {
    rec->agent["cert_serials"] = nlohmann::json::array();
    rec->agent["revoked_at"] = now_str();
    if (auto st = store_.put_tenant(*rec); !st.ok()) return st;
  }
  if (auto r = tokens_.revoke_tenant(tenant); !r) return r.error();
  if (auto it = sessions_.find(tenant); it != sessions_.end()) it->second->close("revoked");
  return {};
}

std::optional<AgentService::Live> AgentService::live(const std::string& tenant) const {
  auto it = live_.find(tenant);
  if (it == live_.end()) return std::nullopt;
  return it->second;
}

size_t AgentService::connected_count() const { return sessions_.size(); }

nlohmann::json AgentService::tenant_json(const store::TenantRecord& t) const {
  nlohmann::json agent = {{"connected", false}};
  if (auto l = live(t.name)) {
    agent["connected"] = l->connected;
    agent["version"] = l->version;
    agent["hostname"] = l->hostname;
    agent["connected_since"] = l->connected ? l->connected_since : "";
    agent["last_seen"] = l->last_seen;
    agent["remote_address"] = l->remote;
  } else {
    agent["version"] = t.agent.value("version", "");
    agent["hostname"] = t.agent.value("hostname", "");
    agent["last_seen"] = "";
  }
  agent["agent_id"] = t.agent.value("agent_id", "");
  agent["enrolled_at"] = t.agent.value("enrolled_at", "");
  agent["certificate_expires_at"] = t.agent.value("certificate_expires_at", "");
  nlohmann::json j = {{"name", t.name},
                      {"tier", t.tier},
                      {"phase", t.phase},
                      {"created_at", t.created_at},
                      {"agent", agent},
                      {"events_stored", store_.event_count(t.name)}};
  for (auto& [k, v] : t.status.items()) j[k] = v;
  if (!t.spec.empty()) j["spec"] = t.spec;
  return j;
}

nlohmann::json AgentService::status_json() const {
  nlohmann::json list = nlohmann::json::array();
  for (auto& t : store_.list_tenants()) list.push_back(tenant_json(t));
  return {{"tenants", list}};
}

bool project_event(store::TenantRecord& t, const nlohmann::json& ev) {
  const std::string kind = ev.value("kind", "");
  nlohmann::json clean = ev;
  clean.erase("id");
  if (kind == "progress") {
    auto& plan = t.status["plan"];
    if (!plan.is_object()) plan = nlohmann::json::object();
    std::string step = ev.value("step", "");
    if (step.empty()) return false;
    if (ev.contains("plan_hash")) plan["hash"] = ev["plan_hash"];
    auto& steps = plan["steps"];
    if (!steps.is_object()) steps = nlohmann::json::object();
    auto& s = steps[step];
    if (!s.is_object()) s = nlohmann::json::object();
    for (auto& [k, v] : clean.items())
      if (k != "kind" && k != "step" && k != "plan_hash") s[k] = v;
    if (t.phase == "pending" || t.phase == "enrolled") t.phase = "provisioning";
    return true;
  }
  if (kind == "plan") {
    auto& plan = t.status["plan"];
    if (!plan.is_object()) plan = nlohmann::json::object();
    for (auto& [k, v] : clean.items())
      if (k != "kind") plan[k == "plan_hash" ? "hash" : k] = v;
    std::string state = ev.value("state", "");
    if (state == "running") t.phase = "provisioning";
    else if (state == "succeeded") t.phase = "ready";
    else if (state == "failed") t.phase = "failed";
    return true;
  }
  if (kind == "health") {
    clean.erase("kind");
    t.status["health"] = clean;
    return true;
  }
  if (kind == "diagnosis") {
    auto& d = t.status["diagnoses"];
    if (!d.is_object()) d = nlohmann::json::object();
    d[ev.value("code", "unknown")] = clean;
    return true;
  }
  return false;
}

}  // namespace factory::coordinator
