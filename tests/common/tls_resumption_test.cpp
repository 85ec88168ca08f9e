// TLS 1.3 session resumption between the agent's websocket client
// (common/net/ws_client.hpp, with a TlsSessionCache as the agent's link keeps
// one) and the coordinator's server (common/net/server.hpp, with the session
// ticket keys of common/net/tls_tickets.hpp), on loopback with a real PKI made
// by the openssl command (tests/fakes/testpki.py). What a resumption skips
// (the certificate, its signature and verification) is why it is cheap; what
// it must not skip is checked here: a certificate expired since, another
// client CA, a renewed certificate, keys past their life.
#include <gtest/gtest.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <mutex>
#include <thread>

#include "common/atomic_file.hpp"
#include "common/net/server.hpp"
#include "common/net/tls_tickets.hpp"
#include "common/net/ws_client.hpp"
#include "tests/support/test_support.hpp"

namespace factory::net {
namespace {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using namespace std::chrono_literals;
using factory::testing::TempDir;
using SysClock = std::chrono::system_clock;

void pki(const std::vector<std::string>& args) {
  std::vector<std::string> argv{
      "/usr/bin/python3", (factory::testing::source_dir() / "tests/fakes/testpki.py").string()};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = factory::testing::run(argv);
  ASSERT_TRUE(r.ok()) << r.output;
}

// A client certificate of the CA at dir/ca_name valid until `until` seconds
// from now: the openssl command cannot make one that expires in seconds.
std::pair<std::string, std::string> short_lived_cert(const fs::path& dir,
                                                     const std::string& ca_name, long until) {
  std::string ca_crt = factory::testing::slurp(dir / (ca_name + ".crt"));
  std::string ca_key = factory::testing::slurp(dir / (ca_name + ".key"));
  BIO* b = BIO_new_mem_buf(ca_crt.data(), static_cast<int>(ca_crt.size()));
  X509* ca = PEM_read_bio_X509(b, nullptr, nullptr, nullptr);
  BIO_free(b);
  b = BIO_new_mem_buf(ca_key.data(), static_cast<int>(ca_key.size()));
  EVP_PKEY* cakey = PEM_read_bio_PrivateKey(b, nullptr, nullptr, nullptr);
  BIO_free(b);
  EVP_PKEY* key = EVP_EC_gen("P-256");
  X509* x = X509_new();
  X509_set_version(x, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x), 777);
  X509_gmtime_adj(X509_getm_notBefore(x), -60);
  X509_gmtime_adj(X509_getm_notAfter(x), until);
  X509_NAME* name = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("tenant-1"), -1, -1, 0);
  X509_set_issuer_name(x, X509_get_subject_name(ca));
  X509_set_pubkey(x, key);
  X509_sign(x, cakey, EVP_sha256());
  auto to_pem = [](auto write) {
    BIO* out = BIO_new(BIO_s_mem());
    write(out);
    char* data = nullptr;
    long len = BIO_get_mem_data(out, &data);
    std::string s(data, static_cast<std::size_t>(len));
    BIO_free(out);
    return s;
  };
  std::string cert = to_pem([&](BIO* o) { PEM_write_bio_X509(o, x); });
  std::string keypem = to_pem(
      [&](BIO* o) { PEM_write_bio_PrivateKey(o, key, nullptr, nullptr, 0, nullptr, nullptr); });
  X509_free(x);
  X509_free(ca);
  EVP_PKEY_free(key);
  EVP_PKEY_free(cakey);
  return {cert, keypem};
}

// What the server saw of each websocket's peer.
struct Seen {
  std::mutex mu;
  std::vector<PeerInfo> peers;
  PeerInfo last() {
    std::lock_guard lk(mu);
    return peers.empty() ? PeerInfo{} : peers.back();
  }
};

