#include "coordinator/agents/session.hpp"

#include <spdlog/spdlog.h>

#include "common/durations.hpp"
#include "coordinator/agents/card_faults.hpp"
#include "coordinator/agents/projection.hpp"

namespace factory::coordinator {

void SessionRegistry::attach(const std::string& tenant, const std::shared_ptr<AgentSession>& s) {
  std::shared_ptr<AgentSession> replaced;
  {
    std::lock_guard lk(mu_);
    auto& slot = by_tenant_[tenant];
    if (slot && slot != s) replaced = slot;
    slot = s;
  }
  if (replaced) {
    spdlog::info("agents: tenant {} reconnected; closing its previous connection", tenant);
    replaced->end("replaced", "replaced by a newer connection");
  }
}

bool SessionRegistry::detach(const std::string& tenant, const AgentSession* s) {
  std::lock_guard lk(mu_);
  auto it = by_tenant_.find(tenant);
  if (it == by_tenant_.end() || it->second.get() != s) return false;
  by_tenant_.erase(it);
  return true;
}

std::shared_ptr<AgentSession> SessionRegistry::find(const std::string& tenant) const {
  std::lock_guard lk(mu_);
  auto it = by_tenant_.find(tenant);
  return it == by_tenant_.end() ? nullptr : it->second;
}

std::size_t SessionRegistry::size() const {
  std::lock_guard lk(mu_);
  return by_tenant_.size();
}

namespace {

// A finished step's duration, from the times its agent stamped on its
// "started" and last events (projection.cpp keeps started_at): the metric
// measures the guest's work, not when the events happened to arrive.
void observe_step_duration(feed::FeedState& feed, const SessionContext& ctx,
                           const store::TenantRecord& t, const nlohmann::json& ev) {
  const std::string state = ev.value("state", "");
  if (state != "succeeded" && state != "failed") return;
  const std::string step = ev.value("step", "");
  if (!t.status.plan || !t.status.plan->steps) return;
  auto it = t.status.plan->steps->find(step);
  if (it == t.status.plan->steps->end()) return;
  auto start = parse_rfc3339(it->second.started_at.value_or(""));
  auto end = parse_rfc3339(ev.value("time", ""));
  if (!start || !end || *end < *start) return;
  std::string kind = ctx.step_kind ? ctx.step_kind(t, step) : "";
  if (kind.empty()) return;  // not a step of the plan the coordinator sent
  feed.observe_step(t.tier, kind, state, std::chrono::duration<double>(*end - *start).count());
}

// What the feed calls the end of a connection. An agent that stops on
// purpose says so in its close frame (factory-agent: "stopping",
// "rebooting"); anything else the agent did not announce is "lost".
std::string disconnect_kind(const net::CloseInfo& info, const std::string& ended_as) {
  if (!ended_as.empty()) return ended_as;
  if (info.by_peer) {
    if (info.reason == "stopping") return "stopped";
    if (info.reason == "rebooting") return "rebooting";
    return "closed";
  }
  return "lost";
}

}  // namespace

void AgentSession::on_open(std::shared_ptr<net::WsConnection> conn) {
  conn_ = conn;
  if (!refusal_.empty()) {
    ++ctx_.feed.counters().connections_refused;
    spdlog::warn("agents: refusing {} ({})", peer_.remote, refusal_);
    send_error("unauthenticated", refusal_);
    conn->close("unauthenticated");
  }
}

namespace {

// What an agent sent may be as long as its frame; a log line or an error
// frame quotes only the start of it.
std::string shortened(std::string_view s, std::size_t max = 200) {
  if (s.size() <= max) return std::string(s);
  return std::string(s.substr(0, max)) + "...";
}

}  // namespace

void AgentSession::on_message(std::string_view text) {
  if (!refusal_.empty() || closed_ || ending_) return;
  auto env = proto::parse(text);
  if (!env) {
    ++ctx_.feed.counters().frames_rejected;
    ctx_.ingestion.count(tenant_, "bad_frame");
    const std::string why = shortened(env.error().message);
    spdlog::warn("agents: bad frame from {} ({}): {}", who(), peer_.remote, why);
    send_error("bad_frame", why);
    return;
  }
  const std::string& type = env->type;
  if (tenant_.empty()) {
    if (type == proto::type::kEnroll) return handle_enroll(*env);
    send_error("unauthenticated", "this connection has no client certificate: it may only enroll");
    conn_->close("unauthenticated");
    return;
  }
  if (peer_.client_cert_expired) {
    // The one thing an expired certificate is good for (Enrollment::
    // certificate_refusal decided it is still within the grace).
    if (type == proto::type::kRenew) return handle_renew(*env);
    send_error("certificate_expired",
               "this certificate expired at " +
                   format_rfc3339(Clock::time_point(std::chrono::seconds(peer_.not_after_unix))) +
                   ": a connection with it may only renew it (send renew first)");
    conn_->close("certificate expired");
    return;
  }
  // Every frame of an enrolled agent takes its share of the tenant's quota
  // before it is read; an event also its bytes.
  if (auto no = ctx_.ingestion.admit(tenant_, type == proto::type::kEvent ? text.size() : 0))
    return refuse(*no);
  if (type == proto::type::kHello) return handle_hello(*env);
  if (!hello_done_) {
    send_error("bad_sequence", "send hello first");
    return;
  }
  if (type == proto::type::kEvent) return handle_event(*env);
  if (type == proto::type::kHeartbeat) return handle_heartbeat(*env);
  if (type == proto::type::kHealth) return handle_health(env->body);
  if (type == proto::type::kRenew) return handle_renew(*env);
  if (type == proto::type::kEndpointCsr) return handle_endpoint_csr(*env);
  if (type == proto::type::kAck) return;
  if (type == proto::type::kError) {
    auto m = env->body.find("message");
    std::string message = m != env->body.end() && m->is_string() ? m->get<std::string>() : "";
    spdlog::warn("agents: {} reports an error: {}", who(), shortened(message, 1024));
    return;
  }
  ++ctx_.feed.counters().frames_unknown_type;
  ctx_.ingestion.count(tenant_, "unknown_type");
  spdlog::warn("agents: ignoring frame of unknown type '{}' from {}", shortened(type, 64), who());
}

void AgentSession::on_close(const net::CloseInfo& info) {
  closed_ = true;
  if (tenant_.empty() || !hello_done_) return;
  if (ctx_.sessions.detach(tenant_, this)) {
    std::string how = disconnect_kind(info, ended_as_);
    ctx_.feed.agent_disconnected(tenant_, format_rfc3339(Clock::now()), how, info.reason);
    spdlog::info("agents: {} disconnected: {} ({})", who(), how, info.reason);
  }
}

void AgentSession::deliver(std::string type, nlohmann::json body) {
  if (!conn_) return;
  conn_->post(
      [self = shared_from_this(), type = std::move(type), body = std::move(body)]() mutable {
        if (!self->closed_) self->send(type, std::move(body));
      });
}

void AgentSession::end(const std::string& why, const std::string& reason) {
  if (!conn_) return;
  conn_->post([self = shared_from_this(), why, reason] {
    if (self->closed_) return;
    self->ended_as_ = why;
    self->conn_->close(reason);
  });
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

std::string AgentSession::who() const {
  return tenant_.empty() ? "unenrolled agent" : "tenant " + tenant_;
}

void AgentSession::send_error(const std::string& code, const std::string& message,
                              const nlohmann::json& extra) {
  nlohmann::json body = extra.is_object() ? extra : nlohmann::json::object();
  body["code"] = code;
  body["message"] = message;
  send(proto::type::kError, std::move(body));
}

void AgentSession::refuse(const Refusal& r) {
  send_error(r.code, r.message, r.extra);
  if (!r.close_reason.empty()) {
    ending_ = true;
    conn_->close(r.close_reason);
  }
}

void AgentSession::handle_enroll(const proto::Envelope& env) {
  if (enrolling_) {
    send_error("bad_sequence", "an enrollment is already in progress on this connection");
    return;
  }
  // Decoded here, on the io thread: a malformed request costs a stranger
  // nothing of the workers' time.
  auto req = decode_enroll(env.body);
  ctx_.ingestion.count("", "enroll", req.rejected);
  if (!req.value) {
    ++ctx_.feed.counters().enrollments_refused;
    return refuse(Refusal{"bad_request", req.refusal, "enrollment refused"});
  }
  enrolling_ = true;
  // A token check, a signature, the token book and the store: on a worker.
  bool queued = ctx_.workers.post([self = shared_from_this(), req = std::move(*req.value)] {
    auto answer = self->ctx_.enrollment.enroll(req, self->peer_.remote);
    self->conn_->post([self, answer = std::move(answer)]() mutable {
      self->enrolling_ = false;
      if (self->closed_) return;
      if (auto* no = std::get_if<Refusal>(&answer)) return self->refuse(*no);
      self->send(proto::type::kEnrolled, std::get<nlohmann::json>(std::move(answer)));
      self->conn_->close("enrolled; reconnect with the certificate", 1000);
    });
  });
  if (!queued) send_error("unavailable", "the coordinator is stopping; enroll again shortly");
}

void AgentSession::handle_hello(const proto::Envelope& env) {
  auto decoded = decode_hello(env.body);
  ctx_.ingestion.count(tenant_, "hello", decoded.rejected);
  const AgentHello& h = *decoded.value;
  if (h.tenant && *h.tenant != tenant_) {
    ++ctx_.feed.counters().connections_refused;
    spdlog::warn("agents: {} ({}) claimed to be tenant {}; refused", who(), peer_.remote,
                 *h.tenant);
    send_error("permission_denied", "this certificate is for tenant " + tenant_ +
                                        "; it cannot act as tenant " + *h.tenant);
    ending_ = true;
    conn_->close("permission denied");
    return;
  }
  if (hello_done_) return;
  {
    std::lock_guard lk(features_mu_);
    features_ = h.features;
  }
  auto rec = ctx_.store.get_tenant(tenant_);
  agent_id_ = rec ? rec->agent.agent_id.value_or("") : "";
  if (rec && ctx_.plan_steps)
    if (auto ids = ctx_.plan_steps(*rec)) plan_steps_.emplace(ids->begin(), ids->end());
  ctx_.sessions.attach(tenant_, shared_from_this());
  hello_done_ = true;
  feed::AgentPresence live;
  live.agent_id = agent_id_;
  live.version = h.agent_version;
  live.hostname = h.hostname;
  live.remote = peer_.remote;
  live.connected_since = format_rfc3339(Clock::now());
  live.last_seen = live.connected_since;
  if (rec && (rec->agent.version.value_or("") != live.version)) {
    // Recorded by the store's writer; nothing here waits for it.
    ctx_.store.update_tenant_async(
        tenant_,
        [v = live.version](store::TenantRecord& r) {
          r.agent.version = v;
          return Status{};
        },
        nullptr);
  }
  spdlog::info("agents: tenant {} connected from {} (agent {} {})", tenant_, peer_.remote,
               agent_id_, live.version);
  ctx_.feed.agent_connected(tenant_, std::move(live));
  send(proto::type::kWelcome, {{"tenant", tenant_},
                               {"agent_id", agent_id_},
                               {"server_version", ctx_.server_version},
                               {"last_event_id", ctx_.store.last_event_id(tenant_, agent_id_)}});
  ctx_.push_plan(tenant_);
  // A model endpoint learns its key's hash on every session: a rotation
  // made while the guest was away takes effect as soon as it is back.
  if (auto offer = ctx_.endpoints.offer(tenant_)) send(proto::type::kEndpoint, std::move(*offer));
}

// A tier upgrade begun since the hello may add steps to the plan: the
// record (read from memory) says so once the upgrade is journaled.
bool AgentSession::tier_upgrade_step(const std::string& step) {
  auto rec = ctx_.store.get_tenant(tenant_);
  if (!rec || !ctx_.plan_steps) return false;
  auto ids = ctx_.plan_steps(*rec);
  if (!ids) return false;
  plan_steps_.emplace(ids->begin(), ids->end());
  return plan_steps_->contains(step);
}

std::vector<std::string> AgentSession::features() const {
  std::lock_guard lk(features_mu_);
  return features_;
}

void AgentSession::handle_event(const proto::Envelope& env) {
  auto checked = ctx_.ingestion.check(tenant_, env.body);
  if (auto* no = std::get_if<Refusal>(&checked)) return refuse(*no);
  IngestedEvent in = std::get<IngestedEvent>(std::move(checked));
  if (const auto* p = std::get_if<ProgressEvent>(&in.event.body);
      p && plan_steps_ && !plan_steps_->contains(p->step) && !tier_upgrade_step(p->step)) {
    // What it would add to the tenant's record is bounded by the plan: a
    // step the plan does not have is refused (not stored, not acknowledged;
    // the agent's next acknowledged event passes it) and counted.
    ctx_.ingestion.count(tenant_, "unknown_step");
    ++ctx_.feed.counters().frames_rejected;
    return refuse(Refusal{
        "bad_event",
        "progress for step '" + p->step.substr(0, 64) + "', which is not in this tenant's plan",
        ""});
  }
  // Usage under a key its tenant does not have is stored (the event is the
  // agent's word) but counted nowhere: the projection ignores it, and the
  // attempt is counted here, where the metric of rejected messages is.
  if (const auto* u = std::get_if<EndpointUsageReport>(&in.event.body)) {
    auto rec = ctx_.store.get_tenant(tenant_);
    if (!rec || !endpoint_key_known(*rec, u->usage.key))
      ctx_.ingestion.count(tenant_, "unknown_endpoint_key");
  }
  store::StoredEvent e = std::move(in.stored);
  e.agent_id = agent_id_;
  const uint64_t id = e.id;
  const uint64_t seq = env.seq;
  auto failed = store_failed_;
  // What the feed's counters and readers get: the decoded event, its
  // output tail as the record keeps it (the history keeps the whole).
  nlohmann::json body = std::move(in.tree);
  if (auto t = body.find("output_tail"); t != body.end() && t->is_string())
    *t = last_bytes(t->get_ref<const std::string&>());
  // A health sample sent as an event (an agent older than the health
  // frame) is health all the same: the latest sample, not the record.
  if (const auto* h = std::get_if<HealthEvent>(&in.event.body)) handle_health(h->report);
  ctx_.store.append_event(
      tenant_, std::move(e),
      [event = std::move(in.event)](store::TenantRecord& t) { return project_event(t, event); },
      // On the store's writer thread: count, then come back to this session.
      [self = shared_from_this(), id, seq, failed,
       body = std::move(body)](Result<store::AppendOutcome> r) mutable {
        if (!r) {
          failed->store(true);
        } else if (r->stored) {
          ++self->ctx_.feed.counters().events_stored;
          self->ctx_.feed.count_event(body.value("kind", ""));
          if (r->record && body.value("kind", "") == "progress")
            observe_step_duration(self->ctx_.feed, self->ctx_, *r->record, body);
          // The store calls this once: the feed takes the tree.
          self->ctx_.feed.event_stored(self->tenant_, std::move(body),
                                       r->record ? &*r->record : nullptr);
        } else {
          ++self->ctx_.feed.counters().events_duplicate;
        }
        // Back to the io thread with the outcome, not the record (which may
        // be large, and is the store's and the feed's business by now).
        std::optional<std::string> failure;
        if (!r) failure = r.error().message;
        self->conn_->post([self, id, seq, failure = std::move(failure)] {
          if (self->closed_) return;
          if (failure) {
            // Never acknowledge past an event that is not stored: the agent
            // keeps everything from this one on and sends it again.
            ++self->ctx_.feed.counters().store_failures;
            if (auto v = self->ctx_.store_failure_log.admit(); v.log)
              spdlog::error("agents: could not store event {} of {}: {}; closing the session{}", id,
                            self->tenant_, *failure, v.note());
            self->send_error("store_failed", "event " + std::to_string(id) +
                                                 " not stored; reconnect and send it again");
            self->conn_->close("store failed", 1011);
            return;
          }
          self->send(proto::type::kAck, {{"event_id", id}}, seq);
        });
      },
      [failed] { return !failed->load(); });
}

void AgentSession::handle_heartbeat(const proto::Envelope& env) {
  auto hb = decode_heartbeat(env.body);
  ctx_.ingestion.count(tenant_, "heartbeat", hb.rejected);
  ctx_.feed.agent_seen(tenant_, format_rfc3339(Clock::now()));
  ctx_.feed.agent_spool(tenant_, hb.value->pending_events, hb.value->dropped_events);
  send(proto::type::kAck, nlohmann::json::object(), env.seq);
}

void AgentSession::handle_health(const nlohmann::json& body) {
  // Not acknowledged: health is state, and the next sample supersedes this one.
  if (auto kept = ctx_.ingestion.health(tenant_, body)) {
    ctx_.feed.health_changed(tenant_, *kept);
    note_card_faults(*kept);
    ctx_.store.put_health(tenant_, std::move(kept));
  }
}

void AgentSession::note_card_faults(const store::LatestHealth& health) {
  auto faults = card_faults(health);
  if (faults.empty()) return;
  if (!fault_keys_read_) {
    fault_keys_read_ = true;
    if (auto t = ctx_.store.get_tenant(tenant_); t && t->status.gpu_faults)
      for (const auto& [k, v] : *t->status.gpu_faults) fault_keys_.insert(k);
  }
  std::vector<CardFault> fresh;
  for (auto& f : faults)
    if (fault_keys_.insert(f.key).second) fresh.push_back(std::move(f));
  if (fresh.empty()) return;
  // On the store's writer: never waited for here. Announced once durable.
  ctx_.store.update_tenant_async(
      tenant_,
      [fresh](store::TenantRecord& t) -> Status {
        record_card_faults(t.status, fresh);
        return ok_status();
      },
      [feed = &ctx_.feed, tenant = tenant_, fresh](Result<store::TenantRecord> r) {
        if (!r) {
          spdlog::error("agents: tenant {}: card fault not recorded: {}", tenant,
                        r.error().message);
          return;
        }
        for (const auto& f : fresh) feed->bus().publish("gpu_fault", tenant, f.to_json());
      });
}

void AgentSession::handle_renew(const proto::Envelope& env) {
  if (renewing_) {
    send_error("bad_sequence", "a renewal is already in progress");
    return;
  }
  auto req = decode_renew(env.body);
  ctx_.ingestion.count(tenant_, "renew", req.rejected);
  if (!req.value) return refuse(Refusal{"bad_request", req.refusal, ""});
  renewing_ = true;
  const uint64_t seq = env.seq;
  bool queued = ctx_.workers.post([self = shared_from_this(), req = std::move(*req.value), seq] {
    auto answer = self->ctx_.enrollment.renew(self->tenant_, self->peer_.serial_hex, req);
    self->conn_->post([self, seq, answer = std::move(answer)]() mutable {
      self->renewing_ = false;
      if (self->closed_) return;
      if (auto* no = std::get_if<Refusal>(&answer)) return self->refuse(*no);
      self->send(proto::type::kCertificate, std::get<nlohmann::json>(std::move(answer)), seq);
      // An expired certificate has done the one thing it may: the agent
      // comes back with the new one.
      if (self->peer_.client_cert_expired)
        self->conn_->close("renewed; reconnect with the new certificate", 1000);
    });
  });
  if (!queued) {
    renewing_ = false;
    send_error("unavailable", "the coordinator is stopping; renew again shortly");
  }
}

void AgentSession::handle_endpoint_csr(const proto::Envelope& env) {
  constexpr int kMaxEndpointSignaturesPerSession = 3;
  if (endpoint_signing_) {
    send_error("bad_sequence", "an endpoint certificate is being signed already");
    return;
  }
  if (endpoint_signatures_ >= kMaxEndpointSignaturesPerSession) {
    send_error("over_quota", "this session had its endpoint certificates; reconnect for another");
    return;
  }
  auto req = decode_renew(env.body);
  ctx_.ingestion.count(tenant_, "endpoint_csr", req.rejected);
  if (!req.value) return refuse(Refusal{"bad_request", "endpoint_csr needs 'csr' (a PEM CSR)", ""});
  endpoint_signing_ = true;
  const uint64_t seq = env.seq;
  bool queued =
      ctx_.workers.post([self = shared_from_this(), csr = std::move(req.value->csr), seq] {
        auto answer = self->ctx_.endpoints.sign(self->tenant_, csr);
        self->conn_->post([self, seq, answer = std::move(answer)]() mutable {
          self->endpoint_signing_ = false;
          if (self->closed_) return;
          if (auto* no = std::get_if<Refusal>(&answer)) {
            self->send_error(no->code, no->message);
            return;
          }
          ++self->endpoint_signatures_;
          self->send(proto::type::kEndpoint, std::get<nlohmann::json>(std::move(answer)), seq);
        });
      });
  if (!queued) {
    endpoint_signing_ = false;
    send_error("unavailable", "the coordinator is stopping; ask again shortly");
  }
}

}  // namespace factory::coordinator
