// The enrollment CA with real OpenSSL: what it issues is checked with
// X509_verify_cert and, where it matters, with the `openssl` command line.
#include <gtest/gtest.h>
#include <openssl/pem.h>
#include <sys/stat.h>

#include <cstring>

#include "common/atomic_file.hpp"
#include "common/ossl.hpp"
#include "common/pki.hpp"
#include "coordinator/enroll/ca.hpp"
#include "coordinator/enroll/tenant_name.hpp"
#include "tests/support/test_support.hpp"

namespace fs = std::filesystem;
namespace pki = factory::pki;
namespace ossl = factory::ossl;
using factory::Clock;
using factory::Errc;
using factory::enroll::CertificateAuthority;
using factory::testing::TempDir;
using namespace std::chrono_literals;

namespace {

unsigned mode_of(const fs::path& p) {
  struct stat st {};
  EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
  return st.st_mode & 07777;
}

CertificateAuthority make_ca(const fs::path& dir) {
  auto ca = CertificateAuthority::load_or_create(dir);
  EXPECT_TRUE(ca.ok()) << (ca.ok() ? "" : ca.error().message);
  return std::move(ca).value();
}

// "" when `leaf_pem` chains to `ca_pem` for `purpose` (and host / IP when
// given), otherwise OpenSSL's reason.
std::string verify(const std::string& leaf_pem, const std::string& ca_pem, int purpose,
                   const std::string& host = "", const std::string& ip = "") {
  auto leaf = ossl::load_certificate(leaf_pem);
  auto ca = ossl::load_certificate(ca_pem);
  if (!leaf.ok() || !ca.ok()) return "unparseable";
  ossl::X509StorePtr store(X509_STORE_new());
  X509_STORE_add_cert(store.get(), ca->get());
  ossl::X509StoreCtxPtr ctx(X509_STORE_CTX_new());
  X509_STORE_CTX_init(ctx.get(), store.get(), leaf->get(), nullptr);
  X509_STORE_CTX_set_purpose(ctx.get(), purpose);
  X509_VERIFY_PARAM* param = X509_STORE_CTX_get0_param(ctx.get());
  if (!host.empty()) X509_VERIFY_PARAM_set1_host(param, host.c_str(), 0);
  if (!ip.empty()) X509_VERIFY_PARAM_set1_ip_asc(param, ip.c_str());
  int rc = X509_verify_cert(ctx.get());
  std::string why =
      rc == 1 ? "" : X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx.get()));
  ossl::clear_errors();
  return why;
}

std::string agent_csr(const std::string& key_pem, const std::string& cn) {
  auto csr = pki::make_csr(key_pem, cn);
  EXPECT_TRUE(csr.ok());
  return *csr;
}

// The CSR with bytes `from` replaced by `to` in its DER, signature untouched:
// what an attacker editing a captured CSR would send.
std::string tamper(const std::string& csr_pem, const std::string& from, const std::string& to) {
  auto req = ossl::load_csr(csr_pem);
  EXPECT_TRUE(req.ok());
  unsigned char* der = nullptr;
  int len = i2d_X509_REQ(req->get(), &der);
  std::string bytes(reinterpret_cast<char*>(der), static_cast<size_t>(len));
  OPENSSL_free(der);
  size_t at = bytes.find(from);
  EXPECT_NE(at, std::string::npos);
  bytes.replace(at, from.size(), to);
  ossl::BioPtr bio(BIO_new(BIO_s_mem()));
  PEM_write_bio(bio.get(), "CERTIFICATE REQUEST", "",
                reinterpret_cast<const unsigned char*>(bytes.data()),
                static_cast<long>(bytes.size()));
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

std::string key_of_type(const char* type, const char* param) {
  ossl::PkeyPtr key(std::strcmp(type, "RSA") == 0
                        ? EVP_PKEY_Q_keygen(nullptr, nullptr, "RSA", static_cast<size_t>(2048))
                        : EVP_PKEY_Q_keygen(nullptr, nullptr, type, param));
  EXPECT_TRUE(key);
  return *ossl::private_key_to_pem(key.get());
}

}  // namespace