// Echoes each message back.
struct Echo : WsHandler {
  std::shared_ptr<WsConnection> conn;
  std::mutex mu;
  void on_open(std::shared_ptr<WsConnection> c) override {
    std::lock_guard lk(mu);
    conn = std::move(c);
  }
  void on_message(std::string_view text) override {
    std::lock_guard lk(mu);
    if (conn) conn->send(std::string(text));
  }
  void on_close(const CloseInfo&) override {
    std::lock_guard lk(mu);
    conn.reset();
  }
};

// One connection as the agent makes it: connect, one message and its echo
// (by then the server's ticket has arrived), close.
asio::awaitable<Result<std::string>> round_trip(WsClientOptions o) {
  auto c = co_await WsClient::connect(o);
  if (!c) co_return c.error();
  std::string hello = "hello";
  if (auto st = co_await (*c)->write(hello); !st.ok()) co_return st.error();
  auto r = co_await (*c)->read();
  co_await (*c)->close();
  co_return r;
}

asio::awaitable<void> round_trip_into(WsClientOptions o, std::optional<Result<std::string>>* out) {
  *out = co_await round_trip(std::move(o));
}

class TlsResumptionTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("resumption-pki");
    std::string d = dir_->path().string();
    pki({"ca", d, "ca"});
    pki({"ca", d, "client-ca"});
    pki({"ca", d, "other-ca"});
    pki({"cert", d, "server", "ca", "factory-test-server", "--san", "IP:127.0.0.1"});
    pki({"cert", d, "client", "client-ca", "tenant-1", "--client", "--org", "factory-agent"});
    pki({"cert", d, "renewed", "client-ca", "tenant-1", "--client", "--org", "factory-agent"});
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string pem(const std::string& f) { return factory::testing::slurp(dir_->path() / f); }

  void TearDown() override { stop(); }

  // The agents endpoint as the coordinator runs it: client CA, expired
  // certificates let through for renewal, tickets from the key file.
  void start(const fs::path& keys, std::string client_ca = "", bool accept_expired = true) {
    auto k = TicketKeys::open(keys);
    ASSERT_TRUE(k.ok()) << k.error().message;
    ServerOptions o;
    o.listen = "127.0.0.1:0";
    o.name = "agents";
    o.tls.cert_chain_pem = pem("server.crt") + pem("ca.crt");
    o.tls.key_pem = pem("server.key");
    o.tls.client_ca_pem = client_ca.empty() ? pem("client-ca.crt") : client_ca;
    o.tls.accept_expired_client_certs = accept_expired;
    o.tls.ticket_keys = *k;
    pool_ = std::make_unique<IoPool>(1);
    server_ = std::make_unique<Server>(*pool_, std::move(o));
    server_->on_websocket([this](const HttpRequestIn&, const PeerInfo& p) {
      std::lock_guard lk(seen_.mu);
      seen_.peers.push_back(p);
      return std::make_shared<Echo>();
    });
    auto st = server_->start();
    ASSERT_TRUE(st.ok()) << st.error().message;
    runner_ = std::thread([p = pool_.get()] { p->run(); });
  }

  void stop() {
    if (server_) server_->stop();
    if (pool_) pool_->stop();
    if (runner_.joinable()) runner_.join();
    server_.reset();
    pool_.reset();
  }

  WsClientOptions client(const std::string& cert, const std::string& key) {
    WsClientOptions o;
    o.url = "wss://127.0.0.1:" + std::to_string(server_->port()) + "/v1/agent";
    o.tls.ca_pem = pem("ca.crt");
    o.tls.client_cert_pem = cert;
    o.tls.client_key_pem = key;
    o.tls.sessions = sessions_;
    o.connect_timeout = 5s;
    return o;
  }
  WsClientOptions client() { return client(pem("client.crt"), pem("client.key")); }

  // Connects once; the peer the server saw at the websocket's upgrade.
  PeerInfo connect(const WsClientOptions& o) {
    asio::io_context ioc;
    std::optional<Result<std::string>> r;
    asio::co_spawn(ioc, round_trip_into(o, &r), asio::detached);
    ioc.run();
    EXPECT_TRUE(r && r->ok()) << (r ? r->error().message : "no answer");
    if (r && r->ok()) {
      EXPECT_EQ(**r, "hello");
    }
    return seen_.last();
  }

  static TempDir* dir_;
  std::shared_ptr<TlsSessionCache> sessions_ = std::make_shared<TlsSessionCache>();
  Seen seen_;
  std::unique_ptr<IoPool> pool_;
  std::unique_ptr<Server> server_;
  std::thread runner_;
};
TempDir* TlsResumptionTest::dir_ = nullptr;

