// Two real `factory serve` on one PostgreSQL database (issue 26): replicas.
// Each has its own state directory and listeners, as two pods would; what
// they share (the CA, the admin token, bootstrap and read-only API tokens)
// is the database's (coordinator/shared), so an agent holding a token one
// replica issued enrolls through the other, and trusts both.
#include <gtest/gtest.h>

#include "common/atomic_file.hpp"
#include "common/net/http_client.hpp"
#include "tests/integration/event_reader.hpp"
#include "tests/support/coordinator_harness.hpp"
#include "tests/support/postgres_server.hpp"

using namespace factory::testing;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

// The config's `store:` (a postgres:// URI) for the test server's database.
std::string store_uri(const std::string& conninfo) {
  const std::string dbname = conninfo.substr(conninfo.rfind('=') + 1);
  return "postgres://factory@127.0.0.1:" + std::to_string(PostgresServer::instance().port()) + "/" +
         dbname;
}

// GET path on a replica's API with a bearer token: its status.
int get_status(CoordinatorHarness& h, const std::string& path, const std::string& token) {
  auto ca = factory::read_file(h.state_dir() / "ca.crt");
  if (!ca) return -1;
  factory::net::TlsClientOptions tls;
  tls.ca_pem = *ca;
  factory::net::HttpClient client(tls);
  factory::net::HttpRequest req;
  req.url = "https://127.0.0.1:" + std::to_string(h.api_port()) + path;
  req.headers["Authorization"] = "Bearer " + token;
  auto r = client.request(req);
  return r ? r->status : -1;
}

}  // namespace

TEST(Replicas, TwoServesOnOneDatabaseServeOneCaAndHonourEachOthersTokens) {
  const std::string store =
      "store: " + store_uri(PostgresServer::instance().create_database()) + "\n";
  TempDir dir("replicas");
  fs::create_directories(dir.path() / "a");
  fs::create_directories(dir.path() / "b");
  CoordinatorHarness a(dir.path() / "a", store), b(dir.path() / "b", store);
  a.start();
  b.start();

  // One CA chain and one admin token, in neither state directory's key.
  ASSERT_FALSE(a.ca_sha256().empty());
  EXPECT_EQ(a.ca_sha256(), b.ca_sha256());
  EXPECT_EQ(a.admin_token(), b.admin_token());
  EXPECT_FALSE(fs::exists(a.state_dir() / "ca.key"));
  EXPECT_FALSE(fs::exists(b.state_dir() / "ca.key"));
  EXPECT_FALSE(fs::exists(b.state_dir() / "tokens.json"));

  // A token issued through b, redeemed through a.
  auto tok = b.create_token("t1");
  ASSERT_EQ(tok.value("ca_sha256", ""), a.ca_sha256());
  tok["coordinator_url"] = a.agents_url();
  AgentProcess agent(a, tok);
  ASSERT_TRUE(eventually([&] { return a.agent_connected("t1"); }, 15s)) << agent.log() << a.log();
  // The agent connected to a shows connected on b (the feed log), and both
  // replicas' /v1/events hold its `connected` under one id.
  EXPECT_TRUE(eventually([&] { return b.agent_connected("t1"); }, 5s)) << b.log();
  const std::map<std::string, std::string> from_start = {
      {"Authorization", "Bearer " + a.admin_token()}, {"Last-Event-ID", "0"}};
  EventReader on_a(a, "/v1/events", from_start), on_b(b, "/v1/events", from_start);
  auto connect_a = on_a.wait_for("agent", "connected", true);
  auto connect_b = on_b.wait_for("agent", "connected", true);
  ASSERT_TRUE(connect_a && connect_b) << on_a.text() << on_b.text();
  EXPECT_EQ(connect_a->id, connect_b->id);
  EXPECT_EQ(connect_b->data["tenant"], "t1");
  // b's listing says it was used.
  auto list = b.factory({"token", "list", "-o", "json"});
  ASSERT_EQ(list.exit_code, 0) << list.output;
  EXPECT_NE(list.output.find("\"used\""), std::string::npos) << list.output;

  // A read-only API token made through a is good on b within 5 s.
  auto made = a.factory({"token", "create", "--read-only"});
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const std::string ro = made.output.substr(0, made.output.find('\n'));
  ASSERT_EQ(ro.rfind("factory-ro-", 0), 0u) << made.output;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(eventually([&] { return get_status(b, "/v1/tenants", ro) == 200; }, 5s, 100ms))
      << b.log();
  std::cout << "[ figures  ] read-only token good on the other replica after "
            << std::chrono::duration_cast<std::chrono::milliseconds>(
                   std::chrono::steady_clock::now() - t0)
                   .count()
            << " ms\n";
  EXPECT_EQ(get_status(b, "/v1/tokens", ro), 403);  // read-only, there too

  // Nothing secret in either replica's log.
  for (auto* h : {&a, &b}) {
    EXPECT_EQ(h->log().find(h->admin_token()), std::string::npos);
    EXPECT_EQ(h->log().find(ro), std::string::npos);
    EXPECT_EQ(h->log().find(tok.value("token", "-").substr(7)), std::string::npos);
  }
}