TEST(EnrollCa, CreatedOnceThenReloadedIdentical) {
  TempDir tmp("ca");
  fs::path state = tmp / "state";  // does not exist yet
  CertificateAuthority ca = make_ca(state);
  EXPECT_EQ(mode_of(state), 0700u);
  EXPECT_EQ(mode_of(state / "ca.key"), 0600u);
  EXPECT_EQ(mode_of(state / "ca.crt"), 0644u);
  EXPECT_EQ(factory::testing::slurp(state / "ca.crt"), ca.certificate_pem());
  EXPECT_EQ(ca.sha256(), *pki::certificate_sha256(ca.certificate_pem()));
  std::string key_before = factory::testing::slurp(state / "ca.key");

  auto info = pki::inspect_certificate(ca.certificate_pem());
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->subject_cn, "factory coordinator CA");
  EXPECT_EQ(info->issuer_cn, "factory coordinator CA");
  EXPECT_TRUE(info->is_ca);
  EXPECT_EQ(info->serial_hex.size(), 32u);
  EXPECT_NEAR(std::chrono::duration<double>(info->not_after - Clock::now()).count(), 3650.0 * 86400,
              5);
  EXPECT_TRUE(pki::key_matches_certificate(key_before, ca.certificate_pem()));
  EXPECT_EQ(verify(ca.certificate_pem(), ca.certificate_pem(), X509_PURPOSE_ANY), "");

  // The extensions as an independent reader sees them.
  auto text = factory::testing::run(
      {"openssl", "x509", "-in", (state / "ca.crt").string(), "-noout", "-text"});
  ASSERT_TRUE(text.ok()) << text.output;
  EXPECT_NE(text.output.find("ASN1 OID: prime256v1"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("X509v3 Basic Constraints: critical\n                CA:TRUE"),
            std::string::npos)
      << text.output;
  EXPECT_NE(
      text.output.find("X509v3 Key Usage: critical\n                Certificate Sign, CRL Sign"),
      std::string::npos)
      << text.output;
  EXPECT_NE(text.output.find("X509v3 Subject Key Identifier"), std::string::npos);

  CertificateAuthority again = make_ca(state);
  EXPECT_EQ(again.certificate_pem(), ca.certificate_pem());
  EXPECT_EQ(again.sha256(), ca.sha256());
  EXPECT_EQ(factory::testing::slurp(state / "ca.key"), key_before);
}

TEST(EnrollCa, RefusesAKeyFileOthersCanRead) {
  TempDir tmp("ca");
  make_ca(tmp.path());
  ASSERT_EQ(::chmod((tmp / "ca.key").c_str(), 0640), 0);
  auto ca = CertificateAuthority::load_or_create(tmp.path());
  ASSERT_FALSE(ca.ok());
  EXPECT_EQ(ca.error().code, Errc::failed_precondition);
  EXPECT_NE(ca.error().message.find("mode 0640"), std::string::npos) << ca.error().message;
  EXPECT_NE(ca.error().message.find("chmod 600"), std::string::npos) << ca.error().message;
  EXPECT_EQ(mode_of(tmp / "ca.key"), 0640u);  // refused, not "fixed" behind the admin's back
}

TEST(EnrollCa, RefusesAKeyThatIsNotTheCertificates) {
  TempDir tmp("ca");
  make_ca(tmp.path());
  ASSERT_TRUE(factory::write_file_atomic(tmp / "ca.key", *pki::generate_private_key(), 0600).ok());
  auto ca = CertificateAuthority::load_or_create(tmp.path());
  ASSERT_FALSE(ca.ok());
  EXPECT_NE(ca.error().message.find("is not the key of"), std::string::npos) << ca.error().message;
}

