#include "coordinator/config/coordinator_config.hpp"

#include <fstream>

#include <gtest/gtest.h>

#include "coordinator/agents/projection.hpp"
#include "coordinator/api/router.hpp"
#include "tests/support/test_support.hpp"

using namespace factory;
using factory::testing::TempDir;

TEST(CoordinatorConfig, DefaultsForEveryKey) {
  TempDir dir("cfg");
  auto c = coordinator::load_coordinator_config((dir.path() / "absent.yaml").string(), false);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->state_dir, "/var/lib/factory");
  EXPECT_EQ(c->agents_listen, "0.0.0.0:8443");
  EXPECT_EQ(c->api_listen, "127.0.0.1:8444");
  EXPECT_EQ(c->api_url(), "https://127.0.0.1:8444");
  EXPECT_EQ(c->external_url.rfind("wss://", 0), 0u);
  EXPECT_EQ(c->token_default_ttl, std::chrono::hours(1));
}

TEST(CoordinatorConfig, ReadsKeysAndRefusesUnknownOnes) {
  TempDir dir("cfg");
  auto p = dir.path() / "c.yaml";
  {
    std::ofstream f(p);
    f << "state_dir: /tmp/x\nagents:\n  listen: '[::1]:9443'\n  cert_ttl: 2h\napi:\n  listen: 127.0.0.2:9444\n";
  }
  auto c = coordinator::load_coordinator_config(p.string(), true);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->external_url, "wss://[::1]:9443");
  EXPECT_EQ(c->agent_cert_ttl, std::chrono::hours(2));
  EXPECT_EQ(c->api_url(), "https://127.0.0.2:9444");
  {
    std::ofstream f(p);
    f << "stat_dir: /tmp/x\n";
  }
  c = coordinator::load_coordinator_config(p.string(), true);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message.find("unknown key 'stat_dir'"), std::string::npos);
  {
    std::ofstream f(p);
    f << "agents:\n  listen: nowhere\n";
  }
  EXPECT_FALSE(coordinator::load_coordinator_config(p.string(), true).ok());
  EXPECT_FALSE(coordinator::load_coordinator_config((dir.path() / "missing.yaml").string(), true).ok());
}

TEST(Router, MatchesParamsAndRequiresTheToken) {
  WorkerPool workers(1);
  coordinator::ApiRouter r("secret-token-secret-token-secret-token", workers);
  r.add("GET", "/v1/tenants/{name}", [](const net::HttpRequestIn&, const coordinator::PathParams& p) {
    return net::HttpResponseOut::json(200, p.at("name"));
  });
  r.add("GET", "/healthz", [](auto&, auto&) { return net::HttpResponseOut::json(200, "ok"); },
        {.public_route = true});
  net::HttpRequestIn req;
  req.method = "GET";
  req.path = "/v1/tenants/t1";
  EXPECT_EQ(r.handle_now(req, {}).status, 401);
  req.headers["authorization"] = "Bearer secret-token-secret-token-secret-token";
  auto out = r.handle_now(req, {});
  EXPECT_EQ(out.status, 200);
  EXPECT_EQ(out.body, "t1");
  req.method = "DELETE";
  EXPECT_EQ(r.handle_now(req, {}).status, 405);
  req.method = "GET";
  req.path = "/v1/nothing";
  EXPECT_EQ(r.handle_now(req, {}).status, 404);
  net::HttpRequestIn h;
  h.method = "GET";
  h.path = "/healthz";
  EXPECT_EQ(r.handle_now(h, {}).status, 200);
}

TEST(StatusProjection, EventsDriveThePhase) {
  store::TenantRecord t;
  t.name = "t1";
  t.phase = "enrolled";
  EXPECT_TRUE(coordinator::project_event(t, {{"kind", "plan"}, {"state", "running"}, {"plan_hash", "h"}}));
  EXPECT_EQ(t.phase, "provisioning");
  EXPECT_TRUE(coordinator::project_event(
      t, {{"kind", "progress"}, {"step", "nvidia-driver"}, {"state", "reboot_requested"}}));
  EXPECT_EQ(t.status["plan"]["steps"]["nvidia-driver"]["state"], "reboot_requested");
  EXPECT_TRUE(coordinator::project_event(t, {{"kind", "plan"}, {"state", "succeeded"}}));
  EXPECT_EQ(t.phase, "ready");
  EXPECT_TRUE(coordinator::project_event(t, {{"kind", "health"}, {"gpu", {{"source", "nvml"}}}}));
  EXPECT_EQ(t.status["health"]["gpu"]["source"], "nvml");
  EXPECT_FALSE(coordinator::project_event(t, {{"kind", "synthetic"}}));
}
