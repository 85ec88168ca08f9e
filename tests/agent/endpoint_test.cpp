// The model endpoint's authenticating proxy (agent/endpoint/proxy.hpp) on
// loopback, in front of the stand-in Ollama (tests/fakes/ollama_server.py:
// it stands in for `ollama serve` on the guest, with Ollama's own response
// shapes for the native and OpenAI-compatible paths, and logs every
// request it gets, so a test can show that one never reached it), or of a
// silent one (SilentOllama below: an Ollama busy with a non-streamed
// generation, which says nothing until the answer is whole). The
// proxy's certificate is signed by a CA made here with the openssl command
// (tests/fakes/testpki.py), standing in for the coordinator's endpoint CA;
// its key and CSR are the ones make_key_and_csr makes in the guest.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "agent/endpoint/key_limits.hpp"
#include "agent/endpoint/named_keys.hpp"
#include "agent/endpoint/proxy.hpp"
#include "agent/endpoint/routes.hpp"
#include "agent/endpoint/usage.hpp"
#include "common/net/http_client.hpp"
#include "common/net/server.hpp"
#include "common/pki.hpp"
#include "tests/support/raw_tls_client.hpp"
#include "tests/support/test_support.hpp"

namespace factory::agent::endpoint {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using factory::testing::eventually;
using factory::testing::Process;
using factory::testing::RawTlsClient;
using factory::testing::RawTlsOptions;
using factory::testing::slurp;
using factory::testing::TempDir;
using Json = nlohmann::json;

constexpr const char* kModel = "llama3.2:1b";
const std::string kKey = "fk-endpoint-test-key-one";
const std::string kOtherKey = "fk-endpoint-test-key-two";

void run_ok(const std::vector<std::string>& argv) {
  auto r = factory::testing::run(argv);
  if (!r.ok()) factory::testing::setup_failed(argv.front() + ": " + r.describe() + ": " + r.output);
}

// The coordinator's endpoint CA, as far as the guest can tell: a CA that
// signs the guest's CSR with the address the customer calls.
class TestCa {
 public:
  TestCa() {
    run_ok({"/usr/bin/python3",
            (factory::testing::source_dir() / "tests/fakes/testpki.py").string(), "ca",
            dir_.path().string(), "ca"});
  }
  std::string ca_pem() const { return slurp(dir_ / "ca.crt"); }

  // Credentials for key (a new one when empty), signed by this CA.
  Credentials sign(const std::string& api_key, std::string key_pem = "", int days = 1) {
    if (key_pem.empty()) {
      auto kc = make_key_and_csr("t5");
      if (!kc) factory::testing::setup_failed(kc.error().message);
      key_pem = kc->private_key_pem;
    }
    auto csr = pki::make_csr(key_pem, "t5");
    if (!csr) factory::testing::setup_failed(csr.error().message);
    std::string n = std::to_string(serial_++);
    std::ofstream(dir_ / ("leaf" + n + ".csr")) << *csr;
    std::ofstream(dir_ / "ext.cnf") << "basicConstraints=critical,CA:FALSE\n"
                                       "extendedKeyUsage=serverAuth\n"
                                       "subjectAltName=IP:127.0.0.1,DNS:localhost\n";
    run_ok({"/usr/bin/openssl", "x509", "-req", "-in", (dir_ / ("leaf" + n + ".csr")).string(),
            "-CA", (dir_ / "ca.crt").string(), "-CAkey", (dir_ / "ca.key").string(),
            "-CAcreateserial", "-days", std::to_string(days), "-extfile",
            (dir_ / "ext.cnf").string(), "-out", (dir_ / ("leaf" + n + ".crt")).string()});
    Credentials c;
    c.certificate_pem = slurp(dir_ / ("leaf" + n + ".crt")) + ca_pem();
    c.private_key_pem = key_pem;
    c.key_sha256 = pki::sha256_hex(api_key);
    return c;
  }

 private:
  TempDir dir_{"endpoint-ca"};
  int serial_ = 1;
};

// Stands in for an Ollama busy with a non-streamed generation: it accepts
// connections and reads what comes, but answers nothing, except GET
// /api/version, which it answers at once (as Ollama does meanwhile). It
// counts the connections it holds, so a test sees the proxy hang up.
class SilentOllama {
 public:
  SilentOllama() {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    socklen_t len = sizeof a;
    if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), len) != 0 ||
        ::listen(listen_fd_, 64) != 0 ||
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      factory::testing::setup_failed("silent Ollama: " + std::string(std::strerror(errno)));
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~SilentOllama() {
    stop_ = true;
    thread_.join();
    ::close(listen_fd_);
  }
  SilentOllama(const SilentOllama&) = delete;
  SilentOllama& operator=(const SilentOllama&) = delete;

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int held() const { return held_; }  // connections open now

 private:
  void serve() {
    std::map<int, std::string> conns;  // fd -> what it sent
    while (!stop_) {
      std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}};
      for (const auto& [fd, got] : conns) fds.push_back({fd, POLLIN, 0});
      // A short timeout only so that stop_ is seen.
      if (::poll(fds.data(), fds.size(), 50) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd >= 0) conns[fd];
      }
      for (std::size_t i = 1; i < fds.size(); ++i) {
        if (!fds[i].revents) continue;
        const int fd = fds[i].fd;
        char buf[4096];
        ssize_t n = ::read(fd, buf, sizeof buf);
        std::string& got = conns[fd];
        if (n > 0) got.append(buf, static_cast<std::size_t>(n));
        const bool version =
            got.rfind("GET /api/version ", 0) == 0 && got.find("\r\n\r\n") != std::string::npos;
        if (version) {
          const std::string answer =
              "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 19\r\n"
              "Connection: close\r\n\r\n{\"version\":\"0.5.7\"}";
          (void)!::write(fd, answer.data(), answer.size());
        }
        if (n <= 0 || version) {
          ::close(fd);
          conns.erase(fd);
        }
      }
      held_ = static_cast<int>(conns.size());
    }
    for (const auto& [fd, got] : conns) ::close(fd);
  }

  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> held_{0};
  std::thread thread_;
};

class EndpointTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { ca_ = new TestCa(); }
  static void TearDownTestSuite() {
    delete ca_;
    ca_ = nullptr;
  }

  void SetUp() override {
    auto state = dir_ / "ollama-root/.guestsim/state/ollama";
    fs::create_directories(state);
    fs::create_directories(dir_ / "ollama-root/.guestsim/knobs");
    // What a finished model step leaves: the model pulled.
    std::ofstream(state / "models.json")
        << Json{{kModel, {{"modified_at", "2026-12-01T10:00:00+00:00"}}}}.dump();
    ollama_port_ = factory::testing::free_loopback_port();
    ollama_ =
        Process({"/usr/bin/python3",
                 (factory::testing::source_dir() / "tests/fakes/ollama_server.py").string(),
                 "--root", (dir_ / "ollama-root").string(), "--port", std::to_string(ollama_port_)},
                dir_ / "ollama.log");
    bool up = eventually([&] {
      net::HttpRequest r;
      r.url = ollama_url() + "/api/version";
      r.timeout = 1s;
      auto resp = net::HttpClient().request(r);
      return resp.ok() && resp->status == 200;
    });
    if (!up) factory::testing::setup_failed("the stand-in Ollama did not start: " + ollama_.log());
  }

  void TearDown() override {
    proxy_.reset();
    ollama_.stop();
  }

  std::string ollama_url() const { return "http://127.0.0.1:" + std::to_string(ollama_port_); }

  ProxyOptions options() {
    ProxyOptions o;
    o.listen = "127.0.0.1:0";
    o.upstream = ollama_url();
    o.state_dir = dir_ / "state";
    o.upstream_idle_timeout = 10s;
    return o;
  }

  Proxy& start(ProxyOptions o, const std::string& key = kKey) {
    proxy_ = std::make_unique<Proxy>(std::move(o));
    auto st = proxy_->apply(ca_->sign(key));
    if (!st) factory::testing::setup_failed("apply: " + st.error().message);
    return *proxy_;
  }
  Proxy& start() { return start(options()); }

  void knob(const std::string& name, const std::string& value) {
    std::ofstream(dir_ / "ollama-root/.guestsim/knobs" / name) << value;
  }
  // Requests the stand-in got, from its log (one line per request answered).
  long ollama_requests() {
    std::string log = ollama_.log();
    long n = 0;
    for (std::size_t at = 0; (at = log.find("ollama_server: \"", at)) != std::string::npos; at++)
      n++;
    return n;
  }
  long counter(const std::string& name) {
    std::ifstream f(dir_ / "ollama-root/.guestsim/state/counters" / name);
    long n = 0;
    return f >> n ? n : 0;
  }

  net::HttpRequest request(const std::string& method, const std::string& path,
                           const std::string& key, const std::string& body = "") {
    net::HttpRequest r;
    r.method = method;
    r.url = "https://127.0.0.1:" + std::to_string(proxy_->port()) + path;
    if (!key.empty()) r.headers["Authorization"] = "Bearer " + key;
    if (!body.empty()) r.headers["Content-Type"] = "application/json";
    r.body = body;
    r.timeout = 10s;
    return r;
  }
  net::HttpClient client() {
    net::TlsClientOptions t;
    t.ca_pem = ca_->ca_pem();
    return net::HttpClient(t);
  }
  net::HttpResponse call(const std::string& method, const std::string& path,
                         const std::string& key = kKey, const std::string& body = "") {
    auto r = client().request(request(method, path, key, body));
    EXPECT_TRUE(r.ok()) << (r ? "" : r.error().message);
    return r ? *r : net::HttpResponse{};
  }
  // A raw TLS connection to the proxy: for requests no client library
  // would send (a head without its body) and clients that hang up.
  std::unique_ptr<RawTlsClient> raw() {
    RawTlsOptions o;
    o.port = proxy_->port();
    o.ca_pem = ca_->ca_pem();
    auto c = RawTlsClient::connect(o);
    if (!c) factory::testing::setup_failed("connect to the proxy: " + c.error().message);
    return std::move(*c);
  }
  static std::string head(const std::string& method, const std::string& path,
                          const std::string& key, std::size_t content_length) {
    std::string h = method + " " + path + " HTTP/1.1\r\nHost: endpoint\r\n";
    if (!key.empty()) h += "Authorization: Bearer " + key + "\r\n";
    return h +
           "Content-Type: application/json\r\nContent-Length: " + std::to_string(content_length) +
           "\r\n\r\n";
  }
  static std::string chat_body(bool stream, const std::string& prompt = "tell me about GPUs") {
    return Json{{"model", kModel},
                {"stream", stream},
                {"messages", {{{"role", "user"}, {"content", prompt}}}}}
        .dump();
  }

  static TestCa* ca_;
  TempDir dir_{"endpoint"};
  int ollama_port_ = 0;
  Process ollama_;
  std::unique_ptr<Proxy> proxy_;
};

TestCa* EndpointTest::ca_ = nullptr;

// The stand-in answers as Ollama's /v1/chat/completions does without
// "stream": one chat.completion object.
TEST_F(EndpointTest, RightKeyGetsAChatCompletion) {
  start();
  auto r = call("POST", "/v1/chat/completions", kKey, chat_body(false));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.headers["content-type"].find("application/json"), std::string::npos);
  auto j = Json::parse(r.body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["model"], kModel);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_NE(j["choices"][0]["message"]["content"].get<std::string>().find("tell me about GPUs"),
            std::string::npos);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_GT(j["usage"]["completion_tokens"].get<int>(), 0);
  EXPECT_EQ(counter("ollama.answers"), 1);
  // The customer's key stays at the proxy.
  EXPECT_EQ(counter("ollama.authorization_seen"), 0);
  // The proxy counts a request done once its session has finished writing,
  // which the client may see a moment before: a 2-core machine under
  // `ctest -j2` once read in_flight 1 here.
  EXPECT_TRUE(eventually([&] { return proxy_->stats().in_flight == 0; }, 2s))
      << "in flight " << proxy_->stats().in_flight;
  auto s = proxy_->stats();
  EXPECT_EQ(s.requests, 1u);
  EXPECT_EQ(s.served, 1u);
}

// The stand-in streams its SSE chunks one token at a time, ollama_token_delay
// apart, as Ollama does while the model generates: the client must see them
// as they come, not all at the end.
TEST_F(EndpointTest, StreamingChatArrivesChunkByChunk) {
  knob("ollama_token_delay", "0.04");
  start();
  std::vector<std::chrono::steady_clock::time_point> arrivals;
  std::string body, content_type;
  int status = 0;
  auto r = client().stream(
      request("POST", "/v1/chat/completions", kKey, chat_body(true)),
      [&](std::string_view chunk) {
        arrivals.push_back(std::chrono::steady_clock::now());
        body.append(chunk);
        return true;
      },
      [&](const net::HttpResponse& head) {
        status = head.status;
        content_type = head.headers.count("content-type") ? head.headers.at("content-type") : "";
        return true;
      });
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(status, 200) << body;
  EXPECT_NE(content_type.find("text/event-stream"), std::string::npos) << content_type;

  std::vector<std::string> events;
  for (std::size_t at = 0; (at = body.find("data: ", at)) != std::string::npos;) {
    auto end = body.find("\n\n", at);
    ASSERT_NE(end, std::string::npos) << body;
    events.push_back(body.substr(at + 6, end - at - 6));
    at = end + 2;
  }
  ASSERT_GE(events.size(), 5u) << body;
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  for (std::size_t i = 0; i + 2 < events.size(); i++) {
    auto c = Json::parse(events[i]);
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    EXPECT_TRUE(c["choices"][0]["finish_reason"].is_null());
    EXPECT_EQ(c["choices"][0]["delta"]["role"], "assistant");
    text += c["choices"][0]["delta"]["content"].get<std::string>();
  }
  auto last = Json::parse(events[events.size() - 2]);
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  EXPECT_NE(text.find("tell me about GPUs"), std::string::npos) << text;
  // Chunk by chunk: many reads, spread over the time the tokens took.
  ASSERT_GE(arrivals.size(), 5u);
  auto spread = arrivals.back() - arrivals.front();
  EXPECT_GE(spread, 40ms * (events.size() - 3) / 2)
      << "the stream came in " << arrivals.size() << " reads within "
      << std::chrono::duration_cast<std::chrono::milliseconds>(spread).count() << " ms";
}

