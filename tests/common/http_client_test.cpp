// HttpClient against a real HTTP/HTTPS server on loopback
// (tests/fakes/http_test_server.py: Python's http.server + ssl, i.e. OpenSSL),
// with a real PKI made by the openssl command (tests/fakes/testpki.py). It
// stands in for the API server, the coordinator and Ollama at the protocol
// level: TLS verification, client certificates, chunked and close-delimited
// bodies, a peer that drops a stream, a slow peer.
#include "common/net/http_client.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/atomic_file.hpp"
#include "tests/support/test_support.hpp"

namespace factory::net {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using factory::testing::Process;
using factory::testing::TempDir;

const std::string kPython = "/usr/bin/python3";

std::string fakes(const std::string& f) {
  return (factory::testing::source_dir() / "tests" / "fakes" / f).string();
}

std::string read(const fs::path& p) {
  return factory::testing::slurp(p);
}

void pki(const std::vector<std::string>& args) {
  std::vector<std::string> argv{kPython, fakes("testpki.py")};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = factory::testing::run(argv);
  ASSERT_TRUE(r.ok()) << r.output;
}

// One PKI for the whole suite: openssl key generation is the slow part.
class HttpClientTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("http-pki");
    std::string d = dir_->path().string();
    pki({"ca", d, "ca"});
    pki({"ca", d, "other-ca"});
    pki({"ca", d, "client-ca"});
    pki({"cert", d, "server", "ca", "factory-test-server", "--san",
         "IP:127.0.0.1,IP:::1,DNS:localhost"});
    // Valid only for a name, not for the address we connect to.
    pki({"cert", d, "named", "ca", "kube.test", "--san", "DNS:kube.test"});
    pki({"cert", d, "client", "client-ca", "factory-test-client", "--client"});
    pki({"cert", d, "stranger", "other-ca", "stranger", "--client"});
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  static std::string pem(const std::string& name) { return read(dir_->path() / name); }

  struct Server {
    Process proc;
    int port = 0;
  };

  // Starts the test server and waits for the port it bound.
  Server start(const std::vector<std::string>& extra, const std::string& bind = "127.0.0.1") {
    static int n = 0;
    fs::path port_file = dir_->path() / ("port-" + std::to_string(++n));
    std::vector<std::string> argv{
        kPython, fakes("http_test_server.py"), "--bind", bind, "--port-file", port_file.string()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    Server s;
    s.proc = Process(argv, dir_->path() / ("server-" + std::to_string(n) + ".log"));
    bool up = factory::testing::eventually(
                  [&] { return fs::exists(port_file) || !s.proc.running(); }, 15s) &&
              fs::exists(port_file);
    if (!up) factory::testing::setup_failed("the test HTTP server did not start:\n" + s.proc.log());
    s.port = std::stoi(read(port_file));
    return s;
  }

  Server start_tls(const std::string& cert = "server", std::vector<std::string> extra = {},
                   const std::string& bind = "127.0.0.1") {
    std::vector<std::string> args{"--cert", (dir_->path() / (cert + ".crt")).string(), "--key",
                                  (dir_->path() / (cert + ".key")).string()};
    args.insert(args.end(), extra.begin(), extra.end());
    return start(args, bind);
  }

  static TempDir* dir_;
};
TempDir* HttpClientTest::dir_ = nullptr;

TEST_F(HttpClientTest, PlainHttpRoundTripSendsMethodHeadersAndBody) {
  auto s = start({});
  HttpClient c;
  HttpRequest req;
  req.method = "PATCH";
  req.url = "http://127.0.0.1:" + std::to_string(s.port) + "/echo?x=1";
  req.headers["Content-Type"] = "application/apply-patch+yaml";
  req.headers["Authorization"] = "Bearer abc";
  req.body = R"({"a":1})";
  auto r = c.request(req);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->headers["content-type"], "application/json");
  auto doc = nlohmann::json::parse(r->body);
  EXPECT_EQ(doc["method"], "PATCH");
  EXPECT_EQ(doc["path"], "/echo?x=1");
  EXPECT_EQ(doc["body"], R"({"a":1})");
  EXPECT_EQ(doc["headers"]["content-type"], "application/apply-patch+yaml");
  EXPECT_EQ(doc["headers"]["authorization"], "Bearer abc");
  EXPECT_EQ(doc["headers"]["content-length"], "7");
  EXPECT_EQ(doc["headers"]["host"], "127.0.0.1:" + std::to_string(s.port));
}

TEST_F(HttpClientTest, HttpErrorStatusIsAResponseNotAnError) {
  auto s = start({});
  HttpClient c;
  auto r = c.request({.url = "http://127.0.0.1:" + std::to_string(s.port) + "/status/410"});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->status, 410);
  EXPECT_EQ(r->body, "status 410");
}