TEST_F(TlsResumptionTest, AReconnectResumesAndSoDoesOneToARestartedServer) {
  TempDir state("tickets");
  start(state.path() / "keys.json");
  PeerInfo first = connect(client());
  EXPECT_FALSE(first.resumed);
  EXPECT_TRUE(first.has_client_cert);
  PeerInfo second = connect(client());
  EXPECT_TRUE(second.resumed);
  // The identity a resumed session carries is the one verified first.
  EXPECT_TRUE(second.has_client_cert);
  EXPECT_FALSE(second.client_cert_expired);
  EXPECT_EQ(second.subject_cn, "tenant-1");
  EXPECT_EQ(second.serial_hex, first.serial_hex);
  EXPECT_EQ(server_->stats().handshakes_full, 1u);
  EXPECT_EQ(server_->stats().handshakes_resumed, 1u);

  // A restarted coordinator reads its keys back: the agents it knew resume.
  stop();
  start(state.path() / "keys.json");
  EXPECT_TRUE(connect(client()).resumed);
  EXPECT_EQ(server_->stats().handshakes_resumed, 1u);
  struct stat st {};
  ASSERT_EQ(::stat((state.path() / "keys.json").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(TlsResumptionTest, OtherKeysOrAnotherClientCaMeanAFullHandshake) {
  TempDir state("tickets");
  start(state.path() / "a.json");
  connect(client());
  ASSERT_TRUE(connect(client()).resumed);
  // Keys the client's ticket was not sealed with (a lost key file).
  stop();
  start(state.path() / "b.json");
  EXPECT_FALSE(connect(client()).resumed);
  EXPECT_TRUE(connect(client()).resumed);
  // The same keys, but the coordinator trusts another set of client CAs:
  // the session was verified under the old set, so it is not resumed.
  stop();
  start(state.path() / "b.json", pem("client-ca.crt") + pem("other-ca.crt"));
  PeerInfo p = connect(client());
  EXPECT_FALSE(p.resumed);
  EXPECT_TRUE(p.has_client_cert);
}

TEST_F(TlsResumptionTest, ARenewedCertificateStartsANewSession) {
  TempDir state("tickets");
  start(state.path() / "keys.json");
  PeerInfo old_cert = connect(client());
  ASSERT_TRUE(connect(client()).resumed);
  PeerInfo renewed = connect(client(pem("renewed.crt"), pem("renewed.key")));
  EXPECT_FALSE(renewed.resumed);
  EXPECT_NE(renewed.serial_hex, old_cert.serial_hex);
  PeerInfo again = connect(client(pem("renewed.crt"), pem("renewed.key")));
  EXPECT_TRUE(again.resumed);
  EXPECT_EQ(again.serial_hex, renewed.serial_hex);
}

TEST_F(TlsResumptionTest, ASessionWhoseCertificateExpiredSinceIsSeenExpired) {
  TempDir state("tickets");
  auto [cert, key] = short_lived_cert(dir_->path(), "client-ca", 3);
  start(state.path() / "keys.json");
  PeerInfo fresh = connect(client(cert, key));
  ASSERT_TRUE(fresh.has_client_cert);
  ASSERT_FALSE(fresh.client_cert_expired);
  std::this_thread::sleep_for(4s);
  // Resumed, so not verified again: its notAfter is still judged now. The
  // agents endpoint lets it through marked expired (renewal only)...
  PeerInfo expired = connect(client(cert, key));
  EXPECT_TRUE(expired.resumed);
  EXPECT_TRUE(expired.has_client_cert);
  EXPECT_TRUE(expired.client_cert_expired);
  // ...and a server that takes no expired certificate sees none.
  stop();
  start(state.path() / "keys.json", "", /*accept_expired=*/false);
  PeerInfo refused = connect(client(cert, key));
  EXPECT_TRUE(refused.resumed);
  EXPECT_FALSE(refused.has_client_cert);
}

// --- the keys ------------------------------------------------------------------

struct FakeClock {
  SysClock::time_point t = SysClock::time_point(std::chrono::seconds(1'800'000'000));
  TicketKeys::Now fn() {
    return [this] { return t; };
  }
};

TEST(TicketKeys, AKeySealsForItsPeriodThenOnlyOpensThenIsForgotten) {
  TempDir state("tickets");
  FakeClock clock;
  TicketKeyPolicy policy{12h, 12h};
  auto keys = TicketKeys::open(state.path() / "keys.json", policy, clock.fn());
  ASSERT_TRUE(keys.ok()) << keys.error().message;
  auto first = (*keys)->sealing_key();
  ASSERT_TRUE(first);
  EXPECT_FALSE(*(*keys)->rotate_if_due());

  clock.t += 12h;
  ASSERT_TRUE(*(*keys)->rotate_if_due());
  auto second = (*keys)->sealing_key();
  ASSERT_TRUE(second);
  EXPECT_NE(second->name, first->name);
  auto old = (*keys)->opening_key(first->name.data());
  ASSERT_TRUE(old);
  EXPECT_FALSE(old->current);  // opens; the fresh ticket is sealed with the new key
  EXPECT_TRUE((*keys)->opening_key(second->name.data())->current);

  // Reopened from its file (a restart): the same two keys.
  auto reopened = TicketKeys::open(state.path() / "keys.json", policy, clock.fn());
  ASSERT_TRUE(reopened.ok());
  EXPECT_EQ((*reopened)->key_count(), 2u);
  EXPECT_EQ((*reopened)->sealing_key()->name, second->name);

  // Past its sealing period and a ticket's lifetime, the first is forgotten.
  clock.t += 12h;
  EXPECT_FALSE((*keys)->opening_key(first->name.data()));
  ASSERT_TRUE(*(*keys)->rotate_if_due());
  EXPECT_EQ((*keys)->key_count(), 2u);  // the second (opens only) and a third
  EXPECT_FALSE((*keys)->opening_key(first->name.data()));
}

TEST(TicketKeys, AfterALongAbsenceOnlyAFreshKeyIsLeft) {
  TempDir state("tickets");
  FakeClock clock;
  auto keys = TicketKeys::open(state.path() / "keys.json", {}, clock.fn());
  ASSERT_TRUE(keys.ok());
  auto before = (*keys)->sealing_key();
  clock.t += std::chrono::hours(24 * 200);
  EXPECT_FALSE((*keys)->sealing_key());  // nothing sealed under a forgotten key
  auto back = TicketKeys::open(state.path() / "keys.json", {}, clock.fn());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ((*back)->key_count(), 1u);
  EXPECT_NE((*back)->sealing_key()->name, before->name);
  EXPECT_FALSE((*back)->opening_key(before->name.data()));
}

TEST(TicketKeys, AFileThatIsNotAKeyFileIsAnErrorNamingIt) {
  TempDir state("tickets");
  const fs::path p = state.path() / "keys.json";
  for (const std::string& text :
       {std::string("not json"), std::string(R"({"keys":[{"name":"00"}]})"),
        std::string(R"({"version":1})")}) {
    ASSERT_TRUE(write_file_atomic(p, text, 0600).ok());
    auto keys = TicketKeys::open(p);
    ASSERT_FALSE(keys.ok()) << text;
    EXPECT_NE(keys.error().message.find(p.string()), std::string::npos) << keys.error().message;
  }
}

}  // namespace
}  // namespace factory::net
