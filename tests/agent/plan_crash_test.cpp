// The plan engine against interruptions: the agent SIGKILLed inside every
// step and during the reboot, a step that reboots the guest, a reboot that
// never happens, and a step that kills the agent every time.
//
// The agent runs in a fork()ed child that is really SIGKILLed; the parent then
// plays systemd (start the agent again) and the guest (boot), using only what
// a real guest keeps: the files on disk. See tests/agent/plan_fakes.hpp.
#include <gtest/gtest.h>

#include "agent/plan/engine.hpp"
#include "tests/agent/plan_fakes.hpp"

using namespace factory::agent;
using namespace factory::agent::testfakes;
using Outcome = PlanEngine::Outcome;

namespace {

// gpu-vm's shape: a check, a driver that needs a reboot, then two more steps.
json reboot_plan() {
  return plan_of({fake("gpu"), fake("driver", {{"reboot", true}}), fake("ollama"), fake("model")});
}

}  // namespace

TEST(PlanReboot, StepIsVerifiedAfterBootAndNotReapplied) {
  FakeGuest g;
  std::vector<json> events;
  {
    auto e = g.engine(&events);
    EXPECT_EQ(e->run(reboot_plan()), Outcome::rebooting);
    EXPECT_EQ(g.count("reboot-requests"), 1);
    EXPECT_EQ(g.count("check-ollama"), 0);  // nothing after the reboot step runs before the boot
    json st = e->status_json();
    EXPECT_EQ(st["state"], "running");
    EXPECT_EQ(st["steps"][1]["state"], "reboot_requested");
    EXPECT_EQ(st["steps"][1]["reboot_requests"], 1);
  }
  // Journaled with the boot it was requested in, before the reboot ran.
  auto j = PlanJournal::parse(factory::testing::slurp(g.journal_file()));
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(j->steps[1].boot_id, "boot-1");

  g.boot();
  auto e = g.engine(&events);
  EXPECT_EQ(e->resume(), Outcome::succeeded);
  EXPECT_EQ(g.count("apply-driver"), 1);   // not applied again after the boot
  EXPECT_EQ(g.count("verify-driver"), 1);  // verified once, after the boot
  EXPECT_EQ(g.count("check-driver"), 1);
  EXPECT_EQ(g.count("effect-model"), 1);
  EXPECT_EQ(g.boots(), 1);
  EXPECT_EQ(step_trail(events),
            (std::vector<std::string>{"gpu:started", "gpu:succeeded", "driver:started",
                                      "driver:reboot_requested", "driver:started",
                                      "driver:succeeded", "ollama:started", "ollama:succeeded",
                                      "model:started", "model:succeeded"}));
  for (auto& ev : of_kind(events, "progress")) {
    if (ev["step"] == "driver" && ev["state"] == "reboot_requested") {
      EXPECT_EQ(ev["message"], "driver installed; a reboot loads it");
    }
  }
}

TEST(PlanReboot, ARebootThatDoesNotHappenIsRequestedAgainThenFails) {
  FakeGuest g;
  EXPECT_EQ(g.engine()->run(reboot_plan()), Outcome::rebooting);
  // The agent restarts but the boot id is the same: the reboot never happened.
  std::vector<json> events;
  EXPECT_EQ(g.engine(&events)->resume(), Outcome::rebooting);
  EXPECT_EQ(g.count("reboot-requests"), 2);
  EXPECT_EQ(g.count("apply-driver"), 1);  // asked again, not reinstalled
  EXPECT_EQ(g.engine()->resume(), Outcome::rebooting);
  EXPECT_EQ(g.count("reboot-requests"), 3);
  // Bounded: after three requests in one boot it says so and stops.
  auto e = g.engine(&events);
  EXPECT_EQ(e->resume(), Outcome::failed);
  EXPECT_EQ(g.count("reboot-requests"), 3);
  EXPECT_EQ(e->status_json()["steps"][1]["message"],
            "asked the guest to reboot 3 times but it is still in the same boot (boot id boot-1): "
            "restart the "
            "VM from the host, then retry the plan");
  // Once the VM is restarted by hand, retry finishes the plan.
  g.boot();
  auto r = g.engine()->retry();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, Outcome::succeeded);
  EXPECT_EQ(g.count("effect-driver"), 1);
}

