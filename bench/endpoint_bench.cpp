// What the model endpoint's proxy costs (docs/model-endpoint.md): the same
// requests straight to Ollama and through the proxy (TLS, the key's hash,
// the allowlist, a worker streaming the answer), in the same run, and the
// difference. Ollama is the stand-in (tests/fakes/ollama_server.py, with
// Ollama's own answer shapes and a fixed 5 ms between streamed tokens), so
// the figures are the proxy's overhead, not a model's speed. The proxy's
// certificate comes from a CA made here with the openssl command, as in
// tests/agent/endpoint_test.cpp. Not a CTest: `make bench-endpoint`.
//
//   endpoint_bench [--requests N] [--concurrency C] [--seconds S]
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <thread>
#include <vector>

#include "agent/endpoint/proxy.hpp"
#include "common/net/http_client.hpp"
#include "common/pki.hpp"
#include "tests/support/test_support.hpp"

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using namespace factory;
using namespace factory::agent::endpoint;
using factory::testing::Process;
using factory::testing::slurp;
using factory::testing::TempDir;

namespace {

const std::string kKey = "fmk-bench-key";
const std::string kModel = "llama3.2:1b";

void must(bool ok, const std::string& what) {
  if (!ok) {
    std::cerr << "endpoint_bench: " << what << "\n";
    std::exit(1);
  }
}

void run_ok(const std::vector<std::string>& argv) {
  auto r = factory::testing::run(argv);
  must(r.ok(), argv.front() + ": " + r.output);
}

Credentials make_credentials(const fs::path& dir) {
  run_ok({"/usr/bin/python3", (factory::testing::source_dir() / "tests/fakes/testpki.py").string(),
          "ca", dir.string(), "ca"});
  auto kc = make_key_and_csr("bench");
  must(kc.ok(), "key and CSR");
  std::ofstream(dir / "leaf.csr") << kc->csr_pem;
  std::ofstream(dir / "ext.cnf") << "basicConstraints=critical,CA:FALSE\n"
                                    "extendedKeyUsage=serverAuth\n"
                                    "subjectAltName=IP:127.0.0.1\n";
  run_ok({"/usr/bin/openssl", "x509", "-req", "-in", (dir / "leaf.csr").string(), "-CA",
          (dir / "ca.crt").string(), "-CAkey", (dir / "ca.key").string(), "-CAcreateserial",
          "-days", "1", "-extfile", (dir / "ext.cnf").string(), "-out",
          (dir / "leaf.crt").string()});
  Credentials c;
  c.certificate_pem = slurp(dir / "leaf.crt") + slurp(dir / "ca.crt");
  c.private_key_pem = kc->private_key_pem;
  c.key_sha256 = pki::sha256_hex(kKey);
  return c;
}

struct Target {
  std::string name, base, ca_pem;
  bool with_key = false;
};

net::HttpRequest request(const Target& t, const std::string& method, const std::string& path,
                         const std::string& body = "") {
  net::HttpRequest r;
  r.method = method;
  r.url = t.base + path;
  if (t.with_key) r.headers["Authorization"] = "Bearer " + kKey;
  if (!body.empty()) {
    r.headers["Content-Type"] = "application/json";
    r.body = body;
  }
  r.timeout = 30s;
  return r;
}

net::HttpClient client(const Target& t) {
  net::TlsClientOptions tls;
  tls.ca_pem = t.ca_pem;
  return net::HttpClient(tls);
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

double pct(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

struct Latency {
  double p50 = 0, p99 = 0;
};

// Sequential GET /v1/models: one connection each (as HttpClient does).
Latency models_latency(const Target& t, int n) {
  auto c = client(t);
  std::vector<double> ms;
  for (int i = 0; i < n; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    auto r = c.request(request(t, "GET", "/v1/models"));
    must(r.ok() && r->status == 200, t.name + ": GET /v1/models failed");
    ms.push_back(ms_since(t0));
  }
  return {pct(ms, 0.5), pct(ms, 0.99)};
}

// A streamed chat completion: time to the first chunk with content, and to the end.
struct Stream {
  double ttft_p50 = 0, total_p50 = 0;
};
Stream chat_stream(const Target& t, int n) {
  auto c = client(t);
  const std::string body = nlohmann::json{{"model", kModel},
                                          {"stream", true},
                                          {"messages", {{{"role", "user"}, {"content", "Hi"}}}}}
                               .dump();
  std::vector<double> first, total;
  for (int i = 0; i < n; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    double ttft = -1;
    auto r = c.stream(request(t, "POST", "/v1/chat/completions", body), [&](std::string_view d) {
      if (ttft < 0 && d.find("\"content\"") != std::string_view::npos) ttft = ms_since(t0);
      return true;
    });
    must(r.ok() && *r == 200, t.name + ": streamed chat failed");
    first.push_back(ttft);
    total.push_back(ms_since(t0));
  }
  return {pct(first, 0.5), pct(total, 0.5)};
}

// C clients in a loop for S seconds: non-streamed chat completions per second.
double throughput(const Target& t, int concurrency, int seconds) {
  const std::string body =
      nlohmann::json{{"model", kModel}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}}
          .dump();
  std::atomic<long> done{0}, failed{0};
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  std::vector<std::thread> ts;
  for (int i = 0; i < concurrency; ++i)
    ts.emplace_back([&] {
      auto c = client(t);
      while (std::chrono::steady_clock::now() < until) {
        auto r = c.request(request(t, "POST", "/v1/chat/completions", body));
        if (r.ok() && r->status == 200)
          ++done;
        else
          ++failed;
      }
    });
  for (auto& th : ts) th.join();
  must(failed == 0, t.name + ": " + std::to_string(failed.load()) + " requests failed");
  return static_cast<double>(done) / seconds;
}

}  // namespace

int main(int argc, char** argv) {
  int n = 200, concurrency = 8, seconds = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--requests")
      n = std::stoi(argv[i + 1]);
    else if (a == "--concurrency")
      concurrency = std::stoi(argv[i + 1]);
    else if (a == "--seconds")
      seconds = std::stoi(argv[i + 1]);
    else {
      std::cerr << "usage: endpoint_bench [--requests N] [--concurrency C] [--seconds S]\n";
      return 2;
    }
  }
  TempDir dir("endpoint-bench");
  auto state = dir / "ollama-root/.guestsim/state/ollama";
  fs::create_directories(state);
  fs::create_directories(dir / "ollama-root/.guestsim/knobs");
  std::ofstream(state / "models.json")
      << nlohmann::json{{kModel, {{"modified_at", "2026-12-01T10:00:00+00:00"}}}}.dump();
  const int ollama_port = factory::testing::free_loopback_port();
  Process ollama({"/usr/bin/python3",
                  (factory::testing::source_dir() / "tests/fakes/ollama_server.py").string(),
                  "--root", (dir / "ollama-root").string(), "--port", std::to_string(ollama_port)},
                 dir / "ollama.log");
  const std::string upstream = "http://127.0.0.1:" + std::to_string(ollama_port);
  must(factory::testing::eventually([&] {
         net::HttpRequest r;
         r.url = upstream + "/api/version";
         r.timeout = 1s;
         auto resp = net::HttpClient().request(r);
         return resp.ok() && resp->status == 200;
       }),
       "the stand-in Ollama did not start");

