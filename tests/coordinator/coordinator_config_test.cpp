#include "coordinator/config/coordinator_config.hpp"

#include <gtest/gtest.h>

#include <fstream>

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
  EXPECT_EQ(c->agent_upgrade_grace, std::chrono::minutes(5));
  auto p = dir.path() / "c.yaml";
  std::ofstream(p) << "agents:\n  upgrade_grace: 30s\n";
  auto set = coordinator::load_coordinator_config(p.string(), true);
  ASSERT_TRUE(set.ok()) << set.error().message;
  EXPECT_EQ(set->agent_upgrade_grace, std::chrono::seconds(30));
}

TEST(CoordinatorConfig, ReadsKeysAndRefusesUnknownOnes) {
  TempDir dir("cfg");
  auto p = dir.path() / "c.yaml";
  {
    std::ofstream f(p);
    f << "state_dir: /tmp/x\nagents:\n  listen: '[::1]:9443'\n  cert_ttl: 2h\napi:\n  listen: "
         "127.0.0.2:9444\n";
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
  EXPECT_FALSE(
      coordinator::load_coordinator_config((dir.path() / "missing.yaml").string(), true).ok());
}

// store: SQLite unless a PostgreSQL URI is given; anything else is refused
// without being repeated (it may hold a password).
TEST(CoordinatorConfig, StoreIsSqliteUnlessAPostgresUri) {
  TempDir dir("cfg");
  auto p = dir.path() / "c.yaml";
  auto c = coordinator::load_coordinator_config(p.string(), false);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->store, "");
  for (std::string uri : {"postgres://factory@db.example:5432/factory",
                          "postgresql://factory:pw@10.0.0.5/factory?sslmode=verify-full"}) {
    std::ofstream(p) << "store: '" << uri << "'\n";
    c = coordinator::load_coordinator_config(p.string(), true);
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_EQ(c->store, uri);
  }
  std::ofstream(p) << "store: 'host=db password=hunter2-secret'\n";
  c = coordinator::load_coordinator_config(p.string(), true);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().code, Errc::invalid_argument);
  EXPECT_NE(c.error().message.find("store"), std::string::npos) << c.error().message;
  EXPECT_NE(c.error().message.find("postgres://"), std::string::npos) << c.error().message;
  EXPECT_EQ(c.error().message.find("hunter2"), std::string::npos) << c.error().message;
}

// tenants.source and leader_election: off by default, checked when set.
TEST(CoordinatorConfig, TenantsSourceAndLeaderElection) {
  TempDir dir("cfg");
  auto p = dir.path() / "c.yaml";
  auto c = coordinator::load_coordinator_config(p.string(), false);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->tenants_source, "coordinator");
  EXPECT_FALSE(c->tenants_from_kubernetes());
  EXPECT_FALSE(c->leader_election.enabled);
  EXPECT_EQ(c->leader_election.lease, "factory-coordinator");
  EXPECT_FALSE(c->leader_election.identity.empty());
  EXPECT_FALSE(c->leader_election.ns.empty());

  std::ofstream(p) << "kube:\n  namespace: gpu\ntenants:\n  source: kubernetes\n"
                      "leader_election:\n  enabled: true\n  identity: pod-a\n"
                      "  lease_duration: 12s\n";
  c = coordinator::load_coordinator_config(p.string(), true);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_TRUE(c->tenants_from_kubernetes());
  EXPECT_TRUE(c->leader_election.enabled);
  EXPECT_EQ(c->leader_election.identity, "pod-a");
  EXPECT_EQ(c->leader_election.lease_duration, std::chrono::seconds(12));
  if (!std::getenv("POD_NAMESPACE")) {
    EXPECT_EQ(c->leader_election.ns, "gpu");
  }

  auto refused = [&](const std::string& yaml, const std::string& needle) {
    std::ofstream(p) << yaml;
    auto r = coordinator::load_coordinator_config(p.string(), true);
    ASSERT_FALSE(r.ok()) << yaml;
    EXPECT_NE(r.error().message.find(needle), std::string::npos) << r.error().message;
  };
  refused("tenants:\n  source: git\n", "want coordinator or kubernetes");
  refused("provider: qemu\ntenants:\n  source: kubernetes\n", "provider: kubevirt");
  refused("provider: qemu\nleader_election:\n  enabled: true\n", "provider: kubevirt");
  refused("leader_election:\n  lease_duration: 5s\n  renew_deadline: 7s\n", "lease_duration");
}

