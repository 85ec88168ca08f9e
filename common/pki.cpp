#include "common/pki.hpp"

#include <arpa/inet.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "common/ossl.hpp"

namespace factory::pki {

namespace {

std::string to_hex(const unsigned char* data, size_t n) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(n * 2);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(digits[data[i] >> 4]);
    out.push_back(digits[data[i] & 0x0f]);
  }
  return out;
}

// A secret made from a failed CSPRNG would be predictable; there is no safe
// way to go on, so stop the process rather than hand one out.
void random_bytes_or_die(unsigned char* buf, size_t n) {
  if (n > static_cast<size_t>(INT32_MAX) || RAND_bytes(buf, static_cast<int>(n)) != 1) {
    std::fprintf(stderr, "factory: fatal: OpenSSL's random generator failed: %s\n",
                 ossl::error_text("RAND_bytes").c_str());
    std::abort();
  }
}

Result<Clock::time_point> asn1_time(const ASN1_TIME* t) {
  std::tm tm{};
  if (t == nullptr || ASN1_TIME_to_tm(t, &tm) != 1) {
    ossl::clear_errors();
    return Error(Errc::invalid_argument, "certificate has an unreadable validity time");
  }
  return Clock::from_time_t(timegm(&tm));
}

std::string ip_to_text(const ASN1_OCTET_STRING* ip) {
  char buf[INET6_ADDRSTRLEN] = {};
  const unsigned char* d = ASN1_STRING_get0_data(ip);
  int len = ASN1_STRING_length(ip);
  if (len == 4 && inet_ntop(AF_INET, d, buf, sizeof buf)) return buf;
  if (len == 16 && inet_ntop(AF_INET6, d, buf, sizeof buf)) return buf;
  return {};
}

}  // namespace

Result<std::string> generate_private_key() {
  ossl::PkeyPtr key(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256"));
  if (!key) return Error(Errc::internal, ossl::error_text("generate ECDSA P-256 key"));
  return ossl::private_key_to_pem(key.get());
}

Result<std::string> make_csr(const std::string& key_pem, const std::string& common_name) {
  if (common_name.empty()) return Error(Errc::invalid_argument, "CSR common name is empty");
  auto key = ossl::load_private_key(key_pem);
  if (!key.ok()) return key.error().with_context("make CSR");
  ossl::X509ReqPtr req(X509_REQ_new());
  if (!req) return Error(Errc::internal, ossl::error_text("allocate CSR"));
  X509_NAME* subject = X509_REQ_get_subject_name(req.get());
  if (X509_REQ_set_version(req.get(), X509_REQ_VERSION_1) != 1 ||
      X509_NAME_add_entry_by_NID(subject, NID_commonName, MBSTRING_UTF8,
                                 reinterpret_cast<const unsigned char*>(common_name.c_str()),
                                 static_cast<int>(common_name.size()), -1, 0) != 1)
    return Error(Errc::invalid_argument,
                 ossl::error_text("make CSR: set subject CN '" + common_name + "'"));
  if (X509_REQ_set_pubkey(req.get(), key->get()) != 1 ||
      X509_REQ_sign(req.get(), key->get(), EVP_sha256()) <= 0)
    return Error(Errc::internal, ossl::error_text("make CSR: sign"));
  return ossl::csr_to_pem(req.get());
}

Result<CertInfo> inspect_certificate(const std::string& cert_pem) {
  auto cert = ossl::load_certificate(cert_pem);
  if (!cert.ok()) return cert.error().with_context("inspect certificate");
  return inspect_certificate(cert->get());
}

Result<CertInfo> inspect_certificate(const X509* x) {
  CertInfo info;
  info.subject_cn = ossl::name_entry(X509_get_subject_name(x), NID_commonName);
  info.subject_o = ossl::name_entry(X509_get_subject_name(x), NID_organizationName);
  info.issuer_cn = ossl::name_entry(X509_get_issuer_name(x), NID_commonName);

  ossl::BignumPtr serial(ASN1_INTEGER_to_BN(X509_get0_serialNumber(x), nullptr));
  if (!serial) return Error(Errc::invalid_argument, ossl::error_text("certificate serial"));
  char* hex = BN_bn2hex(serial.get());
  if (hex == nullptr) return Error(Errc::internal, ossl::error_text("certificate serial"));
  info.serial_hex = hex;
  OPENSSL_free(hex);
  for (char& c : info.serial_hex)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));

  auto nb = asn1_time(X509_get0_notBefore(x));
  if (!nb.ok()) return nb.error();
  auto na = asn1_time(X509_get0_notAfter(x));
  if (!na.ok()) return na.error();
  info.not_before = *nb;
  info.not_after = *na;

  ossl::GeneralNamesPtr sans(
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(x, NID_subject_alt_name, nullptr, nullptr)));
  for (int i = 0; sans && i < sk_GENERAL_NAME_num(sans.get()); ++i) {
    const GENERAL_NAME* gn = sk_GENERAL_NAME_value(sans.get(), i);
    if (gn->type == GEN_DNS) {
      const ASN1_IA5STRING* s = gn->d.dNSName;
      info.dns_names.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)),
                                  static_cast<size_t>(ASN1_STRING_length(s)));
    } else if (gn->type == GEN_IPADD) {
      std::string ip = ip_to_text(gn->d.iPAddress);
      if (!ip.empty()) info.ip_addresses.push_back(std::move(ip));
    }
  }

  auto* bc =
      static_cast<BASIC_CONSTRAINTS*>(X509_get_ext_d2i(x, NID_basic_constraints, nullptr, nullptr));
  if (bc != nullptr) {
    info.is_ca = bc->ca != 0;
    BASIC_CONSTRAINTS_free(bc);
  }
  ossl::clear_errors();  // X509_get_ext_d2i leaves "not found" behind
  return info;
}