  fs::create_directories(dir / "ca");
  Credentials creds = make_credentials(dir / "ca");
  ProxyOptions po;
  po.listen = "127.0.0.1:0";
  po.upstream = upstream;
  po.state_dir = dir / "proxy";
  po.max_concurrent = static_cast<size_t>(std::max(16, concurrency * 2));
  Proxy proxy(po);
  must(proxy.apply(creds).ok(), "the proxy did not start");

  const Target direct{"direct", upstream, "", false};
  const Target proxied{"proxy", "https://127.0.0.1:" + std::to_string(proxy.port()),
                       slurp(dir / "ca/ca.crt"), true};

  std::printf("endpoint_bench: %d requests each, %d clients for %d s; Ollama = the stand-in\n", n,
              concurrency, seconds);
  auto ld = models_latency(direct, n), lp = models_latency(proxied, n);
  std::printf(
      "GET /v1/models, one connection each   direct p50 %.2f ms p99 %.2f ms | proxy p50 "
      "%.2f ms p99 %.2f ms | added p50 %.2f ms\n",
      ld.p50, ld.p99, lp.p50, lp.p99, lp.p50 - ld.p50);
  auto sd = chat_stream(direct, std::max(1, n / 4)), sp = chat_stream(proxied, std::max(1, n / 4));
  std::printf(
      "streamed chat, time to first token    direct %.2f ms | proxy %.2f ms | added %.2f "
      "ms (to the end: %.2f / %.2f ms)\n",
      sd.ttft_p50, sp.ttft_p50, sp.ttft_p50 - sd.ttft_p50, sd.total_p50, sp.total_p50);
  double td = throughput(direct, concurrency, seconds);
  double tp = throughput(proxied, concurrency, seconds);
  std::printf(
      "chat completions/s, %d clients         direct %.1f | proxy %.1f | %.0f%% of direct\n",
      concurrency, td, tp, td > 0 ? 100.0 * tp / td : 0);
  proxy.stop();
  ollama.stop();
  return 0;
}
