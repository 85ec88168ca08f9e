#include "coordinator/enroll/ca.hpp"

#include <arpa/inet.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <cstring>

#include "common/atomic_file.hpp"
#include "common/ossl.hpp"
#include "common/pki.hpp"
#include "coordinator/enroll/tenant_name.hpp"

namespace factory::enroll {
namespace fs = std::filesystem;

namespace {

constexpr std::chrono::hours kCaLifetime{24 * 3650};  // ~10 years

Clock::time_point now_seconds() {
  return std::chrono::time_point_cast<std::chrono::seconds>(Clock::now());
}

Error internal(const std::string& what) {
  return Error(Errc::internal, ossl::error_text(what));
}

// A random, positive 128-bit serial (top bit set, so it always prints as 32
// hex digits). RFC 5280 wants serials unique per CA; 127 random bits are.
Status set_random_serial(X509* x) {
  ossl::BignumPtr bn(BN_new());
  if (!bn || BN_rand(bn.get(), 128, BN_RAND_TOP_ONE, BN_RAND_BOTTOM_ANY) != 1)
    return internal("generate certificate serial");
  ASN1_INTEGER* serial = BN_to_ASN1_INTEGER(bn.get(), nullptr);
  if (serial == nullptr) return internal("encode certificate serial");
  int rc = X509_set_serialNumber(x, serial);
  ASN1_INTEGER_free(serial);
  if (rc != 1) return internal("set certificate serial");
  return {};
}

Status set_validity(X509* x, Clock::time_point not_before, Clock::time_point not_after) {
  if (!ASN1_TIME_set(X509_getm_notBefore(x), Clock::to_time_t(not_before)) ||
      !ASN1_TIME_set(X509_getm_notAfter(x), Clock::to_time_t(not_after)))
    return internal("set certificate validity");
  return {};
}

Status add_name_entry(X509_NAME* name, int nid, const std::string& value) {
  if (X509_NAME_add_entry_by_NID(name, nid, MBSTRING_UTF8,
                                 reinterpret_cast<const unsigned char*>(value.c_str()),
                                 static_cast<int>(value.size()), -1, 0) != 1)
    return Error(Errc::invalid_argument, ossl::error_text("set name entry '" + value + "'"));
  return {};
}

// Adds an extension written in OpenSSL's config syntax. Only fixed strings
// from this file go through here; anything from outside (SANs) is built as
// ASN.1 directly, so no input can inject extra extension values.
Status add_extension(X509* x, X509V3_CTX* ctx, int nid, const char* value) {
  ossl::X509ExtPtr ext(X509V3_EXT_nconf_nid(nullptr, ctx, nid, value));
  if (!ext || X509_add_ext(x, ext.get(), -1) != 1)
    return internal(std::string("add extension ") + OBJ_nid2sn(nid) + "=" + value);
  return {};
}

bool is_dns_name(const std::string& host) {
  if (host.empty() || host.size() > 253 || host.front() == '.' || host.back() == '.') return false;
  size_t label = 0;
  for (char c : host) {
    if (c == '.') {
      if (label == 0) return false;
      label = 0;
      continue;
    }
    bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
    if (!ok || ++label > 63) return false;
  }
  return true;
}

Status add_subject_alt_names(X509* x, const std::vector<std::string>& hosts) {
  ossl::GeneralNamesPtr names(GENERAL_NAMES_new());
  if (!names) return internal("allocate SAN list");
  for (const std::string& host : hosts) {
    unsigned char ip[16];
    int ip_len = 0;
    if (inet_pton(AF_INET, host.c_str(), ip) == 1)
      ip_len = 4;
    else if (inet_pton(AF_INET6, host.c_str(), ip) == 1)
      ip_len = 16;
    else if (!is_dns_name(host))
      return Error(Errc::invalid_argument,
                   "server certificate host '" + host +
                       "' is neither an IP address nor a DNS name (e.g. 10.0.0.5, ::1, "
                       "factory.example.com)");

    GENERAL_NAME* gn = GENERAL_NAME_new();
    if (gn == nullptr) return internal("allocate SAN");
    if (ip_len > 0) {
      ASN1_OCTET_STRING* os = ASN1_OCTET_STRING_new();
      if (os == nullptr || ASN1_OCTET_STRING_set(os, ip, ip_len) != 1) {
        ASN1_OCTET_STRING_free(os);
        GENERAL_NAME_free(gn);
        return internal("encode IP SAN");
      }
      GENERAL_NAME_set0_value(gn, GEN_IPADD, os);
    } else {
      ASN1_IA5STRING* s = ASN1_IA5STRING_new();
      if (s == nullptr || ASN1_STRING_set(s, host.data(), static_cast<int>(host.size())) != 1) {
        ASN1_IA5STRING_free(s);
        GENERAL_NAME_free(gn);
        return internal("encode DNS SAN");
      }
      GENERAL_NAME_set0_value(gn, GEN_DNS, s);
    }
    if (sk_GENERAL_NAME_push(names.get(), gn) <= 0) {
      GENERAL_NAME_free(gn);
      return internal("append SAN");
    }
  }
  if (X509_add1_ext_i2d(x, NID_subject_alt_name, names.get(), 0, X509V3_ADD_DEFAULT) != 1)
    return internal("add subjectAltName");
  return {};
}

Result<ossl::PkeyPtr> new_p256_key() {
  ossl::PkeyPtr key(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256"));
  if (!key) return internal("generate ECDSA P-256 key");
  return key;
}

bool is_p256(EVP_PKEY* key) {
  if (EVP_PKEY_is_a(key, "EC") != 1) return false;
  char group[64] = {};
  size_t len = 0;
  if (EVP_PKEY_get_group_name(key, group, sizeof group, &len) != 1) {
    ossl::clear_errors();
    return false;
  }
  return std::strcmp(group, "prime256v1") == 0 || std::strcmp(group, "P-256") == 0 ||
         std::strcmp(group, "secp256r1") == 0;
}

std::string key_description(EVP_PKEY* key) {
  const char* type = EVP_PKEY_get0_type_name(key);
  std::string out = type ? type : "unknown";
  char group[64] = {};
  size_t len = 0;
  if (EVP_PKEY_get_group_name(key, group, sizeof group, &len) == 1)
    out += std::string(" ") + group;
  else
    out += " " + std::to_string(EVP_PKEY_get_bits(key)) + "-bit";
  ossl::clear_errors();
  return out;
}

// A CSR that parses, whose self-signature verifies (the requester holds the
// private key of the public key about to be certified) and whose key is EC
// P-256; `who` names the requesters in the refusal ("agents").
Result<ossl::X509ReqPtr> verified_csr(const std::string& csr_pem, const char* who) {
  auto req = ossl::load_csr(csr_pem);
  if (!req.ok()) return Error(Errc::invalid_argument, "malformed CSR: " + req.error().message);
  EVP_PKEY* pub = X509_REQ_get0_pubkey(req->get());
  if (pub == nullptr) {
    ossl::clear_errors();
    return Error(Errc::invalid_argument, "malformed CSR: it holds no readable public key");
  }
  int verified = X509_REQ_verify(req->get(), pub);
  ossl::clear_errors();
  if (verified != 1) return Error(Errc::invalid_argument, "CSR signature invalid");
  if (!is_p256(pub))
    return Error(Errc::invalid_argument, "CSR key is " + key_description(pub) + "; " + who +
                                             " must use an ECDSA P-256 key");
  return req;
}

Result<ossl::X509Ptr> make_ca_certificate(EVP_PKEY* key, Clock::time_point now,
                                          const char* common_name) {
  ossl::X509Ptr x(X509_new());
  if (!x || X509_set_version(x.get(), X509_VERSION_3) != 1)
    return internal("allocate CA certificate");
  if (auto st = set_random_serial(x.get()); !st.ok()) return st.error();
  X509_NAME* name = X509_get_subject_name(x.get());
  if (auto st = add_name_entry(name, NID_commonName, common_name); !st.ok()) return st.error();
  if (X509_set_issuer_name(x.get(), name) != 1) return internal("set CA issuer");
  if (auto st = set_validity(x.get(), now - kClockSkewAllowance, now + kCaLifetime); !st.ok())
    return st.error();
  if (X509_set_pubkey(x.get(), key) != 1) return internal("set CA public key");
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, x.get(), x.get(), nullptr, nullptr, 0);
  for (auto [nid, value] : {std::pair{NID_basic_constraints, "critical,CA:TRUE"},
                            std::pair{NID_key_usage, "critical,keyCertSign,cRLSign"},
                            std::pair{NID_subject_key_identifier, "hash"}}) {
    if (auto st = add_extension(x.get(), &ctx, nid, value); !st.ok()) return st.error();
  }
  if (X509_sign(x.get(), key, EVP_sha256()) <= 0) return internal("self-sign CA certificate");
  return x;
}

Status check_key_file_private(const fs::path& key_path) {
  std::error_code ec;
  fs::file_status st = fs::status(key_path, ec);
  if (ec) return Error(Errc::io, "stat " + key_path.string() + ": " + ec.message());
  if (!fs::is_regular_file(st))
    return Error(Errc::failed_precondition, key_path.string() + " is not a regular file");
  auto open_to_others = fs::perms::group_all | fs::perms::others_all;
  if ((st.permissions() & open_to_others) != fs::perms::none) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.permissions()) & 07777);
    return Error(Errc::failed_precondition, "CA private key " + key_path.string() +
                                                " is accessible to group or others (mode " + mode +
                                                "); run: chmod 600 " + key_path.string());
  }
  return {};
}

}  // namespace