// The stand-in's /v1/models is Ollama's list of pulled models in OpenAI's shape.
TEST_F(EndpointTest, ModelsListAndOneModel) {
  start();
  auto r = call("GET", "/v1/models");
  ASSERT_EQ(r.status, 200) << r.body;
  auto j = Json::parse(r.body);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], kModel);
  EXPECT_EQ(j["data"][0]["object"], "model");
  EXPECT_EQ(j["data"][0]["owned_by"], "library");

  auto one = call("GET", "/v1/models/llama3.2:1b");
  ASSERT_EQ(one.status, 200) << one.body;
  EXPECT_EQ(Json::parse(one.body)["id"], kModel);
  // Unknown to Ollama: its 404, passed through.
  auto unknown = call("GET", "/v1/models/nope");
  EXPECT_EQ(unknown.status, 404);
  EXPECT_EQ(Json::parse(unknown.body)["error"]["type"], "not_found_error") << unknown.body;
  // Two segments is no model path at all: the proxy's 404, Ollama never asked.
  long before = ollama_requests();
  auto deep = call("GET", "/v1/models/library/llama3.2");
  EXPECT_EQ(deep.status, 404);
  EXPECT_EQ(Json::parse(deep.body)["error"]["code"], "unknown_url") << deep.body;
  EXPECT_EQ(ollama_requests(), before);
}

// The stand-in's native /api/generate streams NDJSON lines, then a done line.
TEST_F(EndpointTest, ApiGenerateStreams) {
  start();
  std::string body, content_type;
  int reads = 0;
  auto r = client().stream(
      request("POST", "/api/generate", kKey,
              Json{{"model", kModel}, {"prompt", "why is the sky blue"}}.dump()),
      [&](std::string_view c) {
        reads++;
        body.append(c);
        return true;
      },
      [&](const net::HttpResponse& h) {
        EXPECT_EQ(h.status, 200);
        content_type = h.headers.count("content-type") ? h.headers.at("content-type") : "";
        return true;
      });
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(content_type, "application/x-ndjson");
  std::vector<Json> lines;
  std::size_t at = 0, nl;
  while ((nl = body.find('\n', at)) != std::string::npos) {
    lines.push_back(Json::parse(body.substr(at, nl - at)));
    at = nl + 1;
  }
  ASSERT_GE(lines.size(), 3u) << body;
  std::string text;
  for (std::size_t i = 0; i + 1 < lines.size(); i++) {
    EXPECT_FALSE(lines[i]["done"].get<bool>());
    text += lines[i]["response"].get<std::string>();
  }
  EXPECT_TRUE(lines.back()["done"].get<bool>());
  EXPECT_EQ(lines.back()["done_reason"], "stop");
  EXPECT_GT(lines.back()["eval_count"].get<int>(), 0);
  EXPECT_NE(text.find("why is the sky blue"), std::string::npos);
  EXPECT_GT(reads, 1);
}

// No key, a wrong key, another scheme: 401 before Ollama is asked, and
// before the path is looked at (a path outside the allowlist is 401 too).
TEST_F(EndpointTest, NoKeyOrWrongKeyIs401) {
  start();
  long before = ollama_requests();
  for (const std::string& key : {std::string(), kOtherKey}) {
    auto r = call("POST", "/v1/chat/completions", key, chat_body(false));
    EXPECT_EQ(r.status, 401) << key;
    EXPECT_EQ(r.headers["www-authenticate"], "Bearer");
    auto j = Json::parse(r.body);
    EXPECT_EQ(j["error"]["code"], "invalid_api_key");
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  }
  auto basic = request("GET", "/v1/models", "");
  basic.headers["Authorization"] = "Basic " + kKey;
  auto b = client().request(basic);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->status, 401);
  auto pull = call("POST", "/api/pull", "", Json{{"model", kModel}}.dump());
  EXPECT_EQ(pull.status, 401);
  EXPECT_EQ(ollama_requests(), before);
  EXPECT_EQ(proxy_->stats().unauthorized, 4u);
  EXPECT_EQ(proxy_->stats().served, 0u);
}

// A rotated key (the coordinator's `credentials --rotate` sends a new hash):
// the old key is refused from the next request on.
TEST_F(EndpointTest, RotatedKeyReplacesTheOldOneAtOnce) {
  auto& p = start();
  EXPECT_EQ(call("GET", "/v1/models", kKey).status, 200);
  int port = p.port();
  auto st = p.apply(ca_->sign(kOtherKey));
  ASSERT_TRUE(st.ok()) << st.error().message;
  EXPECT_EQ(p.port(), port);  // the same listener, not a restart
  EXPECT_EQ(call("GET", "/v1/models", kKey).status, 401);
  EXPECT_EQ(call("GET", "/v1/models", kOtherKey).status, 200);
  EXPECT_EQ(slurp(dir_ / "state/api-key.sha256"), pki::sha256_hex(kOtherKey) + "\n");
}

// Model management and everything else Ollama serves never reach it.
TEST_F(EndpointTest, PathsOutsideTheAllowlistAre404AndNeverReachOllama) {
  start();
  long before = ollama_requests();
  struct Case {
    std::string method, path, body;
  };
  for (const auto& c : std::vector<Case>{{"POST", "/api/pull", Json{{"model", kModel}}.dump()},
                                         {"DELETE", "/api/delete", Json{{"model", kModel}}.dump()},
                                         {"POST", "/api/create", "{}"},
                                         {"POST", "/api/copy", "{}"},
                                         {"POST", "/api/push", "{}"},
                                         {"GET", "/", ""},
                                         {"GET", "/api/generate/../pull", ""},
                                         {"GET", "/v1/models?x=1/../../api/pull", ""}}) {
    auto r = call(c.method, c.path, kKey, c.body);
    if (c.path.find('?') != std::string::npos) {
      // The query is not part of the path: this is GET /v1/models, passed (without its query).
      EXPECT_EQ(r.status, 200) << c.path;
      continue;
    }
    EXPECT_EQ(r.status, 404) << c.method << " " << c.path << ": " << r.body;
    EXPECT_EQ(Json::parse(r.body)["error"]["code"], "unknown_url");
  }
  // Only the one with a query got there.
  EXPECT_EQ(ollama_requests(), before + 1);
  EXPECT_EQ(counter("ollama.pull_request.llama3.2:1b"), 0);
  auto log = ollama_.log();
  EXPECT_EQ(log.find("/api/pull"), std::string::npos) << log;
  EXPECT_EQ(log.find("/api/delete"), std::string::npos) << log;
  EXPECT_EQ(proxy_->stats().refused_paths, 7u);

  // An allowed path with the wrong method.
  auto wrong = call("GET", "/api/chat");
  EXPECT_EQ(wrong.status, 405);
  EXPECT_EQ(wrong.headers["allow"], "POST");
}