TEST_F(HttpClientTest, RequestDecodesAChunkedBody) {
  auto s = start({});
  HttpClient c;
  auto r = c.request({.url = "http://127.0.0.1:" + std::to_string(s.port) + "/stream?lines=3"});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->body, "{\"n\": 0}\n{\"n\": 1}\n{\"n\": 2}\n");
}

TEST_F(HttpClientTest, StreamDeliversEachChunkWhenItArrives) {
  auto s = start({});
  HttpClient c;
  std::string got;
  std::vector<std::chrono::steady_clock::time_point> seen;
  int head_status = 0;
  auto t0 = std::chrono::steady_clock::now();
  auto r = c.stream(
      {.url = "http://127.0.0.1:" + std::to_string(s.port) + "/stream?lines=3&delay_ms=300"},
      [&](std::string_view chunk) {
        got += chunk;
        seen.push_back(std::chrono::steady_clock::now());
        return true;
      },
      [&](const HttpResponse& head) {
        head_status = head.status;
        return true;
      });
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(*r, 200);
  EXPECT_EQ(head_status, 200);
  EXPECT_EQ(got, "{\"n\": 0}\n{\"n\": 1}\n{\"n\": 2}\n");
  ASSERT_FALSE(seen.empty());
  // The first line is handed over long before the stream ends (~900 ms).
  EXPECT_LT(seen.front() - t0, 500ms);
  EXPECT_GE(seen.size(), 3u);
}

TEST_F(HttpClientTest, StreamStopsWhenTheCallerSaysSo) {
  auto s = start({});
  HttpClient c;
  int chunks = 0;
  auto t0 = std::chrono::steady_clock::now();
  auto r = c.stream(
      {.url = "http://127.0.0.1:" + std::to_string(s.port) + "/stream?lines=100&delay_ms=100"},
      [&](std::string_view) { return ++chunks < 2; });
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(chunks, 2);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
}

TEST_F(HttpClientTest, StreamCutBeforeItsEndIsUnavailable) {
  auto s = start({});
  HttpClient c;
  std::string got;
  auto r = c.stream({.url = "http://127.0.0.1:" + std::to_string(s.port) + "/stream-drop?lines=2"},
                    [&](std::string_view chunk) {
                      got += chunk;
                      return true;
                    });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::unavailable) << r.error().message;
  EXPECT_EQ(got, "{\"n\": 0}\n{\"n\": 1}\n");
}

TEST_F(HttpClientTest, BodiesOver64MiBAreRefused) {
  auto s = start({});
  HttpClient c;
  std::string base = "http://127.0.0.1:" + std::to_string(s.port);
  auto ok = c.request({.url = base + "/big?bytes=" + std::to_string(3 << 20)});
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(ok->body.size(), size_t(3 << 20));

  auto big = c.request({.url = base + "/big?bytes=" + std::to_string((64 << 20) + 1)});
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.error().code, Errc::protocol);
  EXPECT_NE(big.error().message.find("64 MiB"), std::string::npos) << big.error().message;

  auto chunked = c.request({.url = base + "/big-chunked?bytes=" + std::to_string(65 << 20)});
  ASSERT_FALSE(chunked.ok());
  EXPECT_EQ(chunked.error().code, Errc::protocol) << chunked.error().message;
}

TEST_F(HttpClientTest, DeadlineBoundsASlowPeer) {
  auto s = start({});
  HttpClient c;
  auto t0 = std::chrono::steady_clock::now();
  auto r = c.request(
      {.url = "http://127.0.0.1:" + std::to_string(s.port) + "/sleep?ms=3000", .timeout = 300ms});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::timeout) << r.error().message;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
}

// stream(): timeout bounds the wait for the answer's head (its first byte),
// idle_timeout each wait for more of the body: a proxy gives a model server
// a while to begin, then its own pace between tokens.
TEST_F(HttpClientTest, StreamTimeoutBoundsTheHeadAndIdleTimeoutTheBody) {
  auto s = start({});
  std::string base = "http://127.0.0.1:" + std::to_string(s.port);
  int lines = 0;
  auto paced = HttpClient().stream(
      {.url = base + "/stream?lines=3&delay_ms=500", .timeout = 300ms, .idle_timeout = 5s},
      [&](std::string_view chunk) {
        lines += static_cast<int>(std::count(chunk.begin(), chunk.end(), '\n'));
        return true;
      });
  ASSERT_TRUE(paced.ok()) << paced.error().message;
  EXPECT_EQ(lines, 3);

  auto t0 = std::chrono::steady_clock::now();
  auto silent =
      HttpClient().stream({.url = base + "/sleep?ms=3000", .timeout = 300ms, .idle_timeout = 10s},
                          [](std::string_view) { return true; });
  ASSERT_FALSE(silent.ok());
  EXPECT_EQ(silent.error().code, Errc::timeout) << silent.error().message;
  EXPECT_NE(silent.error().message.find("300ms"), std::string::npos) << silent.error().message;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
}