TEST(EnrollCa, RefusesHalfACaAndLeavesItAlone) {
  TempDir tmp("ca");
  make_ca(tmp.path());
  std::string key = factory::testing::slurp(tmp / "ca.key");
  fs::remove(tmp / "ca.crt");
  auto ca = CertificateAuthority::load_or_create(tmp.path());
  ASSERT_FALSE(ca.ok());
  EXPECT_EQ(ca.error().code, Errc::failed_precondition);
  EXPECT_NE(ca.error().message.find("ca.crt is missing"), std::string::npos) << ca.error().message;
  EXPECT_FALSE(fs::exists(tmp / "ca.crt"));
  EXPECT_EQ(factory::testing::slurp(tmp / "ca.key"), key);

  ASSERT_TRUE(factory::write_file_atomic(tmp / "ca.crt", "garbage", 0644).ok());
  auto garbage = CertificateAuthority::load_or_create(tmp.path());
  ASSERT_FALSE(garbage.ok());
  EXPECT_NE(garbage.error().message.find("not a PEM certificate"), std::string::npos)
      << garbage.error().message;
}

TEST(EnrollCa, ServerCertificateVerifiesWithItsSans) {
  TempDir tmp("ca");
  CertificateAuthority ca = make_ca(tmp.path());
  auto issued =
      ca.issue_server_certificate({"127.0.0.1", "::1", "localhost", "factory.example.com"}, 24h);
  ASSERT_TRUE(issued.ok()) << issued.error().message;

  auto chain = pki::split_pem_certificates(issued->certificate_pem);
  ASSERT_EQ(chain.size(), 2u);
  EXPECT_EQ(chain[1], ca.certificate_pem());
  EXPECT_TRUE(pki::key_matches_certificate(issued->private_key_pem, chain[0]));
  EXPECT_FALSE(pki::key_matches_certificate(issued->private_key_pem, ca.certificate_pem()));

  auto info = pki::inspect_certificate(chain[0]);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->dns_names, (std::vector<std::string>{"localhost", "factory.example.com"}));
  EXPECT_EQ(info->ip_addresses, (std::vector<std::string>{"127.0.0.1", "::1"}));
  EXPECT_EQ(info->issuer_cn, "factory coordinator CA");
  EXPECT_FALSE(info->is_ca);
  EXPECT_EQ(info->serial_hex, issued->serial_hex);
  EXPECT_EQ(info->not_after, issued->not_after);
  auto now = Clock::now();
  EXPECT_NEAR(std::chrono::duration<double>(info->not_after - now).count(), 24 * 3600, 5);
  EXPECT_NEAR(std::chrono::duration<double>(now - info->not_before).count(), 5 * 60, 5);

  EXPECT_EQ(verify(chain[0], ca.certificate_pem(), X509_PURPOSE_SSL_SERVER, "localhost"), "");
  EXPECT_EQ(verify(chain[0], ca.certificate_pem(), X509_PURPOSE_SSL_SERVER, "", "127.0.0.1"), "");
  EXPECT_EQ(verify(chain[0], ca.certificate_pem(), X509_PURPOSE_SSL_SERVER, "", "::1"), "");
  EXPECT_NE(verify(chain[0], ca.certificate_pem(), X509_PURPOSE_SSL_SERVER, "evil.example.com"),
            "");
  EXPECT_NE(verify(chain[0], ca.certificate_pem(), X509_PURPOSE_SSL_SERVER, "", "10.0.0.1"), "");
  // serverAuth only: it cannot be used as a client certificate.
  EXPECT_NE(verify(chain[0], ca.certificate_pem(), X509_PURPOSE_SSL_CLIENT), "");
  // A different CA (what an agent pinned to the wrong CA has) does not accept it.
  TempDir other("ca2");
  EXPECT_NE(verify(chain[0], make_ca(other.path()).certificate_pem(), X509_PURPOSE_SSL_SERVER), "");

  // The openssl CLI agrees.
  ASSERT_TRUE(factory::write_file_atomic(tmp / "server.crt", chain[0]).ok());
  auto r = factory::testing::run({"openssl", "verify", "-CAfile", (tmp / "ca.crt").string(),
                                  "-purpose", "sslserver", "-verify_hostname", "localhost",
                                  (tmp / "server.crt").string()});
  EXPECT_TRUE(r.ok()) << r.output;
}

