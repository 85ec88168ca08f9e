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

bool serial_listed(const nlohmann::json& list, const std::string& serial) {
  if (!list.is_array()) return false;
  std::string want = normalize_serial(serial);
  for (auto& s : list)
    if (s.is_string() && normalize_serial(s.get<std::string>()) == want) return true;
  return false;
}

}  // namespace

std::string Enrollment::certificate_refusal(const net::PeerInfo& peer) const {
  if (peer.subject_o != "factory-agent")
    return "the client certificate is not an agent certificate";
  auto rec = store_.get_tenant(peer.subject_cn);
  if (!rec)
    return "tenant " + peer.subject_cn + " no longer exists; this agent's certificate is void";
  if (!serial_listed(rec->agent.value("cert_serials", nlohmann::json::array()), peer.serial_hex))
    return "certificate " + peer.serial_hex + " of tenant " + peer.subject_cn +
           " was revoked or replaced; enroll again with a new token";
  return "";
}

Answer<nlohmann::json> Enrollment::enroll(const nlohmann::json& b, const std::string& remote) {
  if (!b.contains("token") || !b["token"].is_string() || !b.contains("csr") ||
      !b["csr"].is_string()) {
    ++counters_.enrollments_refused;
    return Refusal{"bad_request", "enroll needs 'token' and 'csr'", ""};
  }
  const std::string token = b["token"].get<std::string>();
  const std::string csr = b["csr"].get<std::string>();
  std::string token_id = token.substr(0, token.find('.'));
  if (token_id.size() > 16) token_id = "?";
  // Check the CSR before the token is spent: a malformed CSR must not cost
  // the guest its one-time token.
  if (auto probe = ca_.sign_agent_csr(csr, "probe", std::chrono::seconds(60)); !probe) {
    ++counters_.enrollments_refused;
    spdlog::warn("agents: enrollment from {} refused: {}", remote, probe.error().message);
    return Refusal{"enrollment_refused", probe.error().message, "enrollment refused"};
  }
  auto tenant = tokens_.redeem(token);
  if (!tenant) {
    ++counters_.enrollments_refused;
    spdlog::warn("agents: enrollment from {} with token {} refused: {}", remote, token_id,
                 tenant.error().message);
    return Refusal{"enrollment_refused", tenant.error().message, "enrollment refused"};
  }
  auto cert = ca_.sign_agent_csr(csr, *tenant, cert_ttl_);
  if (!cert) {
    ++counters_.enrollments_refused;
    return Refusal{"enrollment_refused", cert.error().message, "enrollment refused"};
  }
  auto rec = store_.get_tenant(*tenant).value_or(store::TenantRecord{});
  if (rec.name.empty()) {
    rec.name = *tenant;
    rec.created_at = format_rfc3339(Clock::now());
  }
  std::string agent_id = pki::random_hex(8);
  rec.agent = {{"agent_id", agent_id},
               {"cert_serials", nlohmann::json::array({cert->serial_hex})},
               {"certificate_expires_at", format_rfc3339(cert->not_after)},
               {"enrolled_at", format_rfc3339(Clock::now())},
               {"hostname", b.value("hostname", "")},
               {"version", b.value("agent_version", "")}};
  if (rec.phase == "pending") rec.phase = "enrolled";
  if (auto st = store_.put_tenant(rec); !st.ok()) {
    spdlog::error("agents: enrollment of {} not recorded: {}", *tenant, st.error().message);
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

Answer<nlohmann::json> Enrollment::renew(const std::string& tenant, const nlohmann::json& b) {
  if (!b.contains("csr") || !b["csr"].is_string())
    return Refusal{"bad_request", "renew needs 'csr'", ""};
  auto cert = ca_.sign_agent_csr(b["csr"].get<std::string>(), tenant, cert_ttl_);
  if (!cert) return Refusal{"renewal_refused", cert.error().message, ""};
  auto rec = store_.get_tenant(tenant);
  if (!rec) return Refusal{"renewal_refused", "tenant " + tenant + " no longer exists", ""};
  // Keep the previous serial valid until the agent reconnects with the new one.
  auto serials = rec->agent.value("cert_serials", nlohmann::json::array());
  serials.push_back(cert->serial_hex);
  while (serials.size() > 2) serials.erase(serials.begin());
  rec->agent["cert_serials"] = serials;
  rec->agent["certificate_expires_at"] = format_rfc3339(cert->not_after);
  if (auto st = store_.put_tenant(*rec); !st.ok())
    return Refusal{"internal", "renewal not recorded; retry later", ""};
  ++counters_.certificates_renewed;
  spdlog::info("agents: renewed the certificate of {} (serial {}, until {})", tenant,
               cert->serial_hex, format_rfc3339(cert->not_after));
  return nlohmann::json{{"certificate", cert->certificate_pem},
                        {"expires_at", format_rfc3339(cert->not_after)}};
}

Status Enrollment::revoke(const std::string& tenant) {
  auto rec = store_.get_tenant(tenant);
  if (rec) {
    rec->agent["cert_serials"] = nlohmann::json::array();
    rec->agent["revoked_at"] = format_rfc3339(Clock::now());
    if (auto st = store_.put_tenant(*rec); !st.ok()) return st;
  }
  if (auto r = tokens_.revoke_tenant(tenant); !r) return r.error();
  return {};
}

}  // namespace factory::coordinator