// A body over max_request_body is refused by the server before anyone reads it.
TEST_F(EndpointTest, BodyOverTheLimitIsRefused) {
  auto o = options();
  o.max_request_body = 4096;
  start(o);
  std::string big = chat_body(false, std::string(8000, 'x'));
  auto r = client().request(request("POST", "/v1/chat/completions", kKey, big));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->status, 413);
  EXPECT_EQ(counter("ollama.answers"), 0);
  // Within the limit it passes.
  EXPECT_EQ(call("POST", "/v1/chat/completions", kKey, chat_body(false)).status, 200);
}

// The stand-in streams slowly (ollama_token_delay), as a busy GPU does: with
// max_concurrent requests in flight, one more is 503 at once.
TEST_F(EndpointTest, MoreThanMaxConcurrentIs503) {
  knob("ollama_token_delay", "0.12");
  auto o = options();
  o.max_concurrent = 2;
  start(o);
  std::atomic<int> ok{0};
  std::vector<std::thread> streams;
  for (int i = 0; i < 2; i++) {
    streams.emplace_back([&] {
      auto r = client().stream(
          request("POST", "/v1/chat/completions", kKey, chat_body(true)),
          [](std::string_view) { return true; },
          [&](const net::HttpResponse& h) {
            if (h.status == 200) ok++;
            return true;
          });
      EXPECT_TRUE(r.ok());
    });
  }
  ASSERT_TRUE(eventually([&] { return proxy_->stats().in_flight == 2; }, 10s));
  auto r = call("POST", "/v1/chat/completions", kKey, chat_body(false));
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_EQ(Json::parse(r.body)["error"]["code"], "busy");
  EXPECT_EQ(proxy_->stats().busy, 1u);
  for (auto& t : streams) t.join();
  EXPECT_EQ(ok, 2);
  EXPECT_EQ(proxy_->stats().in_flight, 0u);
  EXPECT_EQ(call("POST", "/v1/chat/completions", kKey, chat_body(false)).status, 200);
}

// A customer who hangs up mid-answer: the proxy stops reading Ollama (the
// stand-in counts the stream whose reader went away) instead of letting the
// model generate the rest for nobody.
TEST_F(EndpointTest, ClientGoneStopsReadingOllama) {
  knob("ollama_token_delay", "0.2");  // about 20 tokens: 4 s
  start();
  auto started = std::chrono::steady_clock::now();
  auto r = client().stream(request("POST", "/api/generate", kKey,
                                   Json{{"model", kModel}, {"prompt", "a long story"}}.dump()),
                           [](std::string_view) { return false; });  // hangs up at once
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_TRUE(eventually([&] { return counter("ollama.stream_abandoned") == 1; }, 5s))
      << ollama_.log();
  EXPECT_LT(std::chrono::steady_clock::now() - started, 3s);
  EXPECT_TRUE(eventually([&] { return proxy_->stats().in_flight == 0; }, 2s));
}

// The stand-in cuts its answer after three tokens (ollama_answer_cut), as
// when Ollama's runner dies mid-generation: the client gets what came, then
// an error in the stream's own format, never a [DONE] or done line.
TEST_F(EndpointTest, AnswerCutMidStreamEndsWithAnError) {
  knob("ollama_answer_cut", "3");
  start();
  auto read_all = [&](const std::string& path, const std::string& body) {
    std::string got;
    auto r = client().stream(request("POST", path, kKey, body), [&](std::string_view c) {
      got.append(c);
      return true;
    });
    EXPECT_TRUE(r.ok()) << (r ? "" : r.error().message);
    return got;
  };
  auto sse = read_all("/v1/chat/completions", chat_body(true));
  EXPECT_EQ(sse.find("[DONE]"), std::string::npos) << sse;
  auto last = sse.rfind("data: ");
  ASSERT_NE(last, std::string::npos) << sse;
  auto err = Json::parse(sse.substr(last + 6));
  EXPECT_EQ(err["error"]["code"], "upstream_cut") << sse;
  EXPECT_NE(sse.find("\"content\":\"The\""), std::string::npos) << sse;

  auto nd = read_all("/api/generate", Json{{"model", kModel}, {"prompt", "hi"}}.dump());
  ASSERT_FALSE(nd.empty());
  nd.pop_back();  // the last newline
  auto tail = Json::parse(nd.substr(nd.rfind('\n') + 1));
  EXPECT_TRUE(tail.contains("error")) << nd;
  EXPECT_EQ(nd.find("\"done\":true"), std::string::npos) << nd;
  EXPECT_EQ(proxy_->stats().upstream_errors, 2u);
}

// Ollama down (the stand-in stopped): 502, counted.
TEST_F(EndpointTest, OllamaDownIs502) {
  start();
  ollama_.stop();
  auto r = call("POST", "/v1/chat/completions", kKey, chat_body(false));
  EXPECT_EQ(r.status, 502) << r.body;
  EXPECT_EQ(Json::parse(r.body)["error"]["code"], "upstream_unavailable");
  EXPECT_EQ(proxy_->stats().upstream_errors, 1u);
}

// Issue 23: the proxy read a whole body before it looked at the key. The key
// (and then the path) is judged on the head: a request without it is
// answered 401 before a byte of its announced megabyte is sent, and its
// connection closed, so nothing of it is ever buffered.
TEST_F(EndpointTest, ARequestWithoutTheKeyIsRefusedOnItsHeadBeforeItsBody) {
  start();
  long before = ollama_requests();
  auto c = raw();
  ASSERT_TRUE(c->write(head("POST", "/v1/chat/completions", "", 1 << 20)).ok());
  auto r = c->read_until("}}", 5s);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->rfind("HTTP/1.1 401", 0), 0u) << *r;
  EXPECT_NE(r->find("WWW-Authenticate: Bearer"), std::string::npos) << *r;
  EXPECT_NE(r->find("\"code\":\"invalid_api_key\""), std::string::npos) << *r;
  EXPECT_TRUE(c->wait_closed(5s));

  // With the key, a path outside the allowlist: 404, on its head as well.
  auto k = raw();
  ASSERT_TRUE(k->write(head("POST", "/api/pull", kKey, 1 << 20)).ok());
  auto p = k->read_until("}}", 5s);
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_EQ(p->rfind("HTTP/1.1 404", 0), 0u) << *p;
  EXPECT_TRUE(k->wait_closed(5s));
  EXPECT_EQ(ollama_requests(), before);
  auto s = proxy_->stats();
  EXPECT_EQ(s.requests, 2u);
  EXPECT_EQ(s.unauthorized, 1u);
  EXPECT_EQ(s.refused_paths, 1u);
}

