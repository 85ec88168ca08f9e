// Both TLS endpoints of a real `factory serve`, checked by peers we did not
// write: testssl.sh (Debian's) for the protocols offered, and openssl s_client
// for the client-certificate request and an old-protocol handshake.
#include <gtest/gtest.h>

#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "tests/support/coordinator_harness.hpp"

using namespace factory::testing;
using namespace std::chrono_literals;

namespace {
std::map<std::string, std::string> testssl_protocols(const TempDir& dir, int port) {
  auto json_file = dir / ("testssl-" + std::to_string(port) + ".json");
  auto r = run({"testssl", "--quiet", "--color", "0", "--protocols", "--jsonfile",
                json_file.string(), "127.0.0.1:" + std::to_string(port)},
               120s);
  EXPECT_EQ(r.exit_code, 0) << "testssl (Debian's testssl.sh) must be installed: " << r.output;
  std::map<std::string, std::string> found;
  auto j = nlohmann::json::parse(slurp(json_file), nullptr, false);
  if (j.is_discarded()) return found;
  for (auto& f : j) found[f.value("id", "")] = f.value("finding", "");
  return found;
}
}  // namespace

TEST(Tls, EndpointsOfferTls13Only) {
  TempDir dir("tls");
  CoordinatorHarness h(dir.path());
  h.start();
  // Both endpoints at once: testssl.sh mostly waits on its handshakes' timeouts.
  std::map<int, std::map<std::string, std::string>> found;
  std::mutex mu;
  std::vector<std::thread> probes;
  for (int port : {h.agents_port(), h.api_port()})
    probes.emplace_back([&, port] {
      auto p = testssl_protocols(dir, port);
      std::lock_guard lk(mu);
      found[port] = std::move(p);
    });
  for (auto& t : probes) t.join();
  for (int port : {h.agents_port(), h.api_port()}) {
    SCOPED_TRACE(port);
    auto& p = found[port];
    ASSERT_FALSE(p.empty());
    for (auto old : {"SSLv2", "SSLv3", "TLS1", "TLS1_1", "TLS1_2"})
      EXPECT_EQ(p[old], "not offered") << old;
    EXPECT_EQ(p["TLS1_3"].rfind("offered", 0), 0u) << p["TLS1_3"];
  }
}

TEST(Tls, AgentEndpointAsksForAClientCertificateFromItsCa) {
  TempDir dir("tls");
  CoordinatorHarness h(dir.path());
  h.start();
  std::string ca = (h.state_dir() / "ca.crt").string();
  factory::CommandSpec s;
  s.argv = {"openssl",
            "s_client",
            "-connect",
            "127.0.0.1:" + std::to_string(h.agents_port()),
            "-CAfile",
            ca,
            "-verify_return_error",
            "-servername",
            "localhost"};
  s.stdin_data = "";
  s.timeout = 20s;
  auto r = factory::run_command(s);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_NE(r->output.find("Verify return code: 0 (ok)"), std::string::npos) << r->output;
  EXPECT_NE(r->output.find("Acceptable client certificate CA names"), std::string::npos)
      << r->output;
  EXPECT_NE(r->output.find("factory coordinator CA"), std::string::npos) << r->output;
  EXPECT_NE(r->output.find("TLSv1.3"), std::string::npos) << r->output;
  // TLS 1.2 is refused outright.
  s.argv.push_back("-tls1_2");
  r = factory::run_command(s);
  ASSERT_TRUE(r.ok());
  EXPECT_NE(r->exit_code, 0) << r->output;
}