// docs/usage.md: how often the leader looks at each VM, and the projects'
// GPU quotas, each name and number checked at load.
TEST(CoordinatorConfig, UsageAndProjectQuotas) {
  TempDir dir("cfg");
  auto p = dir.path() / "c.yaml";
  auto c = coordinator::load_coordinator_config(p.string(), false);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->usage_observe_every, std::chrono::seconds(15));
  EXPECT_TRUE(c->project_gpu_quotas.empty()) << "no limits by default";

  std::ofstream(p) << "usage:\n  observe_every: 5s\nquotas:\n  projects:\n    ml:\n      gpus:\n"
                      "        nvidia.com/GH100_H200: 4\n        nvidia.com/AD104GL_L4: 0\n"
                      "    research:\n";
  c = coordinator::load_coordinator_config(p.string(), true);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->usage_observe_every, std::chrono::seconds(5));
  EXPECT_EQ(c->project_gpu_quotas.at("ml").at("nvidia.com/GH100_H200"), 4);
  EXPECT_EQ(c->project_gpu_quotas.at("ml").at("nvidia.com/AD104GL_L4"), 0);
  EXPECT_FALSE(c->project_gpu_quotas.count("research"));

  auto refused = [&](const std::string& yaml, const std::string& needle) {
    std::ofstream(p) << yaml;
    auto r = coordinator::load_coordinator_config(p.string(), true);
    ASSERT_FALSE(r.ok()) << yaml;
    EXPECT_NE(r.error().message.find(needle), std::string::npos) << r.error().message;
  };
  refused("usage:\n  observe_every: 0s\n", "1s to 5m");
  refused("usage:\n  every: 5s\n", "every");
  refused("quotas:\n  projects:\n    ML:\n      gpus: {}\n", "not a project name");
  refused("quotas:\n  projects:\n    ml:\n      cpus: {}\n", "unknown key 'cpus'");
  refused("quotas:\n  projects:\n    ml:\n      gpus:\n        h200: 4\n", "not a card model");
  refused("quotas:\n  projects:\n    ml:\n      gpus:\n        nvidia.com/X: -1\n", "whole number");
  refused("quotas:\n  limits: {}\n", "limits");
}

TEST(Router, MatchesParamsAndRequiresTheToken) {
  WorkerPool workers(1);
  coordinator::ApiRouter r("secret-token-secret-token-secret-token", workers);
  r.add("GET", "/v1/tenants/{name}",
        [](const net::HttpRequestIn&, const coordinator::PathParams& p) {
          return net::HttpResponseOut::json(200, p.at("name"));
        });
  r.add("GET", "/healthz", [](auto&, auto&) { return net::HttpResponseOut::json(200, "ok"); },
        {.public_route = true});
  net::HttpRequestIn req;
  req.method = "GET";
  req.target = req.path = "/v1/tenants/t1";
  EXPECT_EQ(r.handle_now(req, {}).status, 401);
  req.headers["authorization"] = "Bearer secret-token-secret-token-secret-token";
  auto out = r.handle_now(req, {});
  EXPECT_EQ(out.status, 200);
  EXPECT_EQ(out.body, "t1");
  req.method = "DELETE";
  EXPECT_EQ(r.handle_now(req, {}).status, 405);
  req.method = "GET";
  req.target = req.path = "/v1/nothing";
  EXPECT_EQ(r.handle_now(req, {}).status, 404);
  net::HttpRequestIn h;
  h.method = "GET";
  h.target = h.path = "/healthz";
  EXPECT_EQ(r.handle_now(h, {}).status, 200);
}

TEST(StatusProjection, EventsDriveThePhase) {
  store::TenantRecord t;
  t.name = "t1";
  t.phase = "enrolled";
  // The projection sees events as the decoder made them.
  auto ev = [](nlohmann::json j) {
    j["id"] = 1;
    auto d = coordinator::decode_event(j);
    EXPECT_TRUE(d.value) << d.refusal;
    return *d.value;
  };
  EXPECT_TRUE(coordinator::project_event(
      t, ev({{"kind", "plan"}, {"state", "running"}, {"plan_hash", "ab12"}})));
  EXPECT_EQ(t.phase, "provisioning");
  EXPECT_EQ(t.status.to_json()["plan"]["hash"], "ab12");
  EXPECT_TRUE(coordinator::project_event(
      t, ev({{"kind", "progress"}, {"step", "nvidia-driver"}, {"state", "reboot_requested"}})));
  EXPECT_EQ(t.status.to_json()["plan"]["steps"]["nvidia-driver"]["state"], "reboot_requested");
  EXPECT_TRUE(coordinator::project_event(t, ev({{"kind", "plan"}, {"state", "succeeded"}})));
  EXPECT_EQ(t.phase, "ready");
  // Health is state, kept as the tenant's latest sample by the store
  // (put_health), not history in the record: an old agent's health event
  // changes nothing here.
  EXPECT_FALSE(
      coordinator::project_event(t, ev({{"kind", "health"}, {"gpu", {{"source", "nvml"}}}})));
  EXPECT_FALSE(t.status.to_json().contains("health"));
  EXPECT_FALSE(coordinator::project_event(t, ev({{"kind", "synthetic"}})));
}