// Issue 23: 16 requests to an Ollama that said nothing, their clients then
// gone, left every request 503 for 5 minutes: the proxy noticed a departed
// client only at Ollama's next chunk. The server watches the connection
// while the answer is prepared, and a client's departure ends the wait on
// Ollama at once: the place is free, and Ollama's connection closed.
TEST_F(EndpointTest, ClientsThatLeaveFreeTheirPlacesAtOnceWhileOllamaIsSilent) {
  SilentOllama silent;
  auto o = options();
  o.upstream = silent.url();
  o.upstream_first_byte_timeout = 60s;  // far beyond this test
  start(o);
  const std::string body = chat_body(false);
  std::vector<std::unique_ptr<RawTlsClient>> clients;
  for (int i = 0; i < 16; ++i) {
    clients.push_back(raw());
    ASSERT_TRUE(
        clients.back()->write(head("POST", "/v1/chat/completions", kKey, body.size()) + body).ok());
  }
  ASSERT_TRUE(eventually([&] { return proxy_->stats().in_flight == 16 && silent.held() == 16; }))
      << "in flight " << proxy_->stats().in_flight << ", held by Ollama " << silent.held();
  EXPECT_EQ(call("GET", "/api/version").status, 503);  // every place taken

  clients.clear();  // all sixteen hang up
  const auto left = std::chrono::steady_clock::now();
  ASSERT_TRUE(eventually([&] { return call("GET", "/api/version").status == 200; }, 5s))
      << "in flight " << proxy_->stats().in_flight;
  const auto served = std::chrono::steady_clock::now() - left;
  EXPECT_LT(served, 1s);
  std::cout << "measured: a keyed request served "
            << std::chrono::duration_cast<std::chrono::milliseconds>(served).count()
            << " ms after 16 clients of a silent Ollama left\n";
  EXPECT_TRUE(eventually([&] { return silent.held() == 0; }, 2s))
      << "the proxy still holds " << silent.held() << " connections to Ollama for clients gone";
  // Ollama's side closes before the proxy counts the last request done.
  EXPECT_TRUE(eventually([&] { return proxy_->stats().in_flight == 0u; }, 2s))
      << "in flight " << proxy_->stats().in_flight;
  EXPECT_EQ(proxy_->stats().upstream_errors, 0u);  // a client leaving is no upstream error
}

// An Ollama that has not begun its answer within upstream_first_byte_timeout
// is given up: 504 in the proxy's OpenAI shape, the place and Ollama's
// connection given back.
TEST_F(EndpointTest, AnOllamaThatDoesNotBeginItsAnswerInTimeIs504) {
  SilentOllama silent;
  auto o = options();
  o.upstream = silent.url();
  o.upstream_first_byte_timeout = 300ms;
  start(o);
  const auto asked = std::chrono::steady_clock::now();
  auto r = call("POST", "/v1/chat/completions", kKey, chat_body(false));
  EXPECT_LT(std::chrono::steady_clock::now() - asked, 5s);
  EXPECT_EQ(r.status, 504) << r.body;
  auto j = Json::parse(r.body);
  EXPECT_EQ(j["error"]["type"], "server_error");
  EXPECT_EQ(j["error"]["code"], "upstream_timeout");
  EXPECT_TRUE(j["error"]["param"].is_null());
  EXPECT_NE(j["error"]["message"].get<std::string>().find("300 ms"), std::string::npos) << r.body;
  EXPECT_EQ(proxy_->stats().upstream_errors, 1u);
  EXPECT_EQ(proxy_->stats().in_flight, 0u);
  EXPECT_TRUE(eventually([&] { return silent.held() == 0; }, 2s));
}

// An agent restart: the saved credentials serve again without the coordinator.
TEST_F(EndpointTest, CredentialsSurviveARestart) {
  auto o = options();
  start(o);
  auto not_after = proxy_->certificate_not_after();
  EXPECT_GT(not_after, std::chrono::duration_cast<std::chrono::seconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count());
  proxy_.reset();

  proxy_ = std::make_unique<Proxy>(o);
  EXPECT_FALSE(proxy_->serving());
  EXPECT_EQ(proxy_->port(), 0);
  auto loaded = proxy_->load_saved();
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  EXPECT_TRUE(*loaded);
  EXPECT_TRUE(proxy_->serving());
  EXPECT_EQ(proxy_->certificate_not_after(), not_after);
  EXPECT_EQ(call("GET", "/v1/models", kKey).status, 200);
  EXPECT_EQ(call("GET", "/v1/models", kOtherKey).status, 401);

  // Stopped and applied again: serving again.
  proxy_->stop();
  EXPECT_FALSE(proxy_->serving());
  ASSERT_TRUE(proxy_->apply(ca_->sign(kKey)).ok());
  EXPECT_EQ(call("GET", "/api/version", kKey).status, 200);
}

TEST_F(EndpointTest, NothingSavedIsNotServing) {
  Proxy p(options());
  auto loaded = p.load_saved();
  ASSERT_TRUE(loaded.ok());
  EXPECT_FALSE(*loaded);
  EXPECT_FALSE(p.serving());
  EXPECT_EQ(p.certificate_not_after(), 0);
}

TEST_F(EndpointTest, StateFilesAre0600) {
  auto c = ca_->sign(kKey);
  proxy_ = std::make_unique<Proxy>(options());
  ASSERT_TRUE(proxy_->apply(c).ok());
  for (const char* f : {"endpoint.crt", "endpoint.key", "api-key.sha256"}) {
    struct stat st {};
    ASSERT_EQ(::stat((dir_ / "state" / f).c_str(), &st), 0) << f;
    EXPECT_EQ(st.st_mode & 0777, 0600u) << f;
  }
  EXPECT_EQ(slurp(dir_ / "state/endpoint.key"), c.private_key_pem);
  EXPECT_EQ(slurp(dir_ / "state/endpoint.crt"), c.certificate_pem);
  // The key itself is nowhere on disk: only its hash.
  for (const auto& e : fs::directory_iterator(dir_ / "state"))
    EXPECT_EQ(slurp(e.path()).find(kKey), std::string::npos) << e.path();
}

// A certificate for another key, a bad hash: refused, and nothing changes
// (neither the files nor the key that works).
TEST_F(EndpointTest, BadCredentialsChangeNothing) {
  Proxy fresh(options());
  auto mismatched = ca_->sign(kOtherKey);
  mismatched.private_key_pem = make_key_and_csr("t5")->private_key_pem;
  EXPECT_FALSE(fresh.apply(mismatched).ok());
  EXPECT_FALSE(fresh.serving());
  EXPECT_FALSE(fs::exists(dir_ / "state/endpoint.key"));

  start();
  std::map<std::string, std::string> before;
  for (const char* f : {"endpoint.crt", "endpoint.key", "api-key.sha256"})
    before[f] = slurp(dir_ / "state" / f);

  auto st = proxy_->apply(mismatched);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("not for this guest's key"), std::string::npos)
      << st.error().message;
  auto upper = ca_->sign(kOtherKey);
  for (auto& ch : upper.key_sha256) ch = static_cast<char>(std::toupper(ch));
  EXPECT_FALSE(proxy_->apply(upper).ok());
  auto short_hash = ca_->sign(kOtherKey);
  short_hash.key_sha256.pop_back();
  EXPECT_FALSE(proxy_->apply(short_hash).ok());
  auto no_cert = ca_->sign(kOtherKey);
  no_cert.certificate_pem = "not a certificate";
  EXPECT_FALSE(proxy_->apply(no_cert).ok());

  for (const auto& [f, text] : before) EXPECT_EQ(slurp(dir_ / "state" / f), text) << f;
  EXPECT_EQ(call("GET", "/v1/models", kKey).status, 200);
  EXPECT_EQ(call("GET", "/v1/models", kOtherKey).status, 401);
}

