#include "coordinator/agents/agent_service.hpp"

#include "common/protocol.hpp"

namespace factory::coordinator {

AgentService::AgentService(store::Store& store, const enroll::CertificateAuthority& ca,
                           enroll::TokenBook& tokens, feed::FeedState& feed,
                           AgentServiceOptions opts)
    : store_(store),
      enrollment_(store, ca, tokens, feed.counters(), opts.cert_ttl),
      ingestion_(store, feed),
      ctx_{store,
           feed,
           enrollment_,
           ingestion_,
           sessions_,
           [this](const std::string& tenant) { push_plan(tenant); },
           std::move(opts.server_version)} {}

std::shared_ptr<net::WsHandler> AgentService::accept(const net::HttpRequestIn& req,
                                                     const net::PeerInfo& peer) {
  if (req.path != proto::kAgentPath) return nullptr;
  if (!peer.has_client_cert) return std::make_shared<AgentSession>(ctx_, peer, "", "");
  return std::make_shared<AgentSession>(ctx_, peer, peer.subject_cn,
                                        enrollment_.certificate_refusal(peer));
}

bool AgentService::send_command(const std::string& tenant, const nlohmann::json& body) {
  AgentSession* s = sessions_.find(tenant);
  if (!s) return false;
  s->send(proto::type::kCommand, body);
  return true;
}

void AgentService::push_plan(const std::string& tenant) {
  AgentSession* s = sessions_.find(tenant);
  if (!s || !plan_provider_) return;
  auto rec = store_.get_tenant(tenant);
  if (!rec) return;
  if (auto plan = plan_provider_(*rec)) s->send(proto::type::kPlan, *plan);
}

Status AgentService::revoke(const std::string& tenant) {
  if (auto st = enrollment_.revoke(tenant); !st.ok()) return st;
  if (AgentSession* s = sessions_.find(tenant)) s->close("revoked");
  return {};
}

}  // namespace factory::coordinator
