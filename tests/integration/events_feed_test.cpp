// GET /v1/events against a real `factory serve`: an agent's connect within
// 2 s, health and progress as events with ids, Last-Event-ID resuming without
// repeating, ?tenant=, heartbeats; read-only tokens and the dashboard's
// session cookie; `factory status --watch` redrawing on events.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/atomic_file.hpp"
#include "common/net/http_client.hpp"
#include "tests/integration/event_reader.hpp"
#include "tests/integration/own_agent.hpp"
#include "tests/support/coordinator_harness.hpp"

using namespace factory::testing;
using namespace std::chrono_literals;
using nlohmann::json;
namespace net = factory::net;

namespace {

json gpu_sample(int util) {
  return {{"time", "2026-12-01T00:00:00Z"},
          {"hostname", "vm"},
          {"gpu",
           {{"source", "nvml"},
            {"gpus",
             {{{"index", 0},
               {"name", "NVIDIA L4"},
               {"uuid", "GPU-00000000-0000-0000-0000-000000000001"},
               {"memory_total_mib", 23034},
               {"memory_used_mib", 1024},
               {"utilization_percent", util},
               {"temperature_c", 41}}}}}}};
}

net::HttpResponse api(CoordinatorHarness& h, const std::string& method, const std::string& path,
                      std::map<std::string, std::string> headers, const std::string& body = "") {
  net::TlsClientOptions tls;
  tls.ca_pem = slurp(h.state_dir() / "ca.crt");
  net::HttpClient c(tls);
  net::HttpRequest req;
  req.method = method;
  req.url = "https://127.0.0.1:" + std::to_string(h.api_port()) + path;
  req.headers = std::move(headers);
  req.body = body;
  if (!body.empty()) req.headers["Content-Type"] = "application/json";
  auto r = c.request(req);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? *r : net::HttpResponse{};
}

std::map<std::string, std::string> bearer(const std::string& t) {
  return {{"Authorization", "Bearer " + t}};
}

class EventsFeed : public ::testing::Test {
 protected:
  void SetUp() override {
    h_ = std::make_unique<CoordinatorHarness>(dir_.path(), "", "", "  events_heartbeat: 1s\n");
    h_->start();
  }
  TempDir dir_{"events-feed"};
  std::unique_ptr<CoordinatorHarness> h_;
};

}  // namespace

TEST_F(EventsFeed, DeliversAConnectWithin2sAndResumesFromLastEventIdWithoutRepeating) {
  OwnAgent a(*h_, "t1");
  ASSERT_TRUE(a.enrolled());
  EventReader all(*h_, "/v1/events", bearer(h_->admin_token()));
  ASSERT_TRUE(eventually([&] { return all.text().find(": connected") != std::string::npos; }, 5s))
      << all.text();
  EXPECT_EQ(all.status(), 200);
  const auto start = std::chrono::steady_clock::now();
  auto s = a.session({{"agent_id", "agent-1"}, {"agent_version", "9.9"}});
  ASSERT_TRUE(s);
  auto connect = all.wait_for("agent", "connected", true, 2s);
  ASSERT_TRUE(connect) << all.text();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  EXPECT_EQ(connect->data["tenant"], "t1");
  EXPECT_EQ(connect->data["version"], "9.9");

  ASSERT_TRUE(a.send(*s, "health", gpu_sample(10)));
  ASSERT_TRUE(a.send(*s, "event",
                     {{"id", 1},
                      {"kind", "progress"},
                      {"step", "s1"},
                      {"state", "started"},
                      {"time", "2026-12-01T00:00:01Z"}}));
  auto health = all.wait_for("health", "tenant", "t1");
  ASSERT_TRUE(health) << all.text();
  EXPECT_EQ(health->data["health"]["gpu"]["gpus"][0]["utilization_percent"], 10);
  auto progress = all.wait_for("progress", "step", "s1");
  ASSERT_TRUE(progress) << all.text();
  EXPECT_EQ(progress->data["state"], "started");
  ASSERT_TRUE(all.wait_for("phase", "phase", "provisioning")) << all.text();
  ASSERT_TRUE(a.send(*s, "health", gpu_sample(55)));
  ASSERT_TRUE(eventually([&] {
    for (auto& e : all.events())
      if (e.type == "health" && e.data["health"]["gpu"]["gpus"][0]["utilization_percent"] == 55)
        return true;
    return false;
  }));
  // Every event has an id, and they grow.
  auto seen = all.events();
  std::uint64_t prev = 0;
  for (auto& e : seen) {
    ASSERT_FALSE(e.id.empty()) << e.type;
    EXPECT_GT(std::stoull(e.id), prev);
    prev = std::stoull(e.id);
  }
  // A reader that got the connect resumes after it: the rest, nothing twice.
  EventReader resumed(
      *h_, "/v1/events",
      {{"Authorization", "Bearer " + h_->admin_token()}, {"Last-Event-ID", connect->id}});
  std::vector<std::string> want;
  for (auto& e : seen)
    if (std::stoull(e.id) > std::stoull(connect->id)) want.push_back(e.id);
  ASSERT_FALSE(want.empty());
  ASSERT_TRUE(eventually([&] { return resumed.events().size() >= want.size(); }, 5s))
      << resumed.text();
  std::vector<std::string> got;
  for (auto& e : resumed.events()) got.push_back(e.id);
  EXPECT_EQ(got, want);
  // A heartbeat comes every api.events_heartbeat (1 s here).
  ASSERT_TRUE(eventually([&] { return all.text().find(": heartbeat ") != std::string::npos; }, 5s));
  // The agent goes: a disconnect.
  s.reset();
  ASSERT_TRUE(all.wait_for("agent", "connected", false)) << all.text();
}

