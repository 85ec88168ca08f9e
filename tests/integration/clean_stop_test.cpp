// Clean stops, on the real binaries: a planned stop of the agent (systemd's
// SIGTERM for `systemctl stop` or for a reboot) says so in its websocket
// close frame, so the coordinator shows "stopped" or "rebooting", not a lost
// connection; the step the agent was running is stopped (SIGTERM to its
// process group) and resumes at the next start as its check decides.
//
// The plans come from a catalog of this test's own (script steps), and run
// in a simulated guest (tests/guestsim), whose PATH holds only stand-ins and
// harmless tools: the reboot is the stand-in's, in its `term` mode, which
// stops the agent as systemd does (SIGTERM) instead of killing it.
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <thread>

#include "common/atomic_file.hpp"
#include "tests/guestsim/guest_sim.hpp"
#include "tests/support/coordinator_harness.hpp"

using namespace factory::testing;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

const char* kCatalog = R"(version: 1
tiers:
  - name: reboot-box
    description: One step that asks for a reboot, verified after it.
    vm: {cpu: "2", memory: 2Gi, disk: 10Gi, image: "https://example.invalid/i.img", gpus: 1}
    steps:
      - id: prepare
        kind: script
        params:
          check: test -f "$FACTORY_ROOT/prepared"
          run: touch "$FACTORY_ROOT/prepared"
          verify: test -f "$FACTORY_ROOT/prepared"
          reboot: true
  - name: slow-box
    description: One long step that ends cleanly on SIGTERM and finishes when run again.
    vm: {cpu: "2", memory: 2Gi, disk: 10Gi, image: "https://example.invalid/i.img", gpus: 1}
    steps:
      - id: long
        kind: script
        timeout: 10m
        params:
          check: test -f "$FACTORY_ROOT/long-done"
          # The marker is written by the sleeper itself, after its exec: a
          # SIGTERM sent when the test sees it finds the trap set in the
          # shell and a sleeper with the default disposition. (Written
          # before the fork, the signal could land in bash's child between
          # fork and exec, where bash's trap stub swallows it: the sleeper
          # lived on and the agent waited out the 20 s grace.)
          run: |
            if [ -f "$FACTORY_ROOT/long-term" ]; then
              echo started >> "$FACTORY_ROOT/long-started"
              touch "$FACTORY_ROOT/long-done"
              exit 0
            fi
            trap 'echo term >> "$FACTORY_ROOT/long-term"; exit 143' TERM
            sh -c 'echo started >> "$FACTORY_ROOT/long-started"; exec sleep 300' &
            wait
)";

nlohmann::json agent_of(CoordinatorHarness& h, const std::string& tenant) {
  auto t = h.tenant(tenant);
  return t ? (*t)["agent"] : nlohmann::json::object();
}

// A coordinator serving kCatalog, with tenant `tenant` of `tier` (its record
// written as `factory tenant create` would have left it, without the VM).
struct TenantOfTier {
  TempDir dir{"stop"};
  std::unique_ptr<CoordinatorHarness> h;
  nlohmann::json token;

  TenantOfTier(const std::string& tenant, const std::string& tier) {
    std::ofstream(dir / "catalog.yaml") << kCatalog;
    h = std::make_unique<CoordinatorHarness>(dir.path(),
                                             "catalog: " + (dir / "catalog.yaml").string() + "\n");
    h->start();
    token = h->create_token(tenant);
    if (!tier.empty()) {
      h->stop();
      auto rec = h->stored_record(tenant);
      if (!rec || !rec->contains("tier")) setup_failed("no stored record of tenant " + tenant);
      (*rec)["tier"] = tier;
      h->write_stored_record(*rec);
      h->start();
    }
  }
};

AgentOptions in_guest(const GuestSim& g, std::vector<std::string> extra = {},
                      std::map<std::string, std::string> env = {}) {
  AgentOptions o;
  o.root = g.root();
  o.extra_args = {"--ollama-url", g.ollama_url()};
  o.extra_args.insert(o.extra_args.end(), extra.begin(), extra.end());
  o.env = std::move(env);
  o.env["PATH"] = g.path();
  return o;
}

}  // namespace

