// Issue 10: a slow cluster slows only the commands that need it. The fake
// Kubernetes API server (tests/fakes/kube_apiserver.py) is stopped with
// SIGSTOP for 60 s, as a hung kube-apiserver would be: its socket still
// accepts, nothing answers. Meanwhile `tenant show` (which asks the cluster
// for the VM) loops, and `factory status` (which does not) must answer in
// under a second every time, and the tenant's agent must stay connected:
// the coordinator's io threads never wait on Kubernetes.
#include <signal.h>

#include <atomic>
#include <thread>

#include "tests/integration/tenant_fixture.hpp"

using namespace factory::testing;
using Clock = std::chrono::steady_clock;

TEST_F(Tenants, AStoppedClusterSlowsOnlyTheCommandsThatNeedIt) {
  allowlist();
  auto& h = coordinator();
  auto created = create("tenant-1", "gpu-vm");
  ASSERT_EQ(created.exit_code, 0) << created.output;
  // The guest boots (as in tenants_wait_test): the real agent with the token
  // the coordinator wrote into the tenant's Secret.
  json ud = live_user_data(kube_, "tenant-1");
  AgentProcess agent(h, bootstrap_token_in(ud, h), on_empty_guest(dir_.path()));
  ASSERT_TRUE(eventually([&] { return h.agent_connected("tenant-1"); }, 20s)) << agent.log();
  const std::string since = (*h.tenant("tenant-1"))["agent"].value("connected_since", "");
  auto before = h.factory({"tenant", "show", "tenant-1"});
  ASSERT_EQ(before.exit_code, 0) << before.output;

  ASSERT_EQ(::kill(kube_.pid(), SIGSTOP), 0);
  struct Resume {
    int pid;
    ~Resume() { ::kill(pid, SIGCONT); }
  } resume{kube_.pid()};

  std::atomic<bool> stop{false};
  std::atomic<int> shows{0};
  std::vector<std::thread> loops;
  for (int i = 0; i < 3; ++i)
    loops.emplace_back([&] {
      while (!stop) {
        (void)h.factory({"tenant", "show", "tenant-1"}, 120s);
        ++shows;
      }
    });
  std::chrono::milliseconds slowest{0};
  int answered = 0;
  const auto end = Clock::now() + 60s;
  while (Clock::now() < end) {
    auto t0 = Clock::now();
    auto r = h.factory({"status"}, 10s);
    auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
    slowest = std::max(slowest, took);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("tenant-1"), std::string::npos) << r.output;
    EXPECT_LT(took, 1000ms) << "factory status waited on the stopped cluster";
    ++answered;
    std::this_thread::sleep_for(std::chrono::milliseconds(1000) - std::min(took, 1000ms));
  }
  ::kill(kube_.pid(), SIGCONT);
  stop = true;
  for (auto& t : loops) t.join();
  std::cout << "[ figures  ] cluster stopped 60 s: " << answered << " x factory status, slowest "
            << slowest.count() << " ms; " << shows.load() << " tenant show meanwhile\n";

  auto t = h.tenant("tenant-1");
  ASSERT_TRUE(t);
  EXPECT_TRUE((*t)["agent"].value("connected", false)) << t->dump(2);
  EXPECT_EQ((*t)["agent"].value("connected_since", ""), since) << "the agent was never dropped";
  EXPECT_EQ(agent.log().find("reconnecting"), std::string::npos) << agent.log();
  EXPECT_EQ(h.log().find("stopped answering pings"), std::string::npos) << h.log();
  // The cluster is back: so is the VM in `tenant show`.
  EXPECT_TRUE(eventually(
      [&] {
        auto r = h.factory({"tenant", "show", "tenant-1", "-o", "json"});
        auto j = json::parse(r.output, nullptr, false);
        return r.exit_code == 0 && !j.is_discarded() && j.contains("vm") &&
               !j["vm"].contains("error");
      },
      30s));
}
