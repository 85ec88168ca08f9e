#pragma once
// The coordinator's own certificate authority. It signs the coordinator's
// server certificate (what agents pin, through the CA's SHA-256) and every
// agent's client certificate. The coordinator, never the agent, decides the
// identity in a client certificate: CN=<tenant>, O=factory-agent.
#include <openssl/x509.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/durations.hpp"
#include "common/error.hpp"

namespace factory::enroll {

inline constexpr const char* kCaCommonName = "factory coordinator CA";
inline constexpr const char* kAgentOrganization = "factory-agent";
inline constexpr const char* kCaCertFile = "ca.crt";  // in state_dir, mode 0644
inline constexpr const char* kCaKeyFile = "ca.key";   // in state_dir, mode 0600
// The model endpoints' own CA (docs/model-endpoint.md): a guest holding an
// endpoint's server certificate must not be able to pose as the
// coordinator, so endpoint certificates never chain to the CA agents pin.
inline constexpr const char* kEndpointCaCommonName = "factory model endpoint CA";
inline constexpr const char* kEndpointCaCertFile = "endpoint-ca.crt";
inline constexpr const char* kEndpointCaKeyFile = "endpoint-ca.key";
inline constexpr const char* kEndpointOrganization = "factory-endpoint";

// Which CA load_or_create() loads: its files in state_dir and, when it
// makes a new one, its name.
struct CaFiles {
  const char* cert = kCaCertFile;
  const char* key = kCaKeyFile;
  const char* common_name = kCaCommonName;
};
inline constexpr CaFiles kEndpointCaFiles{kEndpointCaCertFile, kEndpointCaKeyFile,
                                          kEndpointCaCommonName};
// Issued certificates start this far in the past, so a guest whose clock is
// a little behind the coordinator's does not see them as not yet valid.
inline constexpr std::chrono::minutes kClockSkewAllowance{5};

struct IssuedCertificate {
  std::string certificate_pem;  // the leaf, then the CA certificate
  std::string
      private_key_pem;     // PKCS#8; empty when signed from a CSR (the key stays with its owner)
  std::string serial_hex;  // lower-case hex, as pki::inspect_certificate reports it
  Clock::time_point not_after;
};

// A CA's certificate and private key as PEM: what is kept of it where it is
// not a pair of files (the replicas' shared database, coordinator/shared).
struct CaPem {
  std::string certificate_pem;
  std::string private_key_pem;  // PKCS#8
};

class CertificateAuthority {
 public:
  // Loads ca.crt / ca.key from state_dir, or creates both on first start
  // (state_dir is created 0700 if missing). Refuses, and changes nothing, when
  // only one of the two exists, the key does not match the certificate, the
  // certificate is not a CA, or ca.key is readable by group or others.
  static Result<CertificateAuthority> load_or_create(const std::filesystem::path& state_dir,
                                                     CaFiles files = {});

  // The same checks on a certificate and key held elsewhere than in files;
  // `where` names them in a refusal (e.g. "the shared database's agents CA").
  static Result<CertificateAuthority> from_pem(const CaPem& pem, const std::string& where);
  // A new CA (a P-256 key, a self-signed certificate of ~10 years), made in
  // memory: nothing is written.
  static Result<CaPem> create_pem(const char* common_name = kCaCommonName);
  // The pair load_or_create() would load from state_dir, read and refused as
  // it refuses them, without creating anything: nullopt when neither file
  // exists.
  static Result<std::optional<CaPem>> read_files(const std::filesystem::path& state_dir,
                                                 CaFiles files = {});

  const std::string& certificate_pem() const { return cert_pem_; }
  // SHA-256 of the CA certificate's DER, lower-case hex: what agents pin.
  const std::string& sha256() const { return sha256_; }
  Clock::time_point not_after() const { return not_after_; }

  // A new key and a certificate for the coordinator's TLS endpoint. Each host
  // becomes an IP SAN when it is an IPv4/IPv6 literal, otherwise a DNS SAN.
  Result<IssuedCertificate> issue_server_certificate(const std::vector<std::string>& hosts,
                                                     std::chrono::seconds ttl) const;

  // Signs an agent's CSR (PEM) into a client certificate for `tenant`. The
  // CSR's self-signature must verify and its key be EC P-256; its subject is
  // ignored. Errc::invalid_argument with "malformed CSR: …", "CSR signature
  // invalid", or "CSR key …" when the CSR is not acceptable. notAfter is
  // capped at the CA's own notAfter.
  Result<IssuedCertificate> sign_agent_csr(const std::string& csr_pem, const std::string& tenant,
                                           std::chrono::seconds ttl) const;

  // Signs a model endpoint's CSR (made by its guest) into a server
  // certificate: CN=<tenant>, O=factory-endpoint, serverAuth, the SANs
  // `hosts` (the coordinator's choice, not the CSR's). Same CSR rules as
  // sign_agent_csr. Meant for the endpoint CA only.
  Result<IssuedCertificate> sign_endpoint_csr(const std::string& csr_pem, const std::string& tenant,
                                              const std::vector<std::string>& hosts,
                                              std::chrono::seconds ttl) const;

 private:
  CertificateAuthority() = default;
  // The checks of a CA however it is kept; cert_name and key_name say where
  // its two halves are in a refusal.
  static Result<CertificateAuthority> checked(const CaPem& pem, const std::string& cert_name,
                                              const std::string& key_name);
  Result<IssuedCertificate> issue(EVP_PKEY* subject_key, const std::string& subject_cn,
                                  const char* subject_o, const char* extended_key_usage,
                                  const std::vector<std::string>& hosts,
                                  std::chrono::seconds ttl) const;

  // shared_ptr so the CA can be copied into whatever needs to sign (server,
  // CLI) without re-reading its key; the objects are never modified.
  std::shared_ptr<X509> cert_;
  std::shared_ptr<EVP_PKEY> key_;
  std::string cert_pem_;
  std::string sha256_;
  Clock::time_point not_after_{};
};

// The tenant a client certificate speaks for: its CN, when its O is
// factory-agent and the CN is a valid tenant name. It does NOT verify the
// chain: call it on a peer certificate the TLS handshake already verified
// against the CA. Errc::permission_denied when the certificate is not an
// agent certificate.
Result<std::string> tenant_of_client_certificate(X509* cert);
Result<std::string> tenant_of_client_certificate(const std::string& cert_pem);

}  // namespace factory::enroll