// A request cancelled from another thread (a proxy whose own client hung
// up) ends at once, whatever it waits for; one cancelled before it starts
// never connects.
TEST_F(HttpClientTest, CancelEndsTheWaitAtOnce) {
  auto s = start({});
  std::string url = "http://127.0.0.1:" + std::to_string(s.port) + "/sleep?ms=5000";
  auto cancel = std::make_shared<HttpCancel>();
  std::thread canceller([cancel] {
    // The cancel comes while the answer is awaited: that is the case.
    std::this_thread::sleep_for(300ms);
    cancel->cancel();
  });
  auto t0 = std::chrono::steady_clock::now();
  auto r = HttpClient().request({.url = url, .timeout = 10s, .cancel = cancel});
  canceller.join();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::unavailable);
  EXPECT_EQ(r.error().message, "http://127.0.0.1:" + std::to_string(s.port) + ": cancelled");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);

  auto again = HttpClient().stream({.url = url, .timeout = 10s, .cancel = cancel},
                                   [](std::string_view) { return true; });
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.error().message.find("cancelled"), std::string::npos);
}

// Issue 23: Asio throws when it cannot make its reactor's descriptors; on a
// worker thread that aborted the agent. Out of descriptors, a request is an
// error like any other.
TEST_F(HttpClientTest, OutOfDescriptorsIsAnErrorNotAThrow) {
  auto s = start({});
  std::string url = "http://127.0.0.1:" + std::to_string(s.port) + "/echo";
  Result<HttpResponse> r = Error(Errc::internal, "not asked");
  Result<int> streamed = Error(Errc::internal, "not asked");
  {
    factory::testing::OutOfDescriptors full;
    r = HttpClient().request({.url = url});
    streamed = HttpClient().stream({.url = url}, [](std::string_view) { return true; });
  }
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::unavailable);
  EXPECT_NE(r.error().message.find("Too many open files"), std::string::npos) << r.error().message;
  ASSERT_FALSE(streamed.ok());
  EXPECT_NE(streamed.error().message.find("Too many open files"), std::string::npos)
      << streamed.error().message;
  // With descriptors back, the same request works.
  EXPECT_TRUE(HttpClient().request({.url = url}).ok());
}

TEST_F(HttpClientTest, ConnectionRefusedNamesTheServer) {
  int port = factory::testing::free_loopback_port();
  HttpClient c;
  auto r = c.request({.url = "https://127.0.0.1:" + std::to_string(port) + "/"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::unavailable);
  EXPECT_EQ(r.error().message,
            "https://127.0.0.1:" + std::to_string(port) + ": connection refused");
}

TEST_F(HttpClientTest, BadUrlsAreInvalidArguments) {
  HttpClient c;
  for (std::string u :
       {"ftp://x/", "127.0.0.1:80/", "http://[::1/", "http://host:99999/", "http:///path"}) {
    auto r = c.request({.url = u});
    ASSERT_FALSE(r.ok()) << u;
    EXPECT_EQ(r.error().code, Errc::invalid_argument) << u << ": " << r.error().message;
  }
}

TEST_F(HttpClientTest, HttpsVerifiesThePeerAgainstTheGivenCa) {
  auto s = start_tls();
  HttpClient c({.ca_pem = pem("ca.crt")});
  auto r = c.request({.url = "https://127.0.0.1:" + std::to_string(s.port) + "/echo"});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->status, 200);
  // localhost resolves and is in the certificate's DNS SANs too.
  auto byname = c.request({.url = "https://localhost:" + std::to_string(s.port) + "/echo"});
  ASSERT_TRUE(byname.ok()) << byname.error().message;
}

TEST_F(HttpClientTest, HttpsOverIpv6Literal) {
  auto s = start_tls("server", {}, "::1");
  HttpClient c({.ca_pem = pem("ca.crt")});
  auto r = c.request({.url = "https://[::1]:" + std::to_string(s.port) + "/echo"});
  ASSERT_TRUE(r.ok()) << r.error().message;
  auto doc = nlohmann::json::parse(r->body);
  EXPECT_EQ(doc["headers"]["host"], "[::1]:" + std::to_string(s.port));
}