TEST(PlanReboot, VerifyFailingAfterBootUsesTheRetries) {
  FakeGuest g;
  json plan = plan_of({fake("driver", {{"reboot", true}}, /*retries=*/1)});
  EXPECT_EQ(g.engine()->run(plan), Outcome::rebooting);
  // The guest boots but the module does not load (as with a BAR the firmware could not map).
  bump_in(g.env.root, "boots");
  std::ofstream(g.env.root / "proc/sys/kernel/random/boot_id") << "boot-other\n";
  std::vector<json> events;
  EXPECT_EQ(g.engine(&events)->resume(),
            Outcome::rebooting);  // retry: apply asks for another reboot
  EXPECT_EQ(g.count("verify-driver"), 1);
  g.boot();
  auto e = g.engine(&events);
  EXPECT_EQ(e->resume(), Outcome::succeeded);
  EXPECT_EQ(g.count("effect-driver"), 1);
  EXPECT_EQ(g.count("reboot-requests"), 2);
  bool saw = false;
  for (auto& ev : of_kind(events, "progress"))
    if (ev["state"] == "progress" && ev.contains("diagnosis")) {
      saw = true;
      EXPECT_EQ(ev["diagnosis"]["code"], "driver_reboot_pending");
    }
  EXPECT_TRUE(saw);
}

TEST(PlanCrash, KillInsideEveryStepThenResumeConverges) {
  const std::vector<std::string> steps = {"gpu", "driver", "ollama", "model"};
  std::vector<std::string> points;
  for (auto& s : steps)
    for (const char* p : {"check", "apply", "apply_after", "verify"}) points.push_back(s + ":" + p);
  points.push_back("reboot");  // after "reboot requested" is journaled, before the reboot happens
  for (auto& point : points) {
    SCOPED_TRACE(point);
    FakeGuest g;
    g.kill_at(point);
    int status = in_child([&] { g.converge(reboot_plan()); });
    ASSERT_TRUE(killed_by_sigkill(status))
        << "the agent was not killed at " << point << " (status " << status << ")";
    ASSERT_FALSE(g.has("kill-at"));

    std::vector<json> events;
    EXPECT_EQ(g.converge(reboot_plan(), &events), Outcome::succeeded);
    for (auto& s : steps) EXPECT_EQ(g.count("effect-" + s), 1) << s;
    EXPECT_EQ(g.boots(), 1) << "the guest rebooted exactly once";
    // Killed between "reboot requested" and the reboot: the restarted agent asks again.
    EXPECT_EQ(g.count("reboot-requests"), point == "reboot" ? 2 : 1);
    EXPECT_EQ(g.engine()->status_json()["state"], "succeeded");
    EXPECT_TRUE(of_kind(events, "journal_reset").empty());
  }
}

TEST(PlanCrash, StepThatKillsTheAgentEveryTimeIsFailedAfterThreeEntries) {
  FakeGuest g;
  g.set("crash-ollama");
  json plan = reboot_plan();
  for (int i = 0; i < 3; ++i) {
    int status = in_child([&] { g.converge(plan); });
    ASSERT_TRUE(killed_by_sigkill(status)) << "run " << i;
  }
  EXPECT_EQ(g.count("apply-ollama"), 3);
  std::vector<json> events;
  auto e = g.engine(&events);
  EXPECT_EQ(e->resume(), Outcome::failed);
  EXPECT_EQ(g.count("apply-ollama"), 3);  // not entered a fourth time
  EXPECT_EQ(e->status_json()["steps"][2]["message"],
            "the agent stopped 3 times while running this step (crash or kill) without finishing "
            "it: marked "
            "failed instead of trying forever; see the agent's log (journalctl -u factory-agent), "
            "fix the "
            "cause, then retry the plan");
  EXPECT_EQ(of_kind(events, "plan").back()["failed_step"], "ollama");
  // Stays failed across restarts: no loop.
  EXPECT_EQ(g.engine()->resume(), Outcome::failed);
  EXPECT_EQ(g.count("apply-ollama"), 3);
  // Fixed, then retried: the plan finishes and nothing before it is redone.
  g.clear("crash-ollama");
  auto r = g.engine()->retry();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, Outcome::succeeded);
  EXPECT_EQ(g.count("effect-driver"), 1);
  EXPECT_EQ(g.count("effect-ollama"), 1);
  EXPECT_EQ(g.boots(), 1);
}

TEST(PlanCrash, JournalParsesAfterEveryKill) {
  // The journal is replaced atomically: after a kill at any point it is whole.
  FakeGuest g;
  for (auto* point : {"gpu:apply", "driver:apply_after", "reboot", "model:verify"}) {
    g.kill_at(point);
    EXPECT_TRUE(killed_by_sigkill(in_child([&] { g.converge(reboot_plan()); }))) << point;
    auto j = PlanJournal::parse(factory::testing::slurp(g.journal_file()));
    EXPECT_TRUE(j.ok()) << point << ": " << (j.ok() ? "" : j.error().message);
  }
}