TEST_F(EventsFeed, TenantFilterAndBadLastEventId) {
  OwnAgent a(*h_, "t1"), b(*h_, "t2");
  EventReader only_t2(*h_, "/v1/events?tenant=t2", bearer(h_->admin_token()));
  ASSERT_TRUE(eventually([&] { return only_t2.status() == 200; }, 5s));
  auto sa = a.session();
  auto sb = b.session();
  ASSERT_TRUE(sa && sb);
  ASSERT_TRUE(only_t2.wait_for("agent", "tenant", "t2"));
  ASSERT_TRUE(a.send(*sa, "health", gpu_sample(1)));
  ASSERT_TRUE(b.send(*sb, "health", gpu_sample(2)));
  ASSERT_TRUE(only_t2.wait_for("health", "tenant", "t2"));
  for (auto& e : only_t2.events()) EXPECT_EQ(e.data["tenant"], "t2") << e.type;
  auto bad = api(*h_, "GET", "/v1/events",
                 {{"Authorization", "Bearer " + h_->admin_token()}, {"Last-Event-ID", "soon"}});
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_EQ(api(*h_, "GET", "/v1/events", {}).status, 401);
}

TEST_F(EventsFeed, ReadOnlyTokensReadTheFeedAndChangeNothing) {
  auto made = h_->factory({"token", "create", "--read-only", "-o", "json"});
  ASSERT_EQ(made.exit_code, 0) << made.output;
  auto j = json::parse(made.output.substr(made.output.find('{')));
  const std::string ro = j["token"];
  EXPECT_EQ(j["access"], "read-only");
  EXPECT_EQ(slurp(h_->state_dir() / "api-tokens.json").find(ro), std::string::npos);
  EXPECT_EQ(api(*h_, "GET", "/v1/tenants", bearer(ro)).status, 200);
  EXPECT_EQ(api(*h_, "GET", "/metrics", bearer(ro)).status, 200);
  EXPECT_EQ(api(*h_, "POST", "/v1/tokens", bearer(ro), R"({"tenant":"x"})").status, 403);
  EXPECT_EQ(api(*h_, "POST", "/v1/api-tokens", bearer(ro), "{}").status, 403);
  EXPECT_EQ(api(*h_, "GET", "/v1/tokens", bearer(ro)).status, 403);
  EXPECT_EQ(api(*h_, "DELETE", "/v1/tenants/x", bearer(ro)).status, 403);
  EventReader stream(*h_, "/v1/events", bearer(ro));
  ASSERT_TRUE(eventually([&] { return stream.text().find(": connected") != std::string::npos; }));
  // `factory status` works with it; a change does not.
  auto ro_file = dir_.path() / "ro.token";
  ASSERT_TRUE(factory::write_file_atomic(ro_file, ro + "\n", 0600).ok());
  auto st = h_->factory({"status", "--token-file", ro_file.string()});
  EXPECT_EQ(st.exit_code, 0) << st.output;
  auto no = h_->factory({"token", "create", "--tenant", "x", "--token-file", ro_file.string()});
  EXPECT_EQ(no.exit_code, 1) << no.output;
  EXPECT_NE(no.output.find("needs the admin token"), std::string::npos) << no.output;
  // It survives a restart (stored hashed in the state directory).
  h_->stop();
  h_->start();
  EXPECT_EQ(api(*h_, "GET", "/v1/tenants", bearer(ro)).status, 200);
  auto usage = h_->factory({"token", "create"});
  EXPECT_EQ(usage.exit_code, 2) << usage.output;
}

