#include "agent/link/identity.hpp"

#include <nlohmann/json.hpp>

#include "common/atomic_file.hpp"
#include "common/pki.hpp"

namespace factory::agent {
namespace fs = std::filesystem;

Status refresh_validity(AgentIdentity& id) {
  auto certs = pki::split_pem_certificates(id.cert_pem);
  if (certs.empty()) return Error(Errc::invalid_argument, "identity has no certificate");
  auto info = pki::inspect_certificate(certs.front());
  if (!info) return info.error();
  id.not_before = info->not_before;
  id.not_after = info->not_after;
  id.obtained_at = Clock::now();
  return {};
}

Result<std::optional<AgentIdentity>> load_identity(const fs::path& state_dir) {
  auto text = read_file(state_dir / kIdentityFile);
  if (!text) {
    if (text.error().code == Errc::not_found) return std::optional<AgentIdentity>{};
    return text.error();
  }
  auto j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return Error(Errc::failed_precondition,
                 (state_dir / kIdentityFile).string() +
                     " is corrupt; remove it and enroll again with a new token");
  AgentIdentity id;
  id.tenant = j.value("tenant", "");
  id.agent_id = j.value("agent_id", "");
  id.key_pem = j.value("key", "");
  id.cert_pem = j.value("certificate", "");
  id.ca_pem = j.value("ca", "");
  if (id.tenant.empty() || id.key_pem.empty() || id.cert_pem.empty() || id.ca_pem.empty())
    return Error(Errc::failed_precondition,
                 (state_dir / kIdentityFile).string() + " is incomplete");
  if (auto st = refresh_validity(id); !st.ok()) return st.error();
  if (auto t = parse_rfc3339(j.value("obtained_at", ""))) id.obtained_at = *t;
  return std::optional<AgentIdentity>(std::move(id));
}

Status save_identity(const fs::path& state_dir, const AgentIdentity& id) {
  nlohmann::json j = {{"tenant", id.tenant}, {"agent_id", id.agent_id},
                      {"key", id.key_pem},   {"certificate", id.cert_pem},
                      {"ca", id.ca_pem},     {"obtained_at", format_rfc3339(id.obtained_at)}};
  return write_file_atomic(state_dir / kIdentityFile, j.dump(2), 0600);
}

}  // namespace factory::agent