// The health probe against the stand-in's streaming /api/generate.
TEST_F(EndpointTest, ProbeMeasuresFirstTokenAndTotal) {
  knob("ollama_token_delay", "0.02");
  auto p = probe(ollama_url(), kModel, "say hi", 10s);
  ASSERT_TRUE(p.ok) << p.error;
  EXPECT_GT(p.ttft_ms, 0);
  EXPECT_LE(p.ttft_ms, p.total_ms);
  // num_predict 8: eight tokens, 20 ms apart, before done.
  EXPECT_GE(p.total_ms - p.ttft_ms, 7 * 20 * 0.8);

  auto unknown = probe(ollama_url(), "nope:1b", "say hi", 10s);
  EXPECT_FALSE(unknown.ok);
  EXPECT_NE(unknown.error.find("HTTP 404"), std::string::npos) << unknown.error;
  EXPECT_NE(unknown.error.find("not found"), std::string::npos) << unknown.error;

  ollama_.stop();
  auto down = probe(ollama_url(), kModel, "say hi", 2s);
  EXPECT_FALSE(down.ok);
  EXPECT_FALSE(down.error.empty());
}

// The stand-in's generation is slower than the probe's deadline allows.
TEST_F(EndpointTest, ProbeTimesOut) {
  knob("ollama_token_delay", "0.3");
  auto p = probe(ollama_url(), kModel, "say hi", 500ms);
  EXPECT_FALSE(p.ok);
  EXPECT_FALSE(p.error.empty());
}

// The proxy reads the key with the coordinator's parser (common/net).
TEST(EndpointRoutes, BearerToken) {
  EXPECT_EQ(net::bearer_token("Bearer abc"), "abc");
  EXPECT_EQ(net::bearer_token("bearer   abc  "), "abc");
  EXPECT_EQ(net::bearer_token("BEARER abc"), "abc");
  EXPECT_EQ(net::bearer_token("Bearer"), std::nullopt);
  EXPECT_EQ(net::bearer_token("Bearer "), std::nullopt);
  EXPECT_EQ(net::bearer_token("Bearerabc"), std::nullopt);
  EXPECT_EQ(net::bearer_token("Basic abc"), std::nullopt);
  EXPECT_EQ(net::bearer_token("Bearer a b"), std::nullopt);
  EXPECT_EQ(net::bearer_token(""), std::nullopt);
}

TEST(EndpointRoutes, Allowlist) {
  auto pass = [](const char* m, const char* p) {
    auto r = match_route(m, p);
    return r.verdict == RouteVerdict::pass ? r.upstream_target : "";
  };
  EXPECT_EQ(pass("POST", "/v1/chat/completions"), "/v1/chat/completions");
  EXPECT_EQ(pass("POST", "/api/generate"), "/api/generate");
  EXPECT_EQ(pass("GET", "/api/tags"), "/api/tags");
  EXPECT_EQ(pass("GET", "/v1/models/llama3.2:1b"), "/v1/models/llama3.2:1b");
  // A decoded segment goes to Ollama encoded again.
  EXPECT_EQ(pass("GET", "/v1/models/a b?"), "/v1/models/a%20b%3F");
  EXPECT_EQ(match_route("GET", "/v1/models/").verdict, RouteVerdict::not_found);
  EXPECT_EQ(match_route("GET", "/v1/models/a/b").verdict, RouteVerdict::not_found);
  EXPECT_EQ(match_route("GET", "/v1/models/..").verdict, RouteVerdict::not_found);
  EXPECT_EQ(match_route("GET", "/v1/models/.").verdict, RouteVerdict::not_found);
  EXPECT_EQ(match_route("GET", "/v1/models/..x").verdict, RouteVerdict::pass);
  EXPECT_EQ(match_route("POST", "/api/pull").verdict, RouteVerdict::not_found);
  EXPECT_EQ(match_route("POST", "/api/generate/").verdict, RouteVerdict::not_found);
  EXPECT_EQ(match_route("POST", "/API/GENERATE").verdict, RouteVerdict::not_found);
  auto wrong = match_route("POST", "/v1/models");
  EXPECT_EQ(wrong.verdict, RouteVerdict::wrong_method);
  EXPECT_EQ(wrong.allow, "GET");
}

TEST(EndpointRoutes, ErrorBodyIsOpenAisShape) {
  auto j = Json::parse(error_body("invalid_request_error", "invalid_api_key", "no"));
  EXPECT_EQ(j["error"]["message"], "no");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["code"], "invalid_api_key");
  EXPECT_TRUE(j["error"]["param"].is_null());
}

TEST(EndpointKeys, KeyAndCsr) {
  auto kc = make_key_and_csr("t5");
  ASSERT_TRUE(kc.ok()) << kc.error().message;
  EXPECT_NE(kc->private_key_pem.find("BEGIN PRIVATE KEY"), std::string::npos);
  EXPECT_NE(kc->csr_pem.find("BEGIN CERTIFICATE REQUEST"), std::string::npos);
  EXPECT_NE(make_key_and_csr("t5")->private_key_pem, kc->private_key_pem);
}

// ---- Issue 28: several keys, their limits, tokens per key ----

const std::string kNamedA = "fk-endpoint-test-named-a";
const std::string kNamedB = "fk-endpoint-test-named-b";

// What the stand-in counted for one answer, read from the answer itself:
// the final object of /api/generate and /api/chat (streamed or not), the
// usage object of /v1/chat/completions. A stream whose client did not ask
// for usage shows none (the proxy keeps it back): its counts are the
// stand-in's rule, one chunk per token and the prompt's words.
TokenCounts counted_in(const std::string& path, const std::string& request_body,
                       const std::string& answer) {
  TokenCounts c;
  if (path.rfind("/api/", 0) == 0) {
    std::size_t at = 0, nl;
    std::string rest = answer + "\n";
    while ((nl = rest.find('\n', at)) != std::string::npos) {
      auto j = Json::parse(rest.substr(at, nl - at), nullptr, false);
      at = nl + 1;
      if (j.is_object() && j.value("done", false)) {
        c.prompt = j.value("prompt_eval_count", 0u);
        c.completion = j.value("eval_count", 0u);
      }
    }
    return c;
  }
  if (answer.rfind("data: ", 0) != 0) {
    auto j = Json::parse(answer);
    return {j["usage"]["prompt_tokens"].get<std::uint64_t>(),
            j["usage"]["completion_tokens"].get<std::uint64_t>()};
  }
  bool usage_seen = false;
  std::uint64_t chunks = 0;
  for (std::size_t at = 0; (at = answer.find("data: ", at)) != std::string::npos;) {
    auto end = answer.find("\n\n", at);
    auto j = Json::parse(answer.substr(at + 6, end - at - 6), nullptr, false);
    at = end;
    if (!j.is_object()) continue;
    if (j.contains("usage") && j["usage"].is_object()) {
      usage_seen = true;
      c = {j["usage"]["prompt_tokens"].get<std::uint64_t>(),
           j["usage"]["completion_tokens"].get<std::uint64_t>()};
    } else if (!j["choices"].empty() && j["choices"][0]["finish_reason"].is_null()) {
      chunks++;
    }
  }
  if (usage_seen) return c;
  auto req = Json::parse(request_body);
  std::uint64_t words = 0;
  for (const auto& m : req["messages"]) {
    std::istringstream in(m.value("content", ""));
    std::string w;
    while (in >> w) words++;
  }
  return {words, chunks};
}

