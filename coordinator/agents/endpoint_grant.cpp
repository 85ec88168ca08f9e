#include "coordinator/agents/endpoint_grant.hpp"

#include "common/durations.hpp"
#include "common/pki.hpp"

namespace factory::coordinator {

using nlohmann::json;

std::optional<json> EndpointGrant::offer(const std::string& tenant) const {
  auto rec = store_.get_tenant(tenant);
  if (!rec || !rec->endpoint) return std::nullopt;
  const std::string sha = rec->endpoint->key_sha256.value_or("");
  if (!pki::is_sha256_hex(sha)) return std::nullopt;
  json body = {{"key_sha256", sha}};
  // The named keys, always (an empty list too): the proxy replaces its set
  // whole with each frame, so a revoked key is one left out.
  json keys = json::array();
  for (const auto& k : rec->endpoint->keys.value_or(std::vector<store::EndpointKey>{})) {
    if (!k.name || !k.sha256 || !pki::is_sha256_hex(*k.sha256)) continue;
    json one = {{"name", *k.name}, {"sha256", *k.sha256}};
    if (k.rpm) one["rpm"] = *k.rpm;
    if (k.tpm) one["tpm"] = *k.tpm;
    keys.push_back(std::move(one));
  }
  body["keys"] = std::move(keys);
  const std::string url = rec->endpoint->url.value_or("");
  if (!url.empty()) body["url"] = url;
  return body;
}

Answer<json> EndpointGrant::sign(const std::string& tenant, const std::string& csr_pem) const {
  auto body = offer(tenant);
  if (!body)
    return Refusal{"not_an_endpoint", "tenant " + tenant + " serves no model endpoint", ""};
  if (!ca_) return Refusal{"unavailable", "this coordinator has no endpoint CA; ask its admin", ""};
  auto rec = store_.get_tenant(tenant);
  const std::string host = rec && rec->endpoint ? rec->endpoint->host.value_or("") : std::string();
  if (host.empty())
    return Refusal{"unavailable", "tenant " + tenant + "'s endpoint has no host yet", ""};
  auto issued = ca_->sign_endpoint_csr(csr_pem, tenant, {host}, ttl_);
  if (!issued) return Refusal{"bad_request", issued.error().message, ""};
  (*body)["certificate"] = issued->certificate_pem;
  (*body)["ca"] = ca_->certificate_pem();
  (*body)["expires_at"] = format_rfc3339(issued->not_after);
  return *body;
}

}  // namespace factory::coordinator