Result<CaPem> CertificateAuthority::create_pem(const char* common_name) {
  auto key = new_p256_key();
  if (!key.ok()) return key.error().with_context("create CA");
  auto cert = make_ca_certificate(key->get(), now_seconds(), common_name);
  if (!cert.ok()) return cert.error().with_context("create CA");
  auto kp = ossl::private_key_to_pem(key->get());
  if (!kp.ok()) return kp.error().with_context("create CA");
  auto cp = ossl::certificate_to_pem(cert->get());
  if (!cp.ok()) return cp.error().with_context("create CA");
  return CaPem{std::move(*cp), std::move(*kp)};
}

Result<std::optional<CaPem>> CertificateAuthority::read_files(const fs::path& state_dir,
                                                              CaFiles files) {
  const fs::path cert_path = state_dir / files.cert;
  const fs::path key_path = state_dir / files.key;
  std::error_code ec;
  bool have_cert = fs::exists(cert_path, ec);
  bool have_key = fs::exists(key_path, ec);
  if (!have_cert && !have_key) return std::optional<CaPem>();
  if (have_cert != have_key) {
    const fs::path& present = have_cert ? cert_path : key_path;
    const fs::path& missing = have_cert ? key_path : cert_path;
    return Error(Errc::failed_precondition,
                 "CA: " + present.string() + " exists but " + missing.string() +
                     " is missing; restore it from a backup, or remove " + present.string() +
                     " to create a new CA (every enrolled agent must then enroll again)");
  }
  if (auto st = check_key_file_private(key_path); !st.ok())
    return st.error().with_context("load CA");
  auto cp = read_file(cert_path);
  if (!cp.ok()) return cp.error().with_context("load CA");
  auto kp = read_file(key_path);
  if (!kp.ok()) return kp.error().with_context("load CA");
  return std::optional<CaPem>(CaPem{std::move(*cp), std::move(*kp)});
}