TEST(CoordinatorConfig, QuotasAndMetricsHaveDefaultsAndRanges) {
  TempDir dir("cfg");
  auto c = coordinator::load_coordinator_config((dir.path() / "absent.yaml").string(), false);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->quota_events_per_second, 250);
  EXPECT_EQ(c->quota_event_burst, 500);
  EXPECT_EQ(c->quota_bytes_per_day, 32u << 20);
  EXPECT_EQ(c->quota_max_events_stored, 10000u);
  EXPECT_EQ(c->quota_max_event_age, std::chrono::hours(24 * 90));
  EXPECT_FALSE(c->metrics_public);
  EXPECT_EQ(c->events_heartbeat, std::chrono::seconds(15));

  auto p = dir.path() / "c.yaml";
  auto load = [&](const std::string& text) {
    std::ofstream(p) << text;
    return coordinator::load_coordinator_config(p.string(), true);
  };
  c = load(
      "agents:\n  quota:\n    events_per_second: 20\n    event_burst: 40\n    bytes_per_day: "
      "1Gi\n    max_events_stored: 50\n    max_event_age: 7d\napi:\n  metrics_public: true\n"
      "  events_heartbeat: 5s\n");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->quota_events_per_second, 20);
  EXPECT_EQ(c->quota_event_burst, 40);
  EXPECT_EQ(c->quota_bytes_per_day, 1ull << 30);
  EXPECT_EQ(c->quota_max_events_stored, 50u);
  EXPECT_EQ(c->quota_max_event_age, std::chrono::hours(24 * 7));
  EXPECT_TRUE(c->metrics_public);
  EXPECT_EQ(c->events_heartbeat, std::chrono::seconds(5));
  EXPECT_EQ(load("agents:\n  quota:\n    bytes_per_day: 33554432\n")->quota_bytes_per_day,
            32u << 20);
  for (auto [text, want] : std::vector<std::pair<std::string, std::string>>{
           {"agents:\n  quota:\n    events_per_second: 0\n", "events_per_second"},
           {"agents:\n  quota:\n    bytes_per_day: 10Ki\n", "at least 1Mi"},
           {"agents:\n  quota:\n    bytes_per_day: lots\n", "byte count"},
           {"agents:\n  quota:\n    max_events_stored: -1\n", "max_events_stored"},
           {"agents:\n  quota:\n    max_event_age: 1m\n", "at least 1h"},
           {"agents:\n  quota:\n    events_per_minute: 5\n",
            "unknown key 'agents.quota.events_per_minute'"},
           {"agents:\n  lisen: x\n", "unknown key 'agents.lisen'"},
           {"api:\n  metrics_public: yes please\n", "api.metrics_public"},
       }) {
    auto r = load(text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.error().message.find(want), std::string::npos) << r.error().message;
  }
}

TEST(CoordinatorConfig, GuestRangesAvoidAndPool) {
  TempDir dir("cfg");
  auto c = coordinator::load_coordinator_config((dir.path() / "absent.yaml").string(), false);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->guest_ranges_avoid.empty());
  EXPECT_EQ(c->guest_ranges_pool.blocks, ranges::Pool::default_blocks());

  auto p = dir.path() / "c.yaml";
  auto load = [&](const std::string& text) {
    std::ofstream(p) << text;
    return coordinator::load_coordinator_config(p.string(), true);
  };
  c = load(
      "guest_ranges:\n  avoid: [192.168.0.0/16, 'fd00:10::/48']\n  pool: [172.20.0.0/14]\n"
      "  pod_prefix: 17\n  dns_offset: 53\n");
  ASSERT_TRUE(c.ok()) << c.error().message;
  ASSERT_EQ(c->guest_ranges_avoid.size(), 2u);
  EXPECT_EQ(c->guest_ranges_avoid[0].range, "192.168.0.0/16");
  EXPECT_EQ(c->guest_ranges_avoid[0].source, "guest_ranges.avoid in the coordinator config");
  EXPECT_EQ(c->guest_ranges_pool.blocks, std::vector<std::string>{"172.20.0.0/14"});
  EXPECT_EQ(c->guest_ranges_pool.pod_prefix, 17);
  EXPECT_EQ(c->guest_ranges_pool.dns_offset, 53);
  auto err = [&](const std::string& text) {
    auto r = load(text);
    return r.ok() ? std::string("ok") : r.error().message;
  };
  EXPECT_EQ(err("guest_ranges:\n  avoid: [10.0.0.0/33]\n"),
            p.string() + ": guest_ranges.avoid: invalid prefix length in '10.0.0.0/33' (0 to 32)");
  EXPECT_EQ(err("guest_ranges:\n  pool: [10.52.0.0/14, 'fd00::/48']\n"),
            p.string() +
                ": guest_ranges.pool[1]: fd00::/48 is IPv6: the guest cluster is IPv4 "
                "only (RKE2 single-stack)");
  EXPECT_EQ(err("guest_ranges:\n  pod_prefix: 4\n"),
            p.string() + ": guest_ranges.pod_prefix: must be 8 to 28, got 4");
  EXPECT_NE(err("guest_ranges:\n  size: 16\n").find("size"), std::string::npos);
}
