#pragma once
// Key, CSR and certificate helpers both binaries need (OpenSSL 3).
// The agent makes its key and CSR; the coordinator inspects what it signs.
// Keys are ECDSA P-256 throughout.
#include <string>
#include <vector>

#include "common/durations.hpp"
#include "common/error.hpp"

struct x509_st;  // OpenSSL's X509

namespace factory::pki {

struct CertInfo {
  std::string subject_cn;
  std::string subject_o;
  std::string issuer_cn;
  std::string serial_hex;  // lower-case hex, no separators
  Clock::time_point not_before;
  Clock::time_point not_after;
  std::vector<std::string> dns_names;
  std::vector<std::string> ip_addresses;
  bool is_ca = false;
};

// A fresh ECDSA P-256 private key, PEM (PKCS#8).
Result<std::string> generate_private_key();
// A PKCS#10 CSR signed by key_pem, subject CN=common_name.
Result<std::string> make_csr(const std::string& key_pem, const std::string& common_name);
Result<CertInfo> inspect_certificate(const std::string& cert_pem);
// The same of a certificate OpenSSL holds already (a TLS peer's), without
// writing and parsing it as PEM: what a server does on every handshake.
Result<CertInfo> inspect_certificate(const x509_st* cert);
// SHA-256 of the certificate's DER, lower-case hex: what `--ca-sha256` pins.
Result<std::string> certificate_sha256(const std::string& cert_pem);
// Splits a PEM bundle into its certificates (each a full PEM block).
std::vector<std::string> split_pem_certificates(const std::string& pem);
// True when the PEM private key matches the certificate's public key.
bool key_matches_certificate(const std::string& key_pem, const std::string& cert_pem);
// Random bytes as lower-case hex / URL-safe alphabet, from OpenSSL's CSPRNG.
std::string random_hex(size_t bytes);
std::string random_token_chars(size_t n);  // [a-z0-9]
std::string sha256_hex(std::string_view data);
// Whether text is a SHA-256 as sha256_hex writes it: 64 lower-case hex digits.
bool is_sha256_hex(std::string_view text);
// Standard base64 (RFC 4648, padded), as Kubernetes Secret data is: an
// invalid_argument error for anything else.
Result<std::string> base64_decode(std::string_view text);
// Constant-time equality for secrets.
bool secure_equals(std::string_view a, std::string_view b);

}  // namespace factory::pki