TEST(EnrollCa, ServerCertificateRefusesBadHosts) {
  TempDir tmp("ca");
  CertificateAuthority ca = make_ca(tmp.path());
  for (auto hosts : std::vector<std::vector<std::string>>{
           {}, {""}, {"localhost,DNS:evil.com"}, {"a..b"}, {"[::1]"}, {"host name"}, {"x/y"}}) {
    auto r = ca.issue_server_certificate(hosts, 1h);
    ASSERT_FALSE(r.ok()) << (hosts.empty() ? "(none)" : hosts[0]);
    EXPECT_EQ(r.error().code, Errc::invalid_argument);
  }
  EXPECT_FALSE(ca.issue_server_certificate({"localhost"}, 0s).ok());
}

TEST(EnrollCa, AgentCertificateNamesTheTenantNotWhatTheCsrAsked) {
  TempDir tmp("ca");
  CertificateAuthority ca = make_ca(tmp.path());
  std::string key = *pki::generate_private_key();
  // The agent asks to be someone else; the coordinator decides who it is.
  auto issued = ca.sign_agent_csr(agent_csr(key, "team-b"), "team-a", 1h);
  ASSERT_TRUE(issued.ok()) << issued.error().message;
  EXPECT_TRUE(issued->private_key_pem.empty());

  auto chain = pki::split_pem_certificates(issued->certificate_pem);
  ASSERT_EQ(chain.size(), 2u);
  EXPECT_EQ(chain[1], ca.certificate_pem());
  EXPECT_TRUE(pki::key_matches_certificate(key, chain[0]));
  auto info = pki::inspect_certificate(chain[0]);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->subject_cn, "team-a");
  EXPECT_EQ(info->subject_o, "factory-agent");
  EXPECT_EQ(info->issuer_cn, "factory coordinator CA");
  EXPECT_FALSE(info->is_ca);
  EXPECT_TRUE(info->dns_names.empty());
  EXPECT_EQ(info->serial_hex, issued->serial_hex);
  EXPECT_EQ(info->serial_hex.size(), 32u);
  auto now = Clock::now();
  EXPECT_NEAR(std::chrono::duration<double>(info->not_after - now).count(), 3600, 5);
  EXPECT_NEAR(std::chrono::duration<double>(now - info->not_before).count(), 300, 5);

  EXPECT_EQ(verify(chain[0], ca.certificate_pem(), X509_PURPOSE_SSL_CLIENT), "");
  EXPECT_NE(verify(chain[0], ca.certificate_pem(), X509_PURPOSE_SSL_SERVER), "");

  auto tenant = factory::enroll::tenant_of_client_certificate(issued->certificate_pem);
  ASSERT_TRUE(tenant.ok()) << tenant.error().message;
  EXPECT_EQ(*tenant, "team-a");

  // Renewal with the same key: a fresh serial every time.
  auto again = ca.sign_agent_csr(agent_csr(key, "whatever"), "team-a", 1h);
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again->serial_hex, issued->serial_hex);
}

TEST(EnrollCa, AgentCertificateNeverOutlivesTheCa) {
  TempDir tmp("ca");
  CertificateAuthority ca = make_ca(tmp.path());
  auto issued = ca.sign_agent_csr(agent_csr(*pki::generate_private_key(), "x"), "t1",
                                  std::chrono::hours(24 * 365 * 20));
  ASSERT_TRUE(issued.ok());
  EXPECT_EQ(issued->not_after, ca.not_after());
}

TEST(EnrollCa, RefusesBadCsrs) {
  TempDir tmp("ca");
  CertificateAuthority ca = make_ca(tmp.path());
  std::string csr = agent_csr(*pki::generate_private_key(), "original-cn");

  auto tampered = ca.sign_agent_csr(tamper(csr, "original-cn", "tampered-cn"), "t1", 1h);
  ASSERT_FALSE(tampered.ok());
  EXPECT_EQ(tampered.error().code, Errc::invalid_argument);
  EXPECT_EQ(tampered.error().message, "CSR signature invalid");

  for (std::string bad : {std::string("garbage"), std::string(""), csr.substr(0, csr.size() / 2),
                          ca.certificate_pem()}) {
    auto r = ca.sign_agent_csr(bad, "t1", 1h);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, Errc::invalid_argument);
    EXPECT_EQ(r.error().message.rfind("malformed CSR", 0), 0u) << r.error().message;
  }

  auto rsa = ca.sign_agent_csr(agent_csr(key_of_type("RSA", nullptr), "x"), "t1", 1h);
  ASSERT_FALSE(rsa.ok());
  EXPECT_EQ(rsa.error().code, Errc::invalid_argument);
  EXPECT_NE(rsa.error().message.find("CSR key is RSA"), std::string::npos) << rsa.error().message;
  EXPECT_NE(rsa.error().message.find("P-256"), std::string::npos);

  auto p384 = ca.sign_agent_csr(agent_csr(key_of_type("EC", "P-384"), "x"), "t1", 1h);
  ASSERT_FALSE(p384.ok());
  EXPECT_NE(p384.error().message.find("secp384r1"), std::string::npos) << p384.error().message;

  auto bad_tenant = ca.sign_agent_csr(csr, "Team_A", 1h);
  ASSERT_FALSE(bad_tenant.ok());
  EXPECT_EQ(bad_tenant.error().code, Errc::invalid_argument);
  EXPECT_FALSE(ca.sign_agent_csr(csr, "t1", 0s).ok());
}