TEST_F(EventsFeed, TheDashboardSignsInForAStrictCookieAndTheStreamChecksOrigin) {
  auto page = api(*h_, "GET", "/", {});
  EXPECT_EQ(page.status, 200);
  EXPECT_EQ(page.headers["content-type"].rfind("text/html", 0), 0u);
  EXPECT_NE(page.headers["content-security-policy"].find("script-src 'self'"), std::string::npos);
  EXPECT_EQ(api(*h_, "GET", "/dashboard/app.js", {}).status, 200);
  const std::string host = "127.0.0.1:" + std::to_string(h_->api_port());
  EXPECT_EQ(api(*h_, "POST", "/v1/session", {{"Origin", "https://evil.example"}},
                json{{"token", h_->admin_token()}}.dump())
                .status,
            403);
  EXPECT_EQ(api(*h_, "POST", "/v1/session", {}, R"({"token":"wrong"})").status, 401);
  auto in = api(*h_, "POST", "/v1/session", {{"Origin", "https://" + host}},
                json{{"token", h_->admin_token()}}.dump());
  ASSERT_EQ(in.status, 200) << in.body;
  const std::string set = in.headers["set-cookie"];
  for (const char* attr : {"HttpOnly", "Secure", "SameSite=Strict"})
    EXPECT_NE(set.find(attr), std::string::npos) << set;
  const std::string cookie = set.substr(0, set.find(';'));
  EXPECT_EQ(api(*h_, "GET", "/v1/tenants", {{"Cookie", cookie}}).status, 200);
  EXPECT_EQ(api(*h_, "POST", "/v1/tokens", {{"Cookie", cookie}}, R"({"tenant":"x"})").status, 403)
      << "a session opened with the admin token still only reads";
  EXPECT_EQ(api(*h_, "GET", "/v1/events", {{"Cookie", cookie}, {"Origin", "https://evil.example"}})
                .status,
            403);
  EventReader ok(*h_, "/v1/events", {{"Cookie", cookie}, {"Origin", "https://" + host}});
  ASSERT_TRUE(eventually([&] { return ok.text().find(": connected") != std::string::npos; }));
  EXPECT_EQ(api(*h_, "DELETE", "/v1/session", {{"Cookie", cookie}}).status, 200);
  EXPECT_EQ(api(*h_, "GET", "/v1/tenants", {{"Cookie", cookie}}).status, 401);
}

TEST_F(EventsFeed, StatusWatchRedrawsOnEvents) {
  OwnAgent a(*h_, "t1");
  ASSERT_TRUE(a.enrolled());
  std::vector<std::string> argv = {FACTORY_BIN, "--config", h_->config_path().string(), "status",
                                   "--watch"};
  Process watch(argv, dir_.path() / "watch.log", h_->env());
  ASSERT_TRUE(eventually(
      [&] { return slurp(dir_.path() / "watch.log").find("TENANT") != std::string::npos; }, 10s))
      << slurp(dir_.path() / "watch.log");
  auto s = a.session();
  ASSERT_TRUE(s);
  ASSERT_TRUE(a.send(*s, "health", gpu_sample(77)));
  ASSERT_TRUE(eventually(
      [&] { return slurp(dir_.path() / "watch.log").find("77%") != std::string::npos; }, 10s))
      << slurp(dir_.path() / "watch.log");
  const std::string out = slurp(dir_.path() / "watch.log");
  EXPECT_EQ(out.find("TENANT"), out.rfind("TENANT")) << "the header once, then changed rows\n"
                                                     << out;
  EXPECT_EQ(out.find("\x1b["), std::string::npos) << "no screen control into a file";
  watch.stop();
}
