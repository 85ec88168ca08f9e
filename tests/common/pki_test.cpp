// common/pki against real OpenSSL: keys and CSRs we make are read back by
// OpenSSL itself, and certificates made by the `openssl` command line (a
// tool we did not write) are inspected and fingerprinted by our code.
#include "common/pki.hpp"

#include <gtest/gtest.h>
#include <openssl/x509.h>

#include <algorithm>
#include <map>
#include <regex>

#include "common/atomic_file.hpp"
#include "common/ossl.hpp"
#include "tests/support/test_support.hpp"

namespace pki = factory::pki;
namespace ossl = factory::ossl;
using factory::testing::TempDir;

namespace {

std::string read(const std::filesystem::path& p) {
  return factory::testing::slurp(p);
}

// A self-signed certificate made by the openssl CLI with known fields.
struct CliCert {
  std::string cert_pem;
  std::string key_pem;
};

CliCert openssl_cli_cert(const TempDir& dir, const std::string& name, bool ca) {
  auto key = dir / (name + ".key");
  auto crt = dir / (name + ".crt");
  std::vector<std::string> argv = {
      "openssl",
      "req",
      "-x509",
      "-newkey",
      "ec",
      "-pkeyopt",
      "ec_paramgen_curve:P-256",
      "-nodes",
      "-keyout",
      key.string(),
      "-out",
      crt.string(),
      "-days",
      "30",
      "-subj",
      "/O=Example Org/CN=" + name,
      "-set_serial",
      "0x0a1b2c3d4e5f",
      "-addext",
      "subjectAltName=DNS:" + name + ".example.com,DNS:localhost,IP:127.0.0.1,IP:::1",
      "-addext",
      ca ? "basicConstraints=critical,CA:TRUE" : "basicConstraints=critical,CA:FALSE"};
  auto r = factory::testing::run(argv);
  EXPECT_TRUE(r.ok()) << r.output;
  return {read(crt), read(key)};
}

}  // namespace

TEST(Pki, GeneratesP256KeyInPkcs8) {
  auto pem = pki::generate_private_key();
  ASSERT_TRUE(pem.ok()) << pem.error().message;
  EXPECT_EQ(pem->rfind("-----BEGIN PRIVATE KEY-----\n", 0), 0u) << *pem;
  auto key = ossl::load_private_key(*pem);
  ASSERT_TRUE(key.ok());
  EXPECT_EQ(EVP_PKEY_is_a(key->get(), "EC"), 1);
  char group[64] = {};
  size_t len = 0;
  ASSERT_EQ(EVP_PKEY_get_group_name(key->get(), group, sizeof group, &len), 1);
  EXPECT_STREQ(group, "prime256v1");
  // Two keys are two different keys.
  EXPECT_NE(*pem, *pki::generate_private_key());
}

TEST(Pki, CsrIsSignedByTheKeyAndNamesTheCn) {
  auto key = pki::generate_private_key();
  ASSERT_TRUE(key.ok());
  auto csr = pki::make_csr(*key, "agent-7");
  ASSERT_TRUE(csr.ok()) << csr.error().message;
  auto req = ossl::load_csr(*csr);
  ASSERT_TRUE(req.ok());
  EVP_PKEY* pub = X509_REQ_get0_pubkey(req->get());
  ASSERT_NE(pub, nullptr);
  EXPECT_EQ(X509_REQ_verify(req->get(), pub), 1);
  EXPECT_EQ(ossl::name_entry(X509_REQ_get_subject_name(req->get()), NID_commonName), "agent-7");
  auto priv = ossl::load_private_key(*key);
  ASSERT_TRUE(priv.ok());
  EXPECT_EQ(EVP_PKEY_eq(pub, priv->get()), 1);

  // And the openssl CLI agrees the signature is good.
  TempDir dir("pki");
  ASSERT_TRUE(factory::write_file_atomic(dir / "a.csr", *csr).ok());
  auto r = factory::testing::run(
      {"openssl", "req", "-in", (dir / "a.csr").string(), "-verify", "-noout"});
  EXPECT_TRUE(r.ok()) << r.output;
}

