#include "coordinator/agents/enrollment.hpp"

#include <spdlog/spdlog.h>

#include "common/durations.hpp"
#include "common/pki.hpp"

namespace factory::coordinator {

namespace {

std::string normalize_serial(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  size_t nz = s.find_first_not_of('0');
  return nz == std::string::npos ? "0" : s.substr(nz);
}

bool serial_listed(const store::AgentPresence& agent, const std::string& serial) {
  if (!agent.cert_serials) return false;
  std::string want = normalize_serial(serial);
  for (const auto& s : *agent.cert_serials)
    if (normalize_serial(s) == want) return true;
  return false;
}

}  // namespace

std::string reenroll_hint(const std::string& tenant) {
  // The agent adds where the token goes on its side (its token file).
  return "re-enroll the agent with a new token (`factory token create --tenant " + tenant + "`)";
}

std::string Enrollment::certificate_refusal(const net::PeerInfo& peer) const {
  if (peer.subject_o != "factory-agent")
    return "the client certificate is not an agent certificate";
  auto rec = store_.get_tenant(peer.subject_cn);
  if (!rec)
    return "tenant " + peer.subject_cn + " no longer exists; this agent's certificate is void";
  if (!serial_listed(rec->agent, peer.serial_hex))
    return "certificate " + peer.serial_hex + " of tenant " + peer.subject_cn +
           " was revoked or replaced; " + reenroll_hint(peer.subject_cn);
  if (peer.client_cert_expired) {
    const auto expired_at = Clock::time_point(std::chrono::seconds(peer.not_after_unix));
    if (Clock::now() - expired_at > renewal_grace_)
      return "certificate " + peer.serial_hex + " of tenant " + peer.subject_cn + " expired at " +
             format_rfc3339(expired_at) + ", more than " + format_duration(renewal_grace_) +
             " ago (agents.renewal_grace), and can no longer be renewed; " +
             reenroll_hint(peer.subject_cn);
  }
  return "";
}

Answer<nlohmann::json> Enrollment::enroll(const EnrollRequest& req, const std::string& remote) {
  const std::string& token = req.token;
  const std::string& csr = req.csr;
  std::string token_id = token.substr(0, token.find('.'));
  if (token_id.size() > enroll::kTokenIdLength) token_id = "?";
  // The token first: a stranger with a made-up token costs a hash, never a
  // signature.
  auto tenant = tokens_.check(token);
  if (!tenant) {
    ++counters_.enrollments_refused;
    spdlog::warn("agents: enrollment from {} with token {} refused: {}", remote, token_id,
                 tenant.error().message);
    return Refusal{"enrollment_refused", tenant.error().message, "enrollment refused"};
  }
  // Then the CSR, before the token is spent: a malformed CSR must not cost
  // the guest its one-time token.
  auto cert = ca_.sign_agent_csr(csr, *tenant, cert_ttl_);
  if (!cert) {
    ++counters_.enrollments_refused;
    spdlog::warn("agents: enrollment from {} refused: {}", remote, cert.error().message);
    return Refusal{"enrollment_refused", cert.error().message, "enrollment refused"};
  }
  // Spent now; a second enrollment racing with the same token loses here.
  auto spent = tokens_.redeem(token);
  if (!spent) {
    ++counters_.enrollments_refused;
    return Refusal{"enrollment_refused", spent.error().message, "enrollment refused"};
  }
  const std::string agent_id = pki::random_hex(8);
  store::AgentPresence identity;
  identity.agent_id = agent_id;
  identity.cert_serials = std::vector<std::string>{cert->serial_hex};
  identity.certificate_expires_at = format_rfc3339(cert->not_after);
  identity.enrolled_at = format_rfc3339(Clock::now());
  identity.hostname = req.hostname;
  identity.version = req.agent_version;
  auto set_identity = [&](store::TenantRecord& r) {
    r.agent = identity;
    if (r.phase == "pending") r.phase = "enrolled";
    return Status{};
  };
  Status recorded;
  if (auto up = store_.update_tenant(*tenant, set_identity); !up) {
    if (up.error().code == Errc::not_found) {
      // A tenant made by `factory token create` alone has no record yet.
      store::TenantRecord rec;
      rec.name = *tenant;
      rec.created_at = format_rfc3339(Clock::now());
      (void)set_identity(rec);
      recorded = store_.put_tenant(rec);
    } else {
      recorded = up.error();
    }
  }
  if (!recorded.ok()) {
    spdlog::error("agents: enrollment of {} not recorded: {}", *tenant, recorded.error().message);
    return Refusal{"internal", "the coordinator could not record the enrollment; retry later",
                   "internal"};
  }
  ++counters_.enrollments_accepted;
  spdlog::info("agents: tenant {} enrolled agent {} from {} (token {}, certificate {})", *tenant,
               agent_id, remote, token_id, cert->serial_hex);
  return nlohmann::json{{"tenant", *tenant},
                        {"agent_id", agent_id},
                        {"certificate", cert->certificate_pem},
                        {"ca", ca_.certificate_pem()},
                        {"expires_at", format_rfc3339(cert->not_after)}};
}

Answer<nlohmann::json> Enrollment::renew(const std::string& tenant,
                                         const std::string& session_serial,
                                         const RenewRequest& req) {
  if (!store_.get_tenant(tenant))
    return Refusal{"unauthenticated", "tenant " + tenant + " no longer exists", "revoked"};
  auto cert = ca_.sign_agent_csr(req.csr, tenant, cert_ttl_);
  if (!cert) return Refusal{"renewal_refused", cert.error().message, ""};
  auto updated = store_.update_tenant(tenant, [&](store::TenantRecord& r) -> Status {
    // Revoked meanwhile (the list was emptied): the session's serial is no
    // longer listed, and this renewal must not bring it back.
    if (!serial_listed(r.agent, session_serial))
      return Error(Errc::permission_denied,
                   "certificate " + session_serial + " is no longer valid");
    r.agent.cert_serials = std::vector<std::string>{session_serial, cert->serial_hex};
    r.agent.certificate_expires_at = format_rfc3339(cert->not_after);
    return Status{};
  });
  if (!updated) {
    if (updated.error().code == Errc::permission_denied)
      return Refusal{"unauthenticated", updated.error().message, "revoked"};
    return Refusal{"internal", "renewal not recorded; retry later", ""};
  }
  ++counters_.certificates_renewed;
  spdlog::info("agents: renewed the certificate of {} (serial {}, until {})", tenant,
               cert->serial_hex, format_rfc3339(cert->not_after));
  return nlohmann::json{{"certificate", cert->certificate_pem},
                        {"expires_at", format_rfc3339(cert->not_after)}};
}

Status Enrollment::revoke(const std::string& tenant) {
  if (store_.get_tenant(tenant)) {
    auto r = store_.update_tenant(tenant, [](store::TenantRecord& rec) {
      rec.agent.cert_serials = std::vector<std::string>{};
      rec.agent.revoked_at = format_rfc3339(Clock::now());
      return Status{};
    });
    if (!r && r.error().code != Errc::not_found) return r.error();
  }
  if (auto r = tokens_.revoke_tenant(tenant); !r) return r.error();
  return {};
}

}  // namespace factory::coordinator