Result<CertificateAuthority> CertificateAuthority::load_or_create(const fs::path& state_dir,
                                                                  CaFiles files) {
  const fs::path cert_path = state_dir / files.cert;
  const fs::path key_path = state_dir / files.key;
  auto existing = read_files(state_dir, files);
  if (!existing) return existing.error();
  CaPem pem;
  if (*existing) {
    pem = std::move(**existing);
  } else {
    std::error_code ec;
    if (!fs::exists(state_dir, ec)) {
      if (auto st = ensure_dir(state_dir, 0700); !st.ok())
        return st.error().with_context("create CA");
    }
    auto made = create_pem(files.common_name);
    if (!made) return made.error();
    pem = std::move(*made);
    // The key first: a crash between the two writes leaves a key without a
    // certificate, which load refuses loudly instead of silently making a
    // second CA that no enrolled agent trusts.
    if (auto st = write_file_atomic(key_path, pem.private_key_pem, 0600); !st.ok())
      return st.error().with_context("create CA");
    if (auto st = write_file_atomic(cert_path, pem.certificate_pem, 0644); !st.ok())
      return st.error().with_context("create CA");
  }
  return checked(pem, cert_path.string(), key_path.string());
}

Result<CertificateAuthority> CertificateAuthority::from_pem(const CaPem& pem,
                                                            const std::string& where) {
  return checked(pem, where + " (certificate)", where + " (key)");
}

