// Nothing lost: the coordinator acknowledges an agent's event only once its
// store made it durable, and never past one it could not store. The store's
// failure is real: a trigger in its SQLite database refuses one event's
// insert, so the writer's transaction fails as on a failing disk.
#include <gtest/gtest.h>

#include <fstream>

#include "common/net/http_client.hpp"
#include "tests/support/coordinator_harness.hpp"

using namespace factory::testing;
using namespace std::chrono_literals;

namespace {

std::vector<uint64_t> synthetic_ns(const std::vector<nlohmann::json>& events) {
  std::vector<uint64_t> out;
  for (auto& e : events)
    if (e["event"].value("kind", "") == "synthetic") out.push_back(e["event"].value("n", 0ull));
  return out;
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

}  // namespace

TEST(Delivery, TheCoordinatorNeverAcknowledgesPastAnEventItDidNotStore) {
  TempDir dir("delivery");
  CoordinatorHarness h(dir.path());
  h.start();
  auto tok = h.create_token("t1");
  h.stop();
  h.exec_sql(
      "CREATE TRIGGER refuse_event_5 BEFORE INSERT ON events WHEN NEW.event_id = 5 "
      "BEGIN SELECT RAISE(ABORT, 'injected: the disk refuses event 5'); END;");
  h.start();

  AgentOptions o;
  // Slow enough that the first events are mostly stored one at a time.
  o.extra_args = {"--link-only", "--synthetic-events", "10", "--synthetic-rate", "5"};
  AgentProcess agent(h, tok, o);
  // Event 5 fails, the session is closed, the agent comes back and sends it
  // again, and it fails again: more than once, so events 6..10 had their chances.
  auto spool_state = [&] {
    auto a =
        nlohmann::json::parse(slurp(agent.state_dir() / "spool" / "spool.acked"), nullptr, false);
    return a.is_discarded() ? nlohmann::json::object() : a;
  };
  ASSERT_TRUE(eventually(
      [&] {
        // All ten emitted (one line each in the spool's log) and 5 refused thrice.
        return count_of(slurp(agent.state_dir() / "spool" / "spool.log"), "\n") == 10 &&
               count_of(h.log(), "could not store event 5") >= 3;
      },
      30s, 100ms))
      << h.log() << agent.log();
  // Stored: 1..k, in order, for some k before 5 (the events sent in one
  // transaction with 5 fail with it, and come again); nothing from 5 on.
  auto stored = synthetic_ns(h.stored_events("t1"));
  ASSERT_LE(stored.size(), 4u) << "nothing after the event that could not be stored is stored";
  for (size_t i = 0; i < stored.size(); ++i) EXPECT_EQ(stored[i], i + 1);
  EXPECT_LE(spool_state().value("acked", 0ull), stored.size())
      << "and nothing past what was stored is acknowledged";

  // The disk recovers: everything arrives, once each, in order.
  h.stop();
  h.exec_sql("DROP TRIGGER refuse_event_5;");
  h.start();
  ASSERT_TRUE(eventually([&] { return synthetic_ns(h.stored_events("t1")).size() >= 10; }, 30s))
      << agent.log();
  std::vector<uint64_t> all;
  for (uint64_t n = 1; n <= 10; ++n) all.push_back(n);
  EXPECT_EQ(synthetic_ns(h.stored_events("t1")), all);
  EXPECT_TRUE(eventually([&] { return spool_state().value("acked", 0ull) == 10u; }, 10s));
}

TEST(Delivery, EventsTheAgentHadToDropShowInStatusAndMetrics) {
  TempDir dir("delivery");
  CoordinatorHarness h(dir.path());
  h.start();
  auto tok = h.create_token("t1");
  // The coordinator is down while the agent emits 40 events into a spool
  // that holds 16: the 24 oldest are dropped, and counted.
  h.stop();
  std::ofstream(dir / "agent.yaml") << "spool_max_events: 16\n";
  AgentOptions o;
  o.extra_args = {"--config", (dir / "agent.yaml").string(), "--link-only"};
  o.extra_args.insert(o.extra_args.end(), {"--synthetic-events", "40", "--synthetic-rate", "200"});
  AgentProcess agent(h, tok, o);
  // All forty emitted: the last one is on disk.
  ASSERT_TRUE(eventually(
      [&] {
        return slurp(agent.state_dir() / "spool" / "spool.log").find("\"n\":40") !=
               std::string::npos;
      },
      20s))
      << agent.log();
  h.start();
  ASSERT_TRUE(eventually(
      [&] {
        auto t = h.tenant("t1");
        return t && (*t)["agent"].value("dropped_events", 0ull) == 24u;
      },
      20s))
      << agent.log();
  auto table = h.factory({"status"});
  EXPECT_NE(table.output.find("t1: its agent dropped 24 event(s)"), std::string::npos)
      << table.output;

  factory::net::TlsClientOptions tls;
  tls.ca_pem = slurp(h.state_dir() / "ca.crt");
  factory::net::HttpClient http(tls);
  factory::net::HttpRequest req;
  req.method = "GET";
  req.url = "https://127.0.0.1:" + std::to_string(h.api_port()) + "/metrics";
  // /metrics takes the admin token unless api.metrics_public opens it.
  req.headers["Authorization"] = "Bearer " + h.admin_token();
  auto res = http.request(req);
  ASSERT_TRUE(res.ok()) << res.error().message;
  EXPECT_NE(res->body.find("factory_agent_spool_dropped_events{tenant=\"t1\"} 24"),
            std::string::npos)
      << res->body;
  // What the spool still held arrives.
  EXPECT_TRUE(eventually([&] { return synthetic_ns(h.stored_events("t1")).size() == 16; }, 20s));
}