TEST_F(HttpClientTest, WrongCaIsRefusedAsUnauthenticated) {
  auto s = start_tls();
  HttpClient c({.ca_pem = pem("other-ca.crt")});
  auto r = c.request({.url = "https://127.0.0.1:" + std::to_string(s.port) + "/echo"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::unauthenticated);
  EXPECT_NE(r.error().message.find("certificate verification failed"), std::string::npos)
      << r.error().message;
}

TEST_F(HttpClientTest, SystemStoreDoesNotTrustATestCa) {
  auto s = start_tls();
  HttpClient c;  // no CA given: the system store, which has never heard of ours
  auto r = c.request({.url = "https://127.0.0.1:" + std::to_string(s.port) + "/echo"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::unauthenticated) << r.error().message;
}

TEST_F(HttpClientTest, HostNameIsVerifiedAndServerNameOverridesIt) {
  auto s = start_tls("named");  // certificate for DNS:kube.test only
  std::string url = "https://127.0.0.1:" + std::to_string(s.port) + "/echo";
  auto wrong = HttpClient({.ca_pem = pem("ca.crt")}).request({.url = url});
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.error().code, Errc::unauthenticated);
  EXPECT_NE(wrong.error().message.find("not valid for '127.0.0.1'"), std::string::npos)
      << wrong.error().message;

  auto named =
      HttpClient({.ca_pem = pem("ca.crt"), .server_name = "kube.test"}).request({.url = url});
  ASSERT_TRUE(named.ok()) << named.error().message;

  auto other =
      HttpClient({.ca_pem = pem("ca.crt"), .server_name = "other.test"}).request({.url = url});
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.error().code, Errc::unauthenticated);
}

TEST_F(HttpClientTest, InsecureSkipVerifyAcceptsAnyCertificate) {
  auto s = start_tls("named");
  HttpClient c({.ca_pem = pem("other-ca.crt"), .insecure_skip_verify = true});
  auto r = c.request({.url = "https://127.0.0.1:" + std::to_string(s.port) + "/echo"});
  ASSERT_TRUE(r.ok()) << r.error().message;
}

TEST_F(HttpClientTest, ClientCertificateAuthenticates) {
  auto s = start_tls("server", {"--client-ca", (dir_->path() / "client-ca.crt").string(),
                                "--client-auth", "required"});
  std::string url = "https://127.0.0.1:" + std::to_string(s.port) + "/whoami";

  HttpClient with({.ca_pem = pem("ca.crt"),
                   .client_cert_pem = pem("client.crt"),
                   .client_key_pem = pem("client.key")});
  auto r = with.request({.url = url});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->body, "factory-test-client");

  // TLS 1.3 lets the server reject the certificate after the client's
  // handshake has finished, so the refusal can surface on the first read.
  auto none = HttpClient({.ca_pem = pem("ca.crt")}).request({.url = url});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code, Errc::unauthenticated) << none.error().message;
  EXPECT_NE(none.error().message.find("refused our client certificate"), std::string::npos);
  auto stranger = HttpClient({.ca_pem = pem("ca.crt"),
                              .client_cert_pem = pem("stranger.crt"),
                              .client_key_pem = pem("stranger.key")})
                      .request({.url = url});
  ASSERT_FALSE(stranger.ok());
  EXPECT_EQ(stranger.error().code, Errc::unauthenticated) << stranger.error().message;
}

TEST_F(HttpClientTest, MismatchedOrBrokenClientKeyIsInvalidArgument) {
  auto s = start_tls();
  std::string url = "https://127.0.0.1:" + std::to_string(s.port) + "/echo";
  auto mismatch = HttpClient({.ca_pem = pem("ca.crt"),
                              .client_cert_pem = pem("client.crt"),
                              .client_key_pem = pem("stranger.key")})
                      .request({.url = url});
  ASSERT_FALSE(mismatch.ok());
  EXPECT_EQ(mismatch.error().code, Errc::invalid_argument) << mismatch.error().message;

  auto badca = HttpClient({.ca_pem = "not a pem"}).request({.url = url});
  ASSERT_FALSE(badca.ok());
  EXPECT_EQ(badca.error().code, Errc::invalid_argument) << badca.error().message;
}

TEST_F(HttpClientTest, TlsCloseWithoutCloseNotifyEndsACloseDelimitedBody) {
  auto s = start_tls();
  HttpClient c({.ca_pem = pem("ca.crt")});
  auto r = c.request({.url = "https://127.0.0.1:" + std::to_string(s.port) + "/close-delimited"});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "body until close");
}

TEST_F(HttpClientTest, HttpsStreamAndChunkedBody) {
  auto s = start_tls();
  HttpClient c({.ca_pem = pem("ca.crt")});
  std::string got;
  auto r = c.stream({.url = "https://127.0.0.1:" + std::to_string(s.port) + "/stream?lines=4"},
                    [&](std::string_view chunk) {
                      got += chunk;
                      return true;
                    });
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(got, "{\"n\": 0}\n{\"n\": 1}\n{\"n\": 2}\n{\"n\": 3}\n");
}

}  // namespace
}  // namespace factory::net
