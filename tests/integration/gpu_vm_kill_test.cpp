// The gpu-vm tier run by the real factory-agent binary on the simulated
// runbook guest (tests/guestsim: stand-ins for apt-get, dpkg, dkms, modprobe,
// systemctl, reboot, nvidia-smi and Ollama, answering with captured output),
// with the agent SIGKILLed once inside every step and once right after the
// reboot. Each time the plan converges to done with no effect doubled: each
// package installed once, the guest rebooted once, each model pulled once
// (the stand-ins count).
#include <gtest/gtest.h>
#include <signal.h>

#include <thread>

#include "tests/guestsim/guest_sim.hpp"
#include "tests/support/test_support.hpp"

using namespace factory::testing;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

struct KillPoint {
  std::string name;
  // True when the agent is at the point to be killed.
  std::function<bool(const GuestSim&)> reached;
};

bool called(const GuestSim& g, const std::string& needle, int after_reboots = 0) {
  if (g.counter("reboot") < after_reboots) return false;
  auto log = g.calls_log();
  if (after_reboots == 0) return log.find(needle) != std::string::npos;
  // Only calls made after the reboot: the log marks it.
  auto at = log.rfind("reboot");
  return at != std::string::npos && log.find(needle, at) != std::string::npos;
}

class Agent {
 public:
  Agent(const GuestSim& g, fs::path state, fs::path log)
      : g_(g), state_(std::move(state)), log_(std::move(log)) {}
  Process start() {
    return Process({agent_bin(), "plan", "--tier", "gpu-vm", "--root", g_.root().string(),
                    "--state-dir", state_.string(), "--ollama-url", g_.ollama_url(), "--reboot"},
                   log_, {{"PATH", g_.path()}});
  }

 private:
  const GuestSim& g_;
  fs::path state_, log_;
};

}  // namespace

class GpuVmKill : public ::testing::TestWithParam<int> {};

TEST_P(GpuVmKill, ConvergesWithNoEffectDoubled) {
  const std::vector<KillPoint> points = {
      {"inside gpu-present", [](const GuestSim&) { return true; }},
      {"inside nvidia-driver: apt-get update",
       [](const GuestSim& g) { return called(g, "Lock::Timeout=600 update"); }},
      {"inside nvidia-driver: the driver packages",
       [](const GuestSim& g) { return called(g, "nvidia-headless-open"); }},
      {"during the reboot: first command after boot",
       [](const GuestSim& g) { return g.counter("reboot") >= 1 && called(g, "nvidia-smi", 1); }},
      {"inside ollama: install script", [](const GuestSim& g) { return called(g, "install.sh"); }},
      {"inside ollama: enabling the service",
       [](const GuestSim& g) { return called(g, "systemctl enable"); }},
      {"inside model: pull under way",
       [](const GuestSim& g) { return g.counter("ollama.pull_request.llama3.2:1b") >= 1; }},
  };
  const auto& point = points.at(static_cast<size_t>(GetParam()));
  SCOPED_TRACE(point.name);
  TempDir dir("kill");
  GuestSim g(dir.path());
  g.set_knob("ollama_pull_delay", "0.05");  // a pull of a few seconds, to be caught in the middle
  fs::path state = dir.path() / "agent-state";
  Agent agent(g, state, dir.path() / "agent.log");

  // Run 1: killed at the point (the reboot stand-in also ends the agent, as a
  // real reboot does; then systemd starts it again).
  bool killed = false;
  int runs = 0;
  auto deadline = std::chrono::steady_clock::now() + 120s;
  for (;;) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the plan did not converge\n"
                                                          << slurp(dir.path() / "agent.log");
    ASSERT_LT(++runs, 12) << slurp(dir.path() / "agent.log");
    auto p = agent.start();
    if (!killed) {
      bool hit = eventually([&] { return point.reached(g) || !p.running(); }, 60s, 1ms);
      ASSERT_TRUE(hit);
      if (p.running()) {
        p.kill(SIGKILL);
        killed = true;
      }
      int st = p.wait();
      if (st == 0) break;
      continue;
    }
    int st = p.wait();
    if (st == 0) break;  // plan succeeded
    ASSERT_EQ(st, 128 + SIGKILL) << "only the reboot may end the agent now\n"
                                 << slurp(dir.path() / "agent.log");
  }
  EXPECT_TRUE(killed) << "the kill point was never reached";
  EXPECT_EQ(g.counter("reboot"), 1) << g.counters();
  EXPECT_EQ(g.counter("apt-get.install.nvidia-headless-open"), 1) << g.counters();
  EXPECT_EQ(g.counter("apt-get.install.nvidia-persistenced"), 1) << g.counters();
  EXPECT_EQ(g.counter("ollama.install"), 1) << g.counters();
  EXPECT_EQ(g.counter("ollama.download_complete.llama3.2:1b"), 1) << g.counters();
  // And the guest is what the runbook ends with: checks only, nothing applied.
  auto check = run({agent_bin(), "plan", "--tier", "gpu-vm", "--root", g.root().string(),
                    "--ollama-url", g.ollama_url(), "--check-only", "-o", "json"},
                   60s, {{"PATH", g.path()}});
  EXPECT_EQ(check.exit_code, 0) << check.output;
  EXPECT_NE(check.output.find("\"complete\": true"), std::string::npos) << check.output;
}

INSTANTIATE_TEST_SUITE_P(EveryStep, GpuVmKill, ::testing::Range(0, 7));
