// The gpu-k8s tier run by the real factory-agent binary on the simulated
// runbook tenant-2 guest (tests/guestsim, profile l4-k8s: stand-ins for
// RKE2, kubectl and helm; a SIMULATION), with the agent killed once inside
// each step. It is killed as systemd stops a unit whose main process died:
// the agent and every process it started (the cgroup), here the agent's
// process tree, frozen with SIGSTOP and then SIGKILLed. Each time the plan
// converges to done, with every effect once, or, when a helm was killed in
// the middle of an install, that release cleaned up and installed once more.
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "tests/guestsim/guest_sim.hpp"
#include "tests/support/test_support.hpp"

using namespace factory::testing;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

struct KillPoint {
  std::string name;
  std::function<bool(const GuestSim&)> reached;
};

bool called(const GuestSim& g, const std::string& needle) {
  return g.calls_log().find(needle) != std::string::npos;
}

// Children of each process, from /proc/<pid>/stat.
std::map<int, std::vector<int>> children_by_parent() {
  std::map<int, std::vector<int>> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const auto name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "stat");
    std::string stat;
    std::getline(in, stat);
    auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    char state;
    int ppid = 0;
    rest >> state >> ppid;
    out[ppid].push_back(std::stoi(name));
  }
  return out;
}

// What systemd does to a unit whose main process died: every process in
// its cgroup is killed. Freeze the tree first so nothing escapes, then kill.
void kill_tree(int root) {
  std::set<int> frozen = {root};
  ::kill(root, SIGSTOP);
  for (bool grew = true; grew;) {
    grew = false;
    auto kids = children_by_parent();
    for (int p : std::vector<int>(frozen.begin(), frozen.end()))
      for (int c : kids[p])
        if (frozen.insert(c).second) {
          ::kill(c, SIGSTOP);
          grew = true;
        }
  }
  for (int p : frozen) ::kill(p, SIGKILL);
}

}  // namespace

class GpuK8sKill : public ::testing::TestWithParam<int> {};

TEST_P(GpuK8sKill, ConvergesWithNoEffectDoubled) {
  const std::vector<KillPoint> points = {
      {"inside rke2: the install script",
       [](const GuestSim& g) { return called(g, "get.rke2.io"); }},
      {"inside rke2: waiting for the node",
       [](const GuestSim& g) { return called(g, "enable --now rke2-server"); }},
      {"inside gpu-operator: installing helm",
       [](const GuestSim& g) { return called(g, "helm-v3.19.0-linux-amd64.tar.gz"); }},
      {"inside gpu-operator: helm upgrade under way",
       [](const GuestSim& g) { return g.counter("helm.install.gpu-operator") >= 1; }},
      {"inside label-gpu-node", [](const GuestSim& g) { return called(g, "label node"); }},
      {"inside hami: helm upgrade under way",
       [](const GuestSim& g) { return g.counter("helm.install.hami") >= 1; }},
  };
  const int at = GetParam();
  const auto& point = points.at(static_cast<size_t>(at));
  SCOPED_TRACE(point.name);
  TempDir dir("k8skill");
  GuestSim g(dir.path(), {"l4-k8s", 0});
  g.set_knob("helm_install_delay", "1");  // a helm install lasts a second: caught in the middle
  fs::path state = dir.path() / "agent-state";
  fs::path log = dir.path() / "agent.log";
  auto start = [&] {
    return Process({agent_bin(), "plan", "--tier", "gpu-k8s", "--root", g.root().string(),
                    "--state-dir", state.string()},
                   log, {{"PATH", g.path()}});
  };

  // Run 1: killed at the point.
  auto first = start();
  ASSERT_TRUE(eventually([&] { return point.reached(g) || !first.running(); }, 60s, 1ms));
  bool killed = first.running();
  if (killed) kill_tree(first.pid());
  first.wait();
  ASSERT_TRUE(killed) << "the plan finished before the kill point\n" << slurp(log);

  // Run 2: systemd starts it again; it finishes the plan.
  auto second = start();
  ASSERT_TRUE(eventually([&] { return !second.running(); }, 120s, 10ms)) << slurp(log);
  ASSERT_EQ(second.wait(), 0) << slurp(log);

  EXPECT_EQ(g.counter("rke2.install"), 1) << g.counters();
  EXPECT_EQ(g.counter("curl.helm-v3.19.0-linux-amd64.tar.gz"), 1) << g.counters();
  // Enabling is idempotent: run again when the kill came before the node was Ready.
  EXPECT_LE(g.counter("systemctl.enable.rke2-server"), at <= 1 ? 2 : 1) << g.counters();
  // A helm killed mid-install leaves pending-install: no helm runs any more,
  // so the agent uninstalls it and installs again.
  EXPECT_EQ(g.counter("helm.install.gpu-operator"), at == 3 ? 2 : 1) << g.counters();
  EXPECT_EQ(g.counter("helm.uninstall.gpu-operator"), at == 3 ? 1 : 0) << g.counters();
  EXPECT_EQ(g.counter("helm.install.hami"), at == 5 ? 2 : 1) << g.counters();
  EXPECT_EQ(g.counter("helm.uninstall.hami"), at == 5 ? 1 : 0) << g.counters();
  EXPECT_LE(g.counter("kubectl.label"), at == 4 ? 2 : 1) << g.counters();

  // The guest is where the runbook ends: checks only, nothing applied.
  auto check = run({agent_bin(), "plan", "--tier", "gpu-k8s", "--root", g.root().string(),
                    "--check-only", "-o", "json"},
                   60s, {{"PATH", g.path()}});
  EXPECT_EQ(check.exit_code, 0) << check.output;
  EXPECT_NE(check.output.find("\"complete\": true"), std::string::npos) << check.output;
}

INSTANTIATE_TEST_SUITE_P(EveryStep, GpuK8sKill, ::testing::Range(0, 6));