TEST(EnrollCa, TenantOfClientCertificateOnlyForAgentCertificates) {
  TempDir tmp("ca");
  CertificateAuthority ca = make_ca(tmp.path());
  auto server = ca.issue_server_certificate({"localhost"}, 1h);
  ASSERT_TRUE(server.ok());
  auto r = factory::enroll::tenant_of_client_certificate(server->certificate_pem);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::permission_denied);
  EXPECT_FALSE(factory::enroll::tenant_of_client_certificate(ca.certificate_pem()).ok());
  EXPECT_FALSE(factory::enroll::tenant_of_client_certificate("garbage").ok());
  EXPECT_EQ(factory::enroll::tenant_of_client_certificate(static_cast<X509*>(nullptr)).error().code,
            Errc::unauthenticated);

  // A certificate that claims O=factory-agent but is meant for servers.
  auto key = pki::generate_private_key();
  TempDir cli("cli");
  ASSERT_TRUE(factory::write_file_atomic(cli / "k.pem", *key, 0600).ok());
  auto made =
      factory::testing::run({"openssl", "req", "-x509", "-key", (cli / "k.pem").string(), "-out",
                             (cli / "c.pem").string(), "-days", "1", "-subj",
                             "/O=factory-agent/CN=t1", "-addext", "extendedKeyUsage=serverAuth"});
  ASSERT_TRUE(made.ok()) << made.output;
  auto server_eku =
      factory::enroll::tenant_of_client_certificate(factory::testing::slurp(cli / "c.pem"));
  ASSERT_FALSE(server_eku.ok());
  EXPECT_EQ(server_eku.error().code, Errc::permission_denied);
}

TEST(TenantName, AcceptsDns1123Labels) {
  using factory::enroll::validate_tenant_name;
  for (const char* ok : {"a", "t1", "team-a", "0", "a-b-c-9",
                         "abcdefghijklmnopqrstuvwxyz0123456789-abcdefghijklmnopqrstuvwxyz"})
    EXPECT_TRUE(validate_tenant_name(ok).ok()) << ok;
  for (std::string bad :
       {std::string(""), std::string("-a"), std::string("a-"), std::string("Team"),
        std::string("team_a"), std::string("a.b"), std::string("a b"), std::string(64, 'a'),
        std::string("caf\xc3\xa9"), std::string("a\nb")}) {
    auto st = validate_tenant_name(bad);
    ASSERT_FALSE(st.ok()) << bad;
    EXPECT_EQ(st.error().code, Errc::invalid_argument);
    EXPECT_EQ(st.error().message.find('\n'), std::string::npos);
  }
  EXPECT_EQ(std::string(63, 'a').size(), factory::enroll::kMaxTenantNameLength);
  EXPECT_TRUE(validate_tenant_name(std::string(63, 'a')).ok());
}

