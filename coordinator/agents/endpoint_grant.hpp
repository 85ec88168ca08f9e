#pragma once
// What a tenant's model endpoint is given over its agent's session
// (docs/model-endpoint.md): the SHA-256 of the tenant's API key, which the
// guest's proxy checks every request against, and a server certificate from
// the endpoint CA for the key the guest made itself. The coordinator, never
// the guest, decides what the certificate names: the endpoint's host from
// the tenant's record. Only a tenant whose record has an endpoint (its tier
// serves one) gets anything; for the others an `endpoint_csr` is refused.
//
// The `endpoint` frame: {"key_sha256", "keys", "url"?, "certificate"?, "ca"?,
// "expires_at"?}: the certificate fields only in the answer to a CSR;
// "keys" the named keys (issue 28), [{name, sha256, rpm?, tpm?}], the
// whole set each time.
#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "coordinator/agents/refusal.hpp"
#include "coordinator/enroll/ca.hpp"
#include "coordinator/store/store.hpp"

namespace factory::coordinator {

// An endpoint certificate lives this long; the agent asks for a new one on
// each session and when a third of its life is left.
inline constexpr std::chrono::seconds kEndpointCertTtl{std::chrono::hours(24 * 30)};

class EndpointGrant {
 public:
  EndpointGrant(store::Store& store, std::optional<enroll::CertificateAuthority> ca,
                std::chrono::seconds ttl = kEndpointCertTtl)
      : store_(store), ca_(std::move(ca)), ttl_(ttl) {}

  // The frame a session of the tenant starts with (or a rotation sends):
  // the key's hash and the URL; nullopt when the tenant has no endpoint.
  // Reads the store's in-memory record only: fine on an io thread.
  std::optional<nlohmann::json> offer(const std::string& tenant) const;

  // Signs the guest's CSR. A signature: workers only.
  Answer<nlohmann::json> sign(const std::string& tenant, const std::string& csr_pem) const;

 private:
  store::Store& store_;
  std::optional<enroll::CertificateAuthority> ca_;
  std::chrono::seconds ttl_;
};

}  // namespace factory::coordinator