Result<CertificateAuthority> CertificateAuthority::checked(const CaPem& pem,
                                                           const std::string& cert_name,
                                                           const std::string& key_name) {
  const std::string& cert_pem = pem.certificate_pem;
  const std::string& key_pem = pem.private_key_pem;
  auto cert = ossl::load_certificate(cert_pem);
  if (!cert.ok()) return cert.error().with_context("load CA: " + cert_name);
  auto key = ossl::load_private_key(key_pem);
  if (!key.ok()) return key.error().with_context("load CA: " + key_name);
  if (!pki::key_matches_certificate(key_pem, cert_pem))
    return Error(Errc::failed_precondition, "load CA: " + key_name + " is not the key of " +
                                                cert_name +
                                                "; restore the matching pair from a backup");
  auto info = pki::inspect_certificate(cert_pem);
  if (!info.ok()) return info.error().with_context("load CA: " + cert_name);
  if (!info->is_ca)
    return Error(
        Errc::failed_precondition,
        "load CA: " + cert_name + " is not a CA certificate (basicConstraints CA:TRUE missing)");
  auto digest = pki::certificate_sha256(cert_pem);
  if (!digest.ok()) return digest.error().with_context("load CA");

  CertificateAuthority ca;
  ca.cert_ = std::shared_ptr<X509>(cert->release(), X509_free);
  ca.key_ = std::shared_ptr<EVP_PKEY>(key->release(), EVP_PKEY_free);
  ca.cert_pem_ = cert_pem;
  ca.sha256_ = std::move(*digest);
  ca.not_after_ = info->not_after;
  return ca;
}

Result<IssuedCertificate> CertificateAuthority::issue(EVP_PKEY* subject_key,
                                                      const std::string& subject_cn,
                                                      const char* subject_o,
                                                      const char* extended_key_usage,
                                                      const std::vector<std::string>& hosts,
                                                      std::chrono::seconds ttl) const {
  if (ttl <= std::chrono::seconds(0))
    return Error(Errc::invalid_argument, "certificate lifetime must be positive");
  const Clock::time_point now = now_seconds();
  const Clock::time_point not_after = std::min(now + ttl, not_after_);
  if (not_after <= now)
    return Error(Errc::failed_precondition, "the CA certificate expired at " +
                                                format_rfc3339(not_after_) +
                                                "; it can no longer issue certificates");

  ossl::X509Ptr x(X509_new());
  if (!x || X509_set_version(x.get(), X509_VERSION_3) != 1) return internal("allocate certificate");
  if (auto st = set_random_serial(x.get()); !st.ok()) return st.error();
  if (X509_set_issuer_name(x.get(), X509_get_subject_name(cert_.get())) != 1)
    return internal("set issuer");
  X509_NAME* name = X509_get_subject_name(x.get());
  if (auto st = add_name_entry(name, NID_commonName, subject_cn); !st.ok()) return st.error();
  if (subject_o != nullptr) {
    if (auto st = add_name_entry(name, NID_organizationName, subject_o); !st.ok())
      return st.error();
  }
  if (auto st = set_validity(x.get(), now - kClockSkewAllowance, not_after); !st.ok())
    return st.error();
  if (X509_set_pubkey(x.get(), subject_key) != 1) return internal("set public key");

  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, cert_.get(), x.get(), nullptr, nullptr, 0);
  for (auto [nid, value] : {std::pair{NID_basic_constraints, "critical,CA:FALSE"},
                            std::pair{NID_key_usage, "critical,digitalSignature"},
                            std::pair{NID_ext_key_usage, extended_key_usage},
                            std::pair{NID_subject_key_identifier, "hash"},
                            std::pair{NID_authority_key_identifier, "keyid:always"}}) {
    if (auto st = add_extension(x.get(), &ctx, nid, value); !st.ok()) return st.error();
  }
  if (!hosts.empty()) {
    if (auto st = add_subject_alt_names(x.get(), hosts); !st.ok()) return st.error();
  }
  if (X509_sign(x.get(), key_.get(), EVP_sha256()) <= 0) return internal("sign certificate");

  auto leaf = ossl::certificate_to_pem(x.get());
  if (!leaf.ok()) return leaf.error();
  auto info = pki::inspect_certificate(*leaf);
  if (!info.ok()) return info.error().with_context("read back issued certificate");
  IssuedCertificate out;
  out.certificate_pem = *leaf + cert_pem_;
  out.serial_hex = info->serial_hex;
  out.not_after = info->not_after;
  return out;
}