// Tokens per key through the real proxy, on each path Ollama counts on,
// streamed and not: each key's sum is exactly the sum of the counts the
// answers carried, requests and errors counted too.
TEST_F(EndpointTest, TokensPerKeyAreTheSumOfOllamasOwnCounts) {
  start();
  proxy_->set_named_keys({{"a", pki::sha256_hex(kNamedA), std::nullopt, std::nullopt},
                          {"b", pki::sha256_hex(kNamedB), std::nullopt, std::nullopt}});
  struct Case {
    std::string path, body;
  };
  auto chat = [](bool stream, const std::string& prompt, bool usage = false) {
    Json j = {{"model", kModel},
              {"stream", stream},
              {"messages", {{{"role", "user"}, {"content", prompt}}}}};
    if (usage) j["stream_options"] = {{"include_usage", true}};
    return j.dump();
  };
  auto gen = [](bool stream, const std::string& prompt) {
    return Json{{"model", kModel}, {"stream", stream}, {"prompt", prompt}}.dump();
  };
  const std::vector<Case> cases = {
      {"/api/generate", gen(false, "why is the sky blue")},
      {"/api/generate", gen(true, "tell me a story about a GPU")},
      {"/api/chat", chat(false, "hello there")},
      {"/api/chat", chat(true, "what is a tensor core exactly")},
      {"/v1/chat/completions", chat(false, "one two three")},
      {"/v1/chat/completions", chat(true, "stream me an answer please")},
      {"/v1/chat/completions", chat(true, "with usage asked for", true)},
  };
  std::map<std::string, KeyUsage> want;
  const std::vector<std::pair<std::string, std::string>> keys = {
      {kDefaultKey, kKey}, {"a", kNamedA}, {"b", kNamedB}};
  for (std::size_t k = 0; k < keys.size(); k++) {
    const auto& [name, key] = keys[k];
    // Each key its own share of the cases, so the sums differ.
    for (std::size_t i = k; i < cases.size() + k; i++) {
      const Case& c = cases[i % cases.size()];
      auto r = call("POST", c.path, key, c.body);
      ASSERT_EQ(r.status, 200) << c.path << ": " << r.body;
      auto counts = counted_in(c.path, c.body, r.body);
      EXPECT_GT(counts.completion, 0u) << c.path << ": " << r.body;
      auto& w = want[name];
      w.requests++;
      w.prompt_tokens += counts.prompt;
      w.completion_tokens += counts.completion;
      // A client that did not ask for the usage chunk does not get one.
      const bool asked = c.body.find("include_usage") != std::string::npos;
      if (r.body.rfind("data: ", 0) == 0) {
        EXPECT_EQ(r.body.find("\"usage\"") != std::string::npos, asked) << r.body;
        EXPECT_NE(r.body.find("data: [DONE]\n\n"), std::string::npos) << r.body;
      }
    }
  }
  // An error: Ollama's 404 for a model it does not have, under key b.
  auto missing = call("POST", "/api/chat", kNamedB,
                      Json{{"model", "nope"}, {"messages", Json::array()}}.dump());
  EXPECT_EQ(missing.status, 404) << missing.body;
  want["b"].requests++;
  want["b"].errors++;
  ASSERT_TRUE(eventually([&] { return proxy_->stats().in_flight == 0; }, 2s));
  auto got = proxy_->take_usage();
  ASSERT_EQ(got.size(), 3u);
  for (const auto& [name, w] : want) {
    SCOPED_TRACE(name);
    EXPECT_EQ(got[name].requests, w.requests);
    EXPECT_EQ(got[name].errors, w.errors);
    EXPECT_EQ(got[name].prompt_tokens, w.prompt_tokens);
    EXPECT_EQ(got[name].completion_tokens, w.completion_tokens);
  }
  // take() empties: the next report has only what came after.
  EXPECT_TRUE(proxy_->take_usage().empty());
}

// The named keys are replaced whole by each frame: one left out is refused
// at once. Without the coordinator they stop after the grace, the tenant's
// own key goes on serving, and the next frame brings them back.
TEST_F(EndpointTest, NamedKeysAreReplacedWholeAndFailClosedWithoutTheCoordinator) {
  auto o = options();
  o.named_key_grace = 300ms;
  start(o);
  EXPECT_EQ(call("GET", "/v1/models", kNamedA).status, 401) << "no named key yet";
  proxy_->set_named_keys({{"a", pki::sha256_hex(kNamedA), std::nullopt, std::nullopt},
                          {"b", pki::sha256_hex(kNamedB), std::nullopt, std::nullopt}});
  EXPECT_EQ(call("GET", "/v1/models", kNamedA).status, 200);
  EXPECT_EQ(call("GET", "/v1/models", kNamedB).status, 200);
  // b revoked: the frame without it.
  proxy_->set_named_keys({{"a", pki::sha256_hex(kNamedA), std::nullopt, std::nullopt}});
  auto refused = call("GET", "/v1/models", kNamedB);
  EXPECT_EQ(refused.status, 401);
  EXPECT_EQ(Json::parse(refused.body)["error"]["code"], "invalid_api_key");
  EXPECT_EQ(call("GET", "/v1/models", kNamedA).status, 200);

  proxy_->link_lost();
  EXPECT_EQ(call("GET", "/v1/models", kNamedA).status, 200) << "within the grace";
  std::this_thread::sleep_for(400ms);
  EXPECT_EQ(call("GET", "/v1/models", kNamedA).status, 401) << "past the grace";
  EXPECT_EQ(call("GET", "/v1/models", kKey).status, 200) << "the default key keeps serving";
  proxy_->set_named_keys({{"a", pki::sha256_hex(kNamedA), std::nullopt, std::nullopt}});
  EXPECT_EQ(call("GET", "/v1/models", kNamedA).status, 200) << "back with the next frame";
}