Result<std::string> certificate_sha256(const std::string& cert_pem) {
  auto cert = ossl::load_certificate(cert_pem);
  if (!cert.ok()) return cert.error().with_context("certificate SHA-256");
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (X509_digest(cert->get(), EVP_sha256(), md, &n) != 1)
    return Error(Errc::internal, ossl::error_text("certificate SHA-256"));
  return to_hex(md, n);
}

std::vector<std::string> split_pem_certificates(const std::string& pem) {
  static const std::string begin = "-----BEGIN CERTIFICATE-----";
  static const std::string end = "-----END CERTIFICATE-----";
  std::vector<std::string> out;
  size_t pos = 0;
  while ((pos = pem.find(begin, pos)) != std::string::npos) {
    size_t stop = pem.find(end, pos + begin.size());
    if (stop == std::string::npos) break;  // a truncated last block is not a certificate
    stop += end.size();
    out.push_back(pem.substr(pos, stop - pos) + "\n");
    pos = stop;
  }
  return out;
}

bool key_matches_certificate(const std::string& key_pem, const std::string& cert_pem) {
  auto key = ossl::load_private_key(key_pem);
  auto cert = ossl::load_certificate(cert_pem);
  if (!key.ok() || !cert.ok()) return false;
  EVP_PKEY* pub = X509_get0_pubkey(cert->get());
  bool match = pub != nullptr && EVP_PKEY_eq(pub, key->get()) == 1;
  ossl::clear_errors();
  return match;
}

std::string random_hex(size_t bytes) {
  std::string raw(bytes, '\0');
  random_bytes_or_die(reinterpret_cast<unsigned char*>(raw.data()), bytes);
  std::string hex = to_hex(reinterpret_cast<const unsigned char*>(raw.data()), bytes);
  OPENSSL_cleanse(raw.data(), raw.size());
  return hex;
}

std::string random_token_chars(size_t n) {
  static const char alphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  constexpr unsigned kSize = 36;
  // Rejection sampling: only bytes below 252 (= 7 * 36) are used, so every
  // character is equally likely; a plain `byte % 36` would favour the first 4.
  constexpr unsigned kLimit = 256 - 256 % kSize;
  std::string out;
  out.reserve(n);
  unsigned char buf[64];
  while (out.size() < n) {
    random_bytes_or_die(buf, sizeof buf);
    for (unsigned char b : buf) {
      if (b >= kLimit) continue;
      out.push_back(alphabet[b % kSize]);
      if (out.size() == n) break;
    }
  }
  OPENSSL_cleanse(buf, sizeof buf);
  return out;
}

std::string sha256_hex(std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (EVP_Digest(data.data(), data.size(), md, &n, EVP_sha256(), nullptr) != 1) {
    // SHA-256 over memory cannot fail short of a broken library.
    std::fprintf(stderr, "factory: fatal: %s\n", ossl::error_text("SHA-256").c_str());
    std::abort();
  }
  return to_hex(md, n);
}

bool is_sha256_hex(std::string_view text) {
  if (text.size() != 64) return false;
  for (char c : text)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

Result<std::string> base64_decode(std::string_view text) {
  if (text.size() % 4 != 0)
    return Error(Errc::invalid_argument, "not base64: length is not a multiple of 4");
  for (char c : text)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '/' || c == '='))
      return Error(Errc::invalid_argument, "not base64: a character outside its alphabet");
  std::string out(text.size() / 4 * 3, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(text.data()),
                          static_cast<int>(text.size()));
  if (n < 0) return Error(Errc::invalid_argument, "not base64");
  // EVP_DecodeBlock counts the padding as data: take it off again.
  std::size_t pad = 0;
  if (!text.empty() && text.back() == '=') ++pad;
  if (text.size() > 1 && text[text.size() - 2] == '=') ++pad;
  out.resize(static_cast<std::size_t>(n) - pad);
  return out;
}

bool secure_equals(std::string_view a, std::string_view b) {
  // Lengths of our secrets are fixed by their format and not secret; only the
  // content comparison must not stop at the first differing byte.
  if (a.size() != b.size()) return false;
  if (a.empty()) return true;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace factory::pki