Result<IssuedCertificate> CertificateAuthority::issue_server_certificate(
    const std::vector<std::string>& hosts, std::chrono::seconds ttl) const {
  if (hosts.empty())
    return Error(Errc::invalid_argument, "server certificate needs at least one host name or IP");
  auto key = new_p256_key();
  if (!key.ok()) return key.error().with_context("issue server certificate");
  auto issued = issue(key->get(), "factory coordinator", nullptr, "serverAuth", hosts, ttl);
  if (!issued.ok()) return issued.error().with_context("issue server certificate");
  auto key_pem = ossl::private_key_to_pem(key->get());
  if (!key_pem.ok()) return key_pem.error().with_context("issue server certificate");
  issued->private_key_pem = std::move(*key_pem);
  return issued;
}

Result<IssuedCertificate> CertificateAuthority::sign_agent_csr(const std::string& csr_pem,
                                                               const std::string& tenant,
                                                               std::chrono::seconds ttl) const {
  if (auto st = validate_tenant_name(tenant); !st.ok()) return st.error();
  auto req = verified_csr(csr_pem, "agents");
  if (!req.ok()) return req.error();
  EVP_PKEY* pub = X509_REQ_get0_pubkey(req->get());
  // The CSR's subject and extensions are deliberately not read: the identity
  // comes from the redeemed token, not from what the agent asks for.
  auto issued = issue(pub, tenant, kAgentOrganization, "clientAuth", {}, ttl);
  if (!issued.ok()) return issued.error().with_context("sign agent CSR");
  return issued;
}

Result<IssuedCertificate> CertificateAuthority::sign_endpoint_csr(
    const std::string& csr_pem, const std::string& tenant, const std::vector<std::string>& hosts,
    std::chrono::seconds ttl) const {
  if (auto st = validate_tenant_name(tenant); !st.ok()) return st.error();
  if (hosts.empty()) return Error(Errc::invalid_argument, "an endpoint certificate needs a host");
  auto req = verified_csr(csr_pem, "endpoints");
  if (!req.ok()) return req.error();
  EVP_PKEY* pub = X509_REQ_get0_pubkey(req->get());
  auto issued = issue(pub, tenant, kEndpointOrganization, "serverAuth", hosts, ttl);
  if (!issued.ok()) return issued.error().with_context("sign endpoint CSR");
  return issued;
}

Result<std::string> tenant_of_client_certificate(X509* cert) {
  if (cert == nullptr) return Error(Errc::unauthenticated, "no client certificate");
  std::string org = ossl::name_entry(X509_get_subject_name(cert), NID_organizationName);
  std::string cn = ossl::name_entry(X509_get_subject_name(cert), NID_commonName);
  if (org != kAgentOrganization)
    return Error(Errc::permission_denied, "client certificate is not an agent certificate (O is '" +
                                              org + "', not '" + kAgentOrganization + "')");
  // X509_get_extended_key_usage also computes the cached extension flags.
  uint32_t eku = X509_get_extended_key_usage(cert);
  ossl::clear_errors();
  if ((eku & XKU_SSL_CLIENT) == 0)
    return Error(Errc::permission_denied,
                 "agent certificate is not valid for client authentication");
  if (auto st = validate_tenant_name(cn); !st.ok())
    return Error(Errc::permission_denied, "agent certificate CN: " + st.error().message);
  return cn;
}

Result<std::string> tenant_of_client_certificate(const std::string& cert_pem) {
  auto cert = ossl::load_certificate(cert_pem);
  if (!cert.ok()) return cert.error().with_context("client certificate");
  return tenant_of_client_certificate(cert->get());
}

}  // namespace factory::enroll