// Past a key's requests or tokens per minute: 429 in OpenAI's shape, with
// Retry-After; other keys are not touched, and the refusals are counted as
// the key's errors.
TEST_F(EndpointTest, AKeyPastItsLimitGets429WithRetryAfter) {
  start();
  proxy_->set_named_keys({{"slow", pki::sha256_hex(kNamedA), 2, std::nullopt},
                          {"few-tokens", pki::sha256_hex(kNamedB), std::nullopt, 1}});
  EXPECT_EQ(call("GET", "/v1/models", kNamedA).status, 200);
  EXPECT_EQ(call("GET", "/v1/models", kNamedA).status, 200);
  long before = ollama_requests();
  auto r = call("GET", "/v1/models", kNamedA);
  ASSERT_EQ(r.status, 429) << r.body;
  EXPECT_EQ(ollama_requests(), before) << "refused before Ollama";
  auto j = Json::parse(r.body);
  EXPECT_EQ(j["error"]["code"], "rate_limit_exceeded") << r.body;
  EXPECT_EQ(j["error"]["type"], "requests") << r.body;
  ASSERT_TRUE(r.headers.count("retry-after")) << r.body;
  const int retry = std::stoi(r.headers["retry-after"]);
  EXPECT_GE(retry, 1);
  EXPECT_LE(retry, 60);
  EXPECT_EQ(call("GET", "/v1/models", kKey).status, 200) << "the default key has no limit";

  // One token a minute: the first answer spends it (tokens are known at its
  // end), the next request is refused.
  auto first = call("POST", "/api/generate", kNamedB,
                    Json{{"model", kModel}, {"prompt", "hi"}, {"stream", false}}.dump());
  EXPECT_EQ(first.status, 200) << first.body;
  ASSERT_TRUE(eventually([&] { return proxy_->stats().in_flight == 0; }, 2s));
  auto second = call("POST", "/api/generate", kNamedB,
                     Json{{"model", kModel}, {"prompt", "hi"}, {"stream", false}}.dump());
  ASSERT_EQ(second.status, 429) << second.body;
  EXPECT_EQ(Json::parse(second.body)["error"]["type"], "tokens") << second.body;
  EXPECT_TRUE(second.headers.count("retry-after"));
  EXPECT_EQ(proxy_->stats().rate_limited, 2u);
  auto usage = proxy_->take_usage();
  EXPECT_EQ(usage["slow"].requests, 3u);
  EXPECT_EQ(usage["slow"].errors, 1u);
  EXPECT_EQ(usage["few-tokens"].requests, 2u);
  EXPECT_EQ(usage["few-tokens"].errors, 1u);
}

TEST(EndpointKeyLimits, TheWindowSlidesAndRetryAfterSaysWhen) {
  KeyLimits l;
  const auto t0 = std::chrono::steady_clock::time_point(std::chrono::hours(1000));
  EXPECT_TRUE(l.admit("k", 2, std::nullopt, t0).allowed);
  EXPECT_TRUE(l.admit("k", 2, std::nullopt, t0 + 10s).allowed);
  auto v = l.admit("k", 2, std::nullopt, t0 + 20s);
  EXPECT_FALSE(v.allowed);
  EXPECT_EQ(v.retry_after_s, 40) << "the first request leaves the window at t0 + 60 s";
  EXPECT_TRUE(l.admit("k", 2, std::nullopt, t0 + 60s).allowed);
  EXPECT_TRUE(l.admit("other", 2, std::nullopt, t0 + 20s).allowed) << "per key";
  // Tokens: the window's sum against the limit.
  EXPECT_TRUE(l.admit("t", std::nullopt, 100, t0).allowed);
  l.add_tokens("t", 150, t0 + 1s);
  auto tv = l.admit("t", std::nullopt, 100, t0 + 30s);
  EXPECT_FALSE(tv.allowed);
  EXPECT_STREQ(tv.which, "tokens");
  EXPECT_EQ(tv.retry_after_s, 31);
  EXPECT_TRUE(l.admit("t", std::nullopt, 100, t0 + 61s).allowed);
}

TEST(EndpointUsageScanner, CountsAcrossChunkBoundsAndSkipsHugeLines) {
  const std::string ndjson =
      "{\"response\":\"a\",\"done\":false}\n"
      "{\"response\":\"\",\"done\":true,\"prompt_eval_count\":7,\"eval_count\":12}\n";
  for (std::size_t cut = 1; cut < ndjson.size(); cut += 7) {
    UsageScanner s;
    s.feed(std::string_view(ndjson).substr(0, cut));
    s.feed(std::string_view(ndjson).substr(cut));
    s.finish();
    ASSERT_TRUE(s.counts()) << cut;
    EXPECT_EQ(s.counts()->prompt, 7u);
    EXPECT_EQ(s.counts()->completion, 12u);
  }
  UsageScanner sse;
  sse.feed(
      "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: {\"choices\":[],"
      "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}\n\ndata: [DONE]\n\n");
  sse.finish();
  ASSERT_TRUE(sse.counts());
  EXPECT_EQ(sse.counts()->prompt, 3u);
  EXPECT_EQ(sse.counts()->completion, 4u);
  // A whole body without a newline is one line.
  UsageScanner whole;
  whole.feed(R"({"usage":{"prompt_tokens":5,"completion_tokens":6},"choices":[]})");
  whole.finish();
  ASSERT_TRUE(whole.counts());
  EXPECT_EQ(whole.counts()->completion, 6u);
  // A line past the limit is skipped, the next one read; a negative or
  // absurd count is no count.
  UsageScanner big;
  big.feed(std::string(UsageScanner::kMaxLine + 10, 'x'));
  big.feed("\n{\"done\":true,\"prompt_eval_count\":-1,\"eval_count\":99999999999}\n");
  big.finish();
  EXPECT_FALSE(big.counts());
}

TEST(EndpointUsageScanner, TheUsageChunkIsAskedForAndKeptFromAClientThatDidNotAsk) {
  auto asked = with_usage_requested(R"({"model":"m","stream":true,"messages":[]})");
  ASSERT_TRUE(asked);
  EXPECT_EQ(Json::parse(*asked)["stream_options"]["include_usage"], true);
  EXPECT_FALSE(with_usage_requested(R"({"model":"m","messages":[]})")) << "not streamed";
  EXPECT_FALSE(with_usage_requested(R"({"stream":true,"stream_options":{"include_usage":true}})"))
      << "asked already";
  EXPECT_FALSE(with_usage_requested("not json"));
  UsageChunkFilter f;
  std::string out = f.pass("data: {\"choices\":[{\"delta\":{}}]}\n\ndata: {\"choices\":[],\"us");
  out += f.pass("age\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n");
  out += f.finish();
  EXPECT_EQ(out, "data: {\"choices\":[{\"delta\":{}}]}\n\ndata: [DONE]\n\n");
}

TEST(EndpointKeyRing, DefaultAndNamedKeys) {
  KeyRing ring(std::chrono::seconds(3));
  ring.set_default(pki::sha256_hex(kKey));
  ring.set_named({{"a", pki::sha256_hex(kNamedA), 10, std::nullopt}});
  EXPECT_EQ(ring.match(pki::sha256_hex(kKey))->name, kDefaultKey);
  EXPECT_EQ(ring.match(pki::sha256_hex(kNamedA))->rpm, 10);
  EXPECT_FALSE(ring.match(pki::sha256_hex(kNamedB)));
  const auto t = std::chrono::steady_clock::now();
  ring.link_lost(t);
  EXPECT_TRUE(ring.match(pki::sha256_hex(kNamedA), t + 2900ms));
  EXPECT_FALSE(ring.match(pki::sha256_hex(kNamedA), t + 3s));
  EXPECT_TRUE(ring.match(pki::sha256_hex(kKey), t + 1h));
}

}  // namespace
}  // namespace factory::agent::endpoint