TEST(CleanStop, SigtermShowsStoppedWithinASecond) {
  TenantOfTier s("t1", "");
  AgentOptions o;
  o.extra_args = {"--link-only"};
  AgentProcess agent(*s.h, s.token, o);
  ASSERT_TRUE(eventually([&] { return s.h->agent_connected("t1"); }, 10s)) << agent.log();

  auto t0 = std::chrono::steady_clock::now();
  agent.proc().kill(SIGTERM);
  ASSERT_TRUE(
      eventually([&] { return agent_of(*s.h, "t1").value("state", "") == "stopped"; }, 5s, 25ms))
      << agent_of(*s.h, "t1").dump() << "\n"
      << agent.log();
  auto took =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  std::cout << "[ figures  ] shown as stopped " << took.count() << " ms after SIGTERM\n";
  EXPECT_LE(took.count(), 1000) << "the acceptance says: stopped within a second";
  EXPECT_EQ(agent.proc().wait(), 0) << agent.log();
  auto a = agent_of(*s.h, "t1");
  EXPECT_EQ(a.value("disconnect_reason", ""), "stopping");
  auto table = s.h->factory({"status"});
  EXPECT_NE(table.output.find("no: stopped"), std::string::npos) << table.output;

  // A crash is not a stop: it shows as lost.
  agent.restart();
  ASSERT_TRUE(eventually([&] { return s.h->agent_connected("t1"); }, 10s)) << agent.log();
  agent.proc().kill(SIGKILL);
  agent.proc().wait();
  EXPECT_TRUE(eventually([&] { return agent_of(*s.h, "t1").value("state", "") == "lost"; }, 15s))
      << agent_of(*s.h, "t1").dump();
}

TEST(CleanStop, TheRebootAStepAskedForShowsAsRebooting) {
  TenantOfTier s("t1", "reboot-box");
  GuestSim g(s.dir.path());
  AgentProcess agent(*s.h, s.token, in_guest(g, {}, {{"FACTORY_GUESTSIM_REBOOT_KILL", "term"}}));
  // The step asks for the reboot; the stand-in's reboot stops the agent as
  // systemd does, with SIGTERM.
  ASSERT_TRUE(eventually([&] { return !agent.proc().running(); }, 30s)) << agent.log();
  EXPECT_EQ(agent.proc().wait(), 0) << "a clean stop, not the stand-in's SIGKILL\n" << agent.log();
  EXPECT_EQ(g.counter("reboot"), 1);
  EXPECT_TRUE(
      eventually([&] { return agent_of(*s.h, "t1").value("state", "") == "rebooting"; }, 5s))
      << agent_of(*s.h, "t1").dump() << "\n"
      << agent.log();
  EXPECT_EQ(agent_of(*s.h, "t1").value("disconnect_reason", ""), "rebooting");

  // After the boot, as systemd starts it again: the step is verified, not
  // run again, and the plan finishes.
  agent.restart();
  ASSERT_TRUE(eventually(
      [&] {
        auto t = s.h->tenant("t1");
        return t && (*t).value("phase", "") == "ready";
      },
      30s))
      << agent.log();
  EXPECT_EQ(g.counter("reboot"), 1);
  agent.proc().stop();
}

TEST(CleanStop, TheRunningStepIsStoppedAndResumesAfterTheRestart) {
  TenantOfTier s("t1", "slow-box");
  GuestSim g(s.dir.path());
  AgentProcess agent(*s.h, s.token, in_guest(g));
  ASSERT_TRUE(eventually([&] { return fs::exists(g.root() / "long-started"); }, 30s))
      << agent.log();

  auto t0 = std::chrono::steady_clock::now();
  agent.proc().kill(SIGTERM);
  EXPECT_EQ(agent.proc().wait(), 0) << agent.log();
  auto took =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  // The step's shell got SIGTERM (its trap ran) and the agent did not wait
  // for the grace to end it with SIGKILL.
  EXPECT_EQ(slurp(g.root() / "long-term"), "term\n") << agent.log();
  EXPECT_LT(took.count(), 10000) << agent.log();
  EXPECT_TRUE(eventually([&] { return agent_of(*s.h, "t1").value("state", "") == "stopped"; }, 5s));
  // Not failed, not counted as a crash: the journal keeps the step running.
  auto journal = slurp(agent.state_dir() / "plan" / "journal.json");
  EXPECT_NE(journal.find("\"id\":\"long\""), std::string::npos) << journal;
  EXPECT_EQ(journal.find("\"state\":\"failed\""), std::string::npos) << journal;
  EXPECT_NE(journal.find("\"entries\":0"), std::string::npos) << journal;

  agent.restart();
  ASSERT_TRUE(eventually(
      [&] {
        auto t = s.h->tenant("t1");
        return t && (*t).value("phase", "") == "ready";
      },
      30s))
      << agent.log();
  EXPECT_EQ(slurp(g.root() / "long-started"), "started\nstarted\n");
  auto t = s.h->tenant("t1");
  EXPECT_EQ((*t)["plan"]["steps"]["long"].value("state", ""), "succeeded") << t->dump();
  agent.proc().stop();
}