// A model endpoint's certificate: from the endpoint CA (its own files and
// name beside the agents' CA), for the host the coordinator names, whatever
// the guest's CSR asks; serverAuth only; and the agents' CA never accepts it,
// so a guest holding it cannot pose as the coordinator.
TEST(EnrollCa, EndpointCertificatesComeFromTheirOwnCaForTheCoordinatorsHost) {
  TempDir tmp("ca-endpoint");
  CertificateAuthority agents_ca = make_ca(tmp.path());
  auto ep = CertificateAuthority::load_or_create(tmp.path(), factory::enroll::kEndpointCaFiles);
  ASSERT_TRUE(ep.ok()) << ep.error().message;
  EXPECT_TRUE(std::filesystem::exists(tmp.path() / "endpoint-ca.key"));
  EXPECT_NE(ep->certificate_pem(), agents_ca.certificate_pem());
  auto again = CertificateAuthority::load_or_create(tmp.path(), factory::enroll::kEndpointCaFiles);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->certificate_pem(), ep->certificate_pem()) << "reloaded, not made anew";

  auto key = pki::generate_private_key();
  ASSERT_TRUE(key.ok());
  auto csr = pki::make_csr(*key, "evil.example.com");
  ASSERT_TRUE(csr.ok());
  auto issued = ep->sign_endpoint_csr(*csr, "t5", {"127.0.0.1"}, 24h);
  ASSERT_TRUE(issued.ok()) << issued.error().message;
  auto chain = pki::split_pem_certificates(issued->certificate_pem);
  ASSERT_EQ(chain.size(), 2u);
  EXPECT_TRUE(pki::key_matches_certificate(*key, chain[0]));
  auto info = pki::inspect_certificate(chain[0]);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->issuer_cn, "factory model endpoint CA");
  EXPECT_EQ(info->ip_addresses, (std::vector<std::string>{"127.0.0.1"}));
  EXPECT_TRUE(info->dns_names.empty()) << "the CSR's name is not taken";
  EXPECT_EQ(verify(chain[0], ep->certificate_pem(), X509_PURPOSE_SSL_SERVER, "", "127.0.0.1"), "");
  EXPECT_NE(verify(chain[0], ep->certificate_pem(), X509_PURPOSE_SSL_CLIENT), "");
  EXPECT_NE(verify(chain[0], agents_ca.certificate_pem(), X509_PURPOSE_SSL_SERVER, "", "127.0.0.1"),
            "")
      << "the agents' CA must not accept an endpoint's certificate";
  EXPECT_FALSE(ep->sign_endpoint_csr(*csr, "t5", {}, 24h).ok()) << "a host is required";
  EXPECT_FALSE(ep->sign_endpoint_csr("not a csr", "t5", {"127.0.0.1"}, 24h).ok());
}

// A CA kept elsewhere than in files (the replicas' database,
// coordinator/shared): made in memory, writing nothing, and held to the
// checks of the files, its refusals naming where it is kept.
TEST(EnrollCa, ACaFromPemIsCheckedAsItsFilesAre) {
  TempDir tmp("ca-pem");
  auto made = CertificateAuthority::create_pem();
  ASSERT_TRUE(made.ok()) << made.error().message;
  EXPECT_TRUE(std::filesystem::is_empty(tmp.path()));
  auto ca = CertificateAuthority::from_pem(*made, "the database");
  ASSERT_TRUE(ca.ok()) << ca.error().message;
  EXPECT_EQ(ca->certificate_pem(), made->certificate_pem);
  EXPECT_EQ(ca->sha256(), *pki::certificate_sha256(made->certificate_pem));
  // What read_files reads is what load_or_create loads.
  EXPECT_FALSE(*CertificateAuthority::read_files(tmp.path()));
  CertificateAuthority on_disk = make_ca(tmp.path());
  auto read = CertificateAuthority::read_files(tmp.path());
  ASSERT_TRUE(read.ok() && *read);
  EXPECT_EQ((*read)->certificate_pem, on_disk.certificate_pem());
  auto other = CertificateAuthority::create_pem();
  ASSERT_TRUE(other.ok());
  auto mismatched = CertificateAuthority::from_pem(
      factory::enroll::CaPem{made->certificate_pem, other->private_key_pem}, "the database");
  ASSERT_FALSE(mismatched.ok());
  EXPECT_EQ(mismatched.error().code, factory::Errc::failed_precondition);
  EXPECT_EQ(mismatched.error().message,
            "load CA: the database (key) is not the key of the database (certificate); restore "
            "the matching pair from a backup");
}
