// `factory tenant create --wait` and `tenant retry` with the real agent:
// plan dispatch from the catalog, the agent's progress shown live, its
// failure reported with the diagnosis, the retry command delivered. The
// cluster is the fake API server (see tenants_test.cpp).
#include "contract/catalog.hpp"
#include "tests/integration/tenant_fixture.hpp"

using namespace factory::testing;

// The VM "boots": the test plays the guest's first boot by starting the real
// factory-agent with the token and CA the coordinator wrote into the tenant's
// Secret, on an empty guest root (no NVIDIA function on its PCI bus, as when
// the host never passed the card). STANDS IN FOR the VM the fake KubeVirt
// cannot boot; the plan, its failure and the retry are the real agent's.
TEST_F(Tenants, CreateWaitFollowsTheAgentsPlanToItsFailureAndRetryReachesTheAgent) {
  allowlist();
  auto& h = coordinator();
  Process waiter({factory_bin(), "--config", h.config_path().string(), "tenant", "create",
                  "tenant-1", "--tier", "gpu-vm", "--ssh-key", key_file_.string(), "--wait",
                  "--timeout", "60s", "--poll", "1s"},
                 dir_ / "create-wait.log");
  json ud;
  ASSERT_TRUE(eventually(
      [&] {
        json s = kube_.get("/api/v1/namespaces/tenants/secrets/tenant-1-cloud-init");
        if (!s.is_object() || !s.contains("data")) return false;
        ud = live_user_data(kube_, "tenant-1");
        return true;
      },
      20s))
      << slurp(dir_ / "create-wait.log") << h.log();
  EXPECT_EQ(write_file_content(ud, "/etc/factory/ca.crt"), slurp(h.state_dir() / "ca.crt"));
  AgentProcess agent(h, bootstrap_token_in(ud, h), on_empty_guest(dir_.path()));

  ASSERT_TRUE(eventually([&] { return !waiter.running(); }, 60s))
      << slurp(dir_ / "create-wait.log") << agent.log();
  EXPECT_EQ(waiter.wait(), 1) << slurp(dir_ / "create-wait.log");
  const std::string out = slurp(dir_ / "create-wait.log");
  for (const std::string want :
       {"tenant tenant-1 created: tier gpu-vm", "tenant-1: VM: ", "tenant-1: agent connected",
        "tenant-1: step gpu-present: failed", "tenant-1: phase failed",
        "tenant-1: fix the cause, then: factory tenant retry tenant-1 --step gpu-present",
        "factory: tenant tenant-1 failed at step gpu-present"})
    EXPECT_NE(out.find(want), std::string::npos) << "want '" << want << "' in:\n" << out;

  // The agent was sent the catalog's plan for its tier, content-addressed.
  auto cat = factory::catalog::builtin();
  ASSERT_TRUE(cat.ok());
  json t = show("tenant-1");
  EXPECT_EQ(t["plan"].value("hash", ""), factory::catalog::plan_hash(cat->find("gpu-vm")->plan()))
      << t.dump(2);
  EXPECT_EQ(t["plan_steps"][0]["state"], "failed");

  auto started = [&] {
    int n = 0;
    for (const auto& e : h.stored_events("tenant-1"))
      if (e["event"].value("kind", "") == "progress" &&
          e["event"].value("step", "") == "gpu-present" &&
          e["event"].value("state", "") == "started")
        ++n;
    return n;
  };
  const int before = started();
  EXPECT_GE(before, 1);
  auto unknown = h.factory({"tenant", "retry", "tenant-1", "--step", "nvidia-drivers"});
  expect_one_line_failure(unknown, "has no step 'nvidia-drivers'");
  auto r = h.factory({"tenant", "retry", "tenant-1", "--step", "gpu-present"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(eventually([&] { return started() > before; }, 20s)) << agent.log();
}
