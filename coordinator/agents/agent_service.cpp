#include "coordinator/agents/agent_service.hpp"

#include "contract/protocol.hpp"

namespace factory::coordinator {

AgentService::AgentService(store::Store& store, const enroll::CertificateAuthority& ca,
                           enroll::Tokens& tokens, feed::FeedState& feed, WorkerPool& workers,
                           AgentServiceOptions opts)
    : store_(store),
      feed_(feed),
      enrollment_(store, ca, tokens, feed.counters(), opts.cert_ttl, opts.renewal_grace),
      ingestion_(feed, opts.quotas),
      endpoints_(store, std::move(opts.endpoint_ca)),
      ctx_{store,
           feed,
           enrollment_,
           ingestion_,
           sessions_,
           workers,
           endpoints_,
           [this](const std::string& tenant) { push_plan(tenant); },
           [this](const store::TenantRecord& t, const std::string& step) {
             return step_kind(t, step);
           },
           [this](const store::TenantRecord& t) { return plan_steps(t); },
           std::move(opts.server_version)} {}

std::optional<std::vector<std::string>> AgentService::plan_steps(
    const store::TenantRecord& t) const {
  if (plan_step_ids_) return plan_step_ids_(t);
  if (!plan_provider_) return std::nullopt;
  auto plan = plan_provider_(t);
  if (!plan || !plan->contains("plan")) return std::nullopt;
  std::vector<std::string> ids;
  for (const auto& s : (*plan)["plan"].value("steps", nlohmann::json::array()))
    if (s.contains("id") && s["id"].is_string()) ids.push_back(s["id"].get<std::string>());
  return ids;
}

std::string AgentService::step_kind(const store::TenantRecord& t, const std::string& step) const {
  if (!plan_provider_) return "";
  auto plan = plan_provider_(t);
  if (!plan || !plan->contains("plan")) return "";
  for (const auto& s : (*plan)["plan"].value("steps", nlohmann::json::array()))
    if (s.value("id", "") == step) return s.value("kind", "");
  return "";
}

std::shared_ptr<net::WsHandler> AgentService::accept(const net::HttpRequestIn& req,
                                                     const net::PeerInfo& peer) {
  if (req.path != proto::kAgentPath) return nullptr;
  if (!peer.has_client_cert) return std::make_shared<AgentSession>(ctx_, peer, "", "");
  return std::make_shared<AgentSession>(ctx_, peer, peer.subject_cn,
                                        enrollment_.certificate_refusal(peer));
}

std::optional<std::vector<std::string>> AgentService::agent_features(
    const std::string& tenant) const {
  auto s = sessions_.find(tenant);
  if (!s) return std::nullopt;
  return s->features();
}

bool AgentService::send_command(const std::string& tenant, const nlohmann::json& body) {
  auto s = sessions_.find(tenant);
  if (!s) return false;
  s->deliver(std::string(proto::type::kCommand), body);
  return true;
}

void AgentService::push_plan(const std::string& tenant) {
  auto s = sessions_.find(tenant);
  if (!s) return;
  auto rec = store_.get_tenant(tenant);
  if (!rec) return;
  if (plan_provider_)
    if (auto plan = plan_provider_(*rec)) s->deliver(std::string(proto::type::kPlan), *plan);
  if (pending_commands_)
    for (auto& c : pending_commands_(*rec)) s->deliver(std::string(proto::type::kCommand), c);
}

bool AgentService::push_endpoint(const std::string& tenant) {
  auto s = sessions_.find(tenant);
  if (!s) return false;
  auto offer = endpoints_.offer(tenant);
  if (!offer) return false;
  s->deliver(std::string(proto::type::kEndpoint), std::move(*offer));
  return true;
}

Status AgentService::revoke(const std::string& tenant) {
  if (auto st = enrollment_.revoke(tenant); !st.ok()) return st;
  if (auto s = sessions_.find(tenant)) s->end("revoked", "revoked");
  // Nothing of the old agent stays on show; the session's own close, which
  // comes later on its io thread, adds nothing back (FeedState::forget).
  feed_.forget(tenant);
  ingestion_.forget(tenant);
  return {};
}

std::size_t AgentService::connected_count() const {
  return sessions_.size();
}

}  // namespace factory::coordinator