TEST(Pki, CsrRefusesBadInput) {
  auto csr = pki::make_csr("not a key", "x");
  ASSERT_FALSE(csr.ok());
  EXPECT_EQ(csr.error().code, factory::Errc::invalid_argument);
  auto key = pki::generate_private_key();
  ASSERT_TRUE(key.ok());
  EXPECT_FALSE(pki::make_csr(*key, "").ok());
  // X.509 caps a CN at 64 characters.
  EXPECT_FALSE(pki::make_csr(*key, std::string(65, 'a')).ok());
}

TEST(Pki, InspectsACertificateTheOpensslCliMade) {
  TempDir dir("pki");
  CliCert leaf = openssl_cli_cert(dir, "node1", false);
  auto info = pki::inspect_certificate(leaf.cert_pem);
  ASSERT_TRUE(info.ok()) << info.error().message;
  EXPECT_EQ(info->subject_cn, "node1");
  EXPECT_EQ(info->subject_o, "Example Org");
  EXPECT_EQ(info->issuer_cn, "node1");
  EXPECT_EQ(info->serial_hex, "0a1b2c3d4e5f");  // as `openssl x509 -serial` prints it
  EXPECT_EQ(info->dns_names, (std::vector<std::string>{"node1.example.com", "localhost"}));
  EXPECT_EQ(info->ip_addresses, (std::vector<std::string>{"127.0.0.1", "::1"}));
  EXPECT_FALSE(info->is_ca);
  auto now = factory::Clock::now();
  EXPECT_LE(info->not_before, now);
  EXPECT_GT(info->not_before, now - std::chrono::minutes(5));
  auto lifetime = info->not_after - info->not_before;
  EXPECT_EQ(std::chrono::duration_cast<std::chrono::hours>(lifetime).count(), 30 * 24);

  CliCert ca = openssl_cli_cert(dir, "root", true);
  auto ca_info = pki::inspect_certificate(ca.cert_pem);
  ASSERT_TRUE(ca_info.ok());
  EXPECT_TRUE(ca_info->is_ca);

  auto bad =
      pki::inspect_certificate("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, factory::Errc::invalid_argument);
  EXPECT_FALSE(pki::inspect_certificate("").ok());
}

TEST(Pki, CertificateSha256MatchesTheOpensslCliFingerprint) {
  TempDir dir("pki");
  CliCert c = openssl_cli_cert(dir, "fp", false);
  auto ours = pki::certificate_sha256(c.cert_pem);
  ASSERT_TRUE(ours.ok());
  auto r = factory::testing::run(
      {"openssl", "x509", "-in", (dir / "fp.crt").string(), "-noout", "-fingerprint", "-sha256"});
  ASSERT_TRUE(r.ok()) << r.output;
  // "sha256 Fingerprint=AB:CD:..." -> "abcd..."
  std::string theirs = r.output.substr(r.output.find('=') + 1);
  std::string norm;
  for (char c : theirs)
    if (std::isxdigit(static_cast<unsigned char>(c)))
      norm.push_back(static_cast<char>(std::tolower(c)));
  EXPECT_EQ(*ours, norm);
  EXPECT_EQ(ours->size(), 64u);
  EXPECT_FALSE(pki::certificate_sha256("garbage").ok());
}

TEST(Pki, SplitsABundle) {
  TempDir dir("pki");
  CliCert a = openssl_cli_cert(dir, "a", false);
  CliCert b = openssl_cli_cert(dir, "b", true);
  std::string bundle =
      "comment line\n" + a.cert_pem + "\n" + b.cert_pem + "-----BEGIN CERTIFICATE-----\nMII";
  auto parts = pki::split_pem_certificates(bundle);
  ASSERT_EQ(parts.size(), 2u);  // the truncated third block is not a certificate
  EXPECT_EQ(parts[0], a.cert_pem);
  EXPECT_EQ(parts[1], b.cert_pem);
  EXPECT_EQ(pki::inspect_certificate(parts[1])->subject_cn, "b");
  EXPECT_TRUE(pki::split_pem_certificates("").empty());
  EXPECT_TRUE(pki::split_pem_certificates(a.key_pem).empty());
}

TEST(Pki, KeyMatchesCertificate) {
  TempDir dir("pki");
  CliCert a = openssl_cli_cert(dir, "a", false);
  CliCert b = openssl_cli_cert(dir, "b", false);
  EXPECT_TRUE(pki::key_matches_certificate(a.key_pem, a.cert_pem));
  EXPECT_FALSE(pki::key_matches_certificate(b.key_pem, a.cert_pem));
  EXPECT_FALSE(pki::key_matches_certificate(*pki::generate_private_key(), a.cert_pem));
  EXPECT_FALSE(pki::key_matches_certificate("garbage", a.cert_pem));
  EXPECT_FALSE(pki::key_matches_certificate(a.key_pem, "garbage"));
}

TEST(Pki, RandomHexHasTheRightShape) {
  std::string h = pki::random_hex(16);
  EXPECT_TRUE(std::regex_match(h, std::regex("[0-9a-f]{32}"))) << h;
  EXPECT_NE(h, pki::random_hex(16));
  EXPECT_EQ(pki::random_hex(0), "");
}

TEST(Pki, RandomTokenCharsAreUniformOverTheAlphabet) {
  const size_t n = 36 * 2000;
  std::string s = pki::random_token_chars(n);
  ASSERT_EQ(s.size(), n);
  std::map<char, int> count;
  for (char c : s) {
    ASSERT_TRUE((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) << c;
    ++count[c];
  }
  ASSERT_EQ(count.size(), 36u);
  // Chi-square with 35 degrees of freedom: 99.99th percentile ~ 77. A plain
  // `byte % 36` would put 'a'..'d' at 8/7 of the others and score ~ 300.
  double expected = static_cast<double>(n) / 36, chi2 = 0;
  for (auto& [c, k] : count) chi2 += (k - expected) * (k - expected) / expected;
  EXPECT_LT(chi2, 77.0);
  EXPECT_NE(pki::random_token_chars(32), pki::random_token_chars(32));
}

TEST(Pki, Sha256KnownAnswers) {
  EXPECT_EQ(pki::sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(pki::sha256_hex(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(Pki, SecureEquals) {
  EXPECT_TRUE(pki::secure_equals("secret", "secret"));
  EXPECT_FALSE(pki::secure_equals("secret", "secreT"));
  EXPECT_FALSE(pki::secure_equals("secret", "secret-longer"));
  EXPECT_FALSE(pki::secure_equals("", "x"));
  EXPECT_TRUE(pki::secure_equals("", ""));
  std::string with_nul("a\0b", 3), other("a\0c", 3);
  EXPECT_FALSE(pki::secure_equals(with_nul, other));
}

// Kubernetes Secret data is standard padded base64 (the API server's
// encoding of stringData); anything else is refused, never half-decoded.
TEST(Pki, Base64DecodesWhatTheApiServerWrites) {
  EXPECT_EQ(*pki::base64_decode(""), "");
  EXPECT_EQ(*pki::base64_decode("Zg=="), "f");
  EXPECT_EQ(*pki::base64_decode("Zm8="), "fo");
  EXPECT_EQ(*pki::base64_decode("Zm9v"), "foo");
  EXPECT_EQ(*pki::base64_decode("Zm1rLWFiYw=="), "fmk-abc");
  EXPECT_FALSE(pki::base64_decode("Zm9").ok()) << "length";
  EXPECT_FALSE(pki::base64_decode("Zm9v\n").ok()) << "a newline";
  EXPECT_FALSE(pki::base64_decode("Zm-v").ok()) << "the URL-safe alphabet";
}
