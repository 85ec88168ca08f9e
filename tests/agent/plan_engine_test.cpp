// The plan engine on a simulated guest (tests/agent/plan_fakes.hpp): order of
// steps, check/apply/verify, retries, failures with their tail and diagnosis,
// events, finished plans not re-run, new plans, corrupt journals, retry.
#include <gtest/gtest.h>

#include <fstream>

#include "agent/plan/engine.hpp"
#include "contract/catalog.hpp"
#include "tests/agent/plan_fakes.hpp"

using namespace factory::agent;
using namespace factory::agent::testfakes;
using Outcome = PlanEngine::Outcome;

namespace {
json abc_plan() {
  return plan_of({fake("a"), fake("b"), fake("c")});
}
}  // namespace

TEST(PlanEngine, RunsEveryStepOnceInOrderAndReports) {
  FakeGuest g;
  std::vector<json> events;
  auto e = g.engine(&events);
  EXPECT_EQ(e->run(abc_plan()), Outcome::succeeded);
  for (const char* s : {"a", "b", "c"}) {
    EXPECT_EQ(g.count(std::string("check-") + s), 1) << s;
    EXPECT_EQ(g.count(std::string("apply-") + s), 1) << s;
    EXPECT_EQ(g.count(std::string("verify-") + s), 1) << s;
  }
  EXPECT_EQ(step_trail(events),
            (std::vector<std::string>{"a:started", "a:succeeded", "b:started", "b:succeeded",
                                      "c:started", "c:succeeded"}));
  std::string hash = factory::catalog::plan_hash(abc_plan());
  auto plans = of_kind(events, "plan");
  ASSERT_EQ(plans.size(), 2u);
  EXPECT_EQ(plans[0], json({{"kind", "plan"},
                            {"plan_hash", hash},
                            {"tier", "test-tier"},
                            {"state", "running"},
                            {"steps_total", 3},
                            {"steps_done", 0}}));
  EXPECT_EQ(plans[1]["state"], "succeeded");
  EXPECT_EQ(plans[1]["steps_done"], 3);
  auto progress = of_kind(events, "progress");
  EXPECT_EQ(progress[1], json({{"kind", "progress"},
                               {"plan_hash", hash},
                               {"step", "a"},
                               {"state", "succeeded"},
                               {"attempt", 1},
                               {"message", "verified a"}}));

  json st = e->status_json();
  EXPECT_EQ(st["state"], "succeeded");
  EXPECT_EQ(st["plan_hash"], hash);
  EXPECT_EQ(st["tier"], "test-tier");
  EXPECT_EQ(st["steps_done"], 3);
  EXPECT_EQ(st["steps"][1]["id"], "b");
  EXPECT_EQ(st["steps"][1]["state"], "succeeded");
  EXPECT_EQ(st["steps"][1]["attempts"], 1);
  EXPECT_EQ(st["steps"][1]["skipped"], false);
}

TEST(PlanEngine, FinishedPlanIsNotRunAgain) {
  FakeGuest g;
  ASSERT_EQ(g.engine()->run(abc_plan()), Outcome::succeeded);
  // The coordinator sends the same plan again (reconnect), and the agent restarts.
  std::vector<json> events;
  auto e = g.engine(&events);
  EXPECT_EQ(e->status_json()["state"], "succeeded");  // known before anything runs
  EXPECT_EQ(e->run(abc_plan()), Outcome::succeeded);
  EXPECT_EQ(e->resume(), Outcome::succeeded);
  for (const char* s : {"a", "b", "c"}) {
    EXPECT_EQ(g.count(std::string("check-") + s), 1) << "not even checked again: " << s;
    EXPECT_EQ(g.count(std::string("apply-") + s), 1) << s;
  }
  EXPECT_TRUE(of_kind(events, "progress").empty());
  auto plans = of_kind(events, "plan");
  ASSERT_EQ(plans.size(), 2u);
  EXPECT_EQ(plans[0]["state"], "succeeded");
  EXPECT_EQ(plans[0]["steps_done"], 3);
  EXPECT_EQ(plans[0]["message"], "plan already applied; nothing to do");
}

TEST(PlanEngine, StepAlreadyDoneIsSkipped) {
  FakeGuest g;
  g.set("done-b");
  std::vector<json> events;
  EXPECT_EQ(g.engine(&events)->run(abc_plan()), Outcome::succeeded);
  EXPECT_EQ(g.count("apply-b"), 0);
  EXPECT_EQ(g.count("verify-b"), 0);
  EXPECT_EQ(step_trail(events)[3], "b:skipped");
  auto st = g.engine()->status_json();
  EXPECT_EQ(st["steps"][1]["skipped"], true);
  EXPECT_EQ(st["steps"][1]["message"], "already done");
}

TEST(PlanEngine, FailedAttemptIsRetriedAsTheSpecSays) {
  FakeGuest g;
  g.set("fail-b");
  std::vector<json> events;
  // Fix the cause between attempts, as a transient failure (a download cut) would.
  PlanEngineOptions opts;
  opts.sleep = [&](std::chrono::milliseconds d) {
    g.slept.push_back(d);
    g.clear("fail-b");
  };
  auto e = g.engine(&events, opts);
  EXPECT_EQ(e->run(plan_of({fake("a"), fake("b", {}, /*retries=*/2), fake("c")})),
            Outcome::succeeded);
  EXPECT_EQ(g.count("apply-b"), 2);
  EXPECT_EQ(g.count("effect-b"), 1);
  ASSERT_EQ(g.slept.size(), 1u);
  EXPECT_EQ(g.slept[0], std::chrono::milliseconds(1000));
  bool saw_retry = false;
  for (auto& ev : of_kind(events, "progress"))
    if (ev["step"] == "b" && ev["state"] == "progress") {
      saw_retry = true;
      EXPECT_EQ(ev["message"], "attempt 1 of 3 failed: simulated failure of b; retrying in 1s");
      EXPECT_EQ(ev["output_tail"], "line 1\nline 2: the end");
      EXPECT_EQ(ev["diagnosis"]["code"], "simulated_failure");
    }
  EXPECT_TRUE(saw_retry);
  EXPECT_EQ(e->status_json()["steps"][1]["failures"], 1);
  EXPECT_EQ(e->status_json()["steps"][1]["attempts"], 2);
}

TEST(PlanEngine, FailureStopsThePlanWithMessageTailAndDiagnosis) {
  FakeGuest g;
  g.set("fail-b");
  std::vector<json> events;
  auto e = g.engine(&events);
  EXPECT_EQ(e->run(plan_of({fake("a"), fake("b", {}, 1), fake("c")})), Outcome::failed);
  EXPECT_EQ(g.count("apply-b"), 2);  // 1 + 1 retry
  EXPECT_EQ(g.count("check-c"), 0);  // never reached
  json failed;
  for (auto& ev : of_kind(events, "progress"))
    if (ev["state"] == "failed") failed = ev;
  ASSERT_FALSE(failed.is_null());
  EXPECT_EQ(failed["step"], "b");
  EXPECT_EQ(failed["attempt"], 2);
  EXPECT_EQ(failed["message"], "simulated failure of b");
  EXPECT_EQ(failed["output_tail"], "line 1\nline 2: the end");
  EXPECT_EQ(failed["diagnosis"]["code"], "simulated_failure");
  EXPECT_EQ(failed["diagnosis"]["fix"], "remove the fail file");
  json plan_ev = of_kind(events, "plan").back();
  EXPECT_EQ(plan_ev["state"], "failed");
  EXPECT_EQ(plan_ev["failed_step"], "b");
  EXPECT_EQ(plan_ev["steps_done"], 1);
  EXPECT_EQ(plan_ev["message"], "step 'b' failed: simulated failure of b");

  json st = e->status_json();
  EXPECT_EQ(st["state"], "failed");
  EXPECT_EQ(st["steps"][1]["state"], "failed");
  EXPECT_EQ(st["steps"][1]["output_tail"], "line 1\nline 2: the end");
  EXPECT_EQ(st["steps"][1]["diagnosis"]["code"], "simulated_failure");
  EXPECT_EQ(st["steps"][2]["state"], "pending");

  // A failed plan is not re-run by itself (a restart or a resent plan only reports it).
  std::vector<json> again;
  EXPECT_EQ(g.engine(&again)->run(plan_of({fake("a"), fake("b", {}, 1), fake("c")})),
            Outcome::failed);
  EXPECT_EQ(g.count("apply-b"), 2);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0]["state"], "failed");
  EXPECT_EQ(again[0]["failed_step"], "b");
}

TEST(PlanEngine, RetryRunsAgainFromTheFailedStep) {
  FakeGuest g;
  g.set("fail-b");
  json plan = plan_of({fake("a"), fake("b"), fake("c")});
  ASSERT_EQ(g.engine()->run(plan), Outcome::failed);
  g.clear("fail-b");  // the admin fixes the cause
  std::vector<json> events;
  auto e = g.engine(&events);
  auto r = e->retry();
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(*r, Outcome::succeeded);
  EXPECT_EQ(g.count("check-a"), 1);  // before the failed step: untouched
  EXPECT_EQ(g.count("apply-b"), 2);
  EXPECT_EQ(g.count("effect-b"), 1);
  EXPECT_EQ(g.count("effect-c"), 1);
  EXPECT_EQ(step_trail(events),
            (std::vector<std::string>{"b:started", "b:succeeded", "c:started", "c:succeeded"}));
  EXPECT_EQ(e->status_json()["steps"][1]["failures"], 0);  // counters start over
}

TEST(PlanEngine, RetryFromANamedStepRunsItAndEveryLaterOne) {
  FakeGuest g;
  ASSERT_EQ(g.engine()->run(abc_plan()), Outcome::succeeded);
  std::vector<json> events;
  auto r = g.engine(&events)->retry("b");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(*r, Outcome::succeeded);
  EXPECT_EQ(g.count("check-a"), 1);
  EXPECT_EQ(g.count("check-b"), 2);
  EXPECT_EQ(g.count("check-c"), 2);
  EXPECT_EQ(g.count("effect-b"), 1);  // still done: its check skips it
  EXPECT_EQ(step_trail(events),
            (std::vector<std::string>{"b:started", "b:skipped", "c:started", "c:skipped"}));
}

TEST(PlanEngine, RetryRefusesWhenThereIsNothingToRetry) {
  FakeGuest g;
  auto none = g.engine()->retry();
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code, factory::Errc::failed_precondition);
  ASSERT_EQ(g.engine()->run(abc_plan()), Outcome::succeeded);
  auto done = g.engine()->retry();
  ASSERT_FALSE(done.ok());
  EXPECT_EQ(done.error().message,
            "the plan succeeded: nothing to retry (name a step to run it again)");
  auto unknown = g.engine()->retry("z");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.error().message, "no step 'z' in this plan (steps: a, b, c)");
}

TEST(PlanEngine, NewPlanStartsANewJournalAndKeepsThePrevious) {
  FakeGuest g;
  json v1 = abc_plan();
  ASSERT_EQ(g.engine()->run(v1), Outcome::succeeded);
  json v2 = plan_of({fake("a"), fake("b", {{"version", "2"}}), fake("c"), fake("d")});
  ASSERT_NE(factory::catalog::plan_hash(v1), factory::catalog::plan_hash(v2));
  auto e = g.engine();
  EXPECT_EQ(e->run(v2), Outcome::succeeded);
  EXPECT_EQ(e->status_json()["plan_hash"], factory::catalog::plan_hash(v2));
  EXPECT_EQ(g.count("check-a"), 2);   // the new plan checks every step...
  EXPECT_EQ(g.count("effect-a"), 1);  // ...and applies only what is not done
  EXPECT_EQ(g.count("effect-d"), 1);
  auto prev = PlanJournal::parse(*factory::read_file(e->journal().prev_file()));
  ASSERT_TRUE(prev.ok()) << prev.error().message;
  EXPECT_EQ(prev->plan_hash, factory::catalog::plan_hash(v1));
  EXPECT_EQ(prev->state, PlanState::succeeded);
}

TEST(PlanEngine, CorruptOrTruncatedJournalStartsThePlanOverSafely) {
  struct Damage {
    const char* what;
    std::function<std::string(const std::string&)> apply;
    const char* reason;
  };
  std::vector<Damage> damages = {
      // The header line (schema, hash, the plan) is what they damage: without
      // it nothing in the journal can be trusted.
      {"truncated", [](const std::string& s) { return s.substr(0, s.find('\n') / 2); },
       "not valid JSON (truncated?)"},
      {"empty", [](const std::string&) { return std::string(); }, "the file is empty"},
      {"garbage",
       [](const std::string&) {
         return std::string(
             "\x7f"
             "ELF\x02\x01\x01",
             7);
       },
       "not valid JSON (truncated?)"},
      {"other schema",
       [](const std::string& s) {
         json j = json::parse(s.substr(0, s.find('\n')));
         j["schema"] = "something/v9";
         return j.dump() + s.substr(s.find('\n'));
       },
       "schema is not factory.plan-journal/v2"},
      {"edited",
       [](const std::string& s) {
         // A flipped state with the checksum left as it was.
         json j = json::parse(s.substr(0, s.find('\n')));
         j["state"] = "running";
         return j.dump() + s.substr(s.find('\n'));
       },
       "checksum mismatch (the file was altered or damaged)"},
  };
  for (auto& d : damages) {
    SCOPED_TRACE(d.what);
    FakeGuest g;
    ASSERT_EQ(g.engine()->run(abc_plan()), Outcome::succeeded);
    std::string text = *factory::read_file(g.journal_file());
    ASSERT_TRUE(factory::write_file_atomic(g.journal_file(), d.apply(text)).ok());

    std::vector<json> events;
    auto e = g.engine(&events);
    EXPECT_EQ(e->status_json()["state"],
              "none");  // a corrupt journal is not trusted for status either
    EXPECT_EQ(e->run(abc_plan()), Outcome::succeeded);
    auto resets = of_kind(events, "journal_reset");
    ASSERT_EQ(resets.size(), 1u);
    EXPECT_EQ(resets[0]["reason"], d.reason);
    EXPECT_EQ(resets[0]["plan_hash"], factory::catalog::plan_hash(abc_plan()));
    // Started over: every step checked again, nothing applied twice.
    for (const char* s : {"a", "b", "c"}) {
      EXPECT_EQ(g.count(std::string("check-") + s), 2) << s;
      EXPECT_EQ(g.count(std::string("effect-") + s), 1) << s;
    }
    EXPECT_EQ(step_trail(events)[1], "a:skipped");
    // The damaged file is kept for a post-mortem, and the new journal is sound.
    EXPECT_EQ(*factory::read_file(e->journal().corrupt_file()), d.apply(text));
    EXPECT_EQ(g.engine()->status_json()["state"], "succeeded");
  }
}

TEST(PlanEngine, ADamagedStepRecordRechecksThatStepOnlyAndKeepsTheOthers) {
  FakeGuest g;
  ASSERT_EQ(g.engine()->run(abc_plan()), Outcome::succeeded);
  std::string text = *factory::read_file(g.journal_file());
  // Step b's record (the third line) overwritten in place.
  size_t b = text.find('\n', text.find('\n') + 1) + 1;
  for (size_t i = b; text[i] != '\n'; ++i) text[i] = '#';
  ASSERT_TRUE(factory::write_file_atomic(g.journal_file(), text).ok());

  std::vector<json> events;
  auto e = g.engine(&events);
  EXPECT_EQ(e->run(abc_plan()), Outcome::succeeded);
  EXPECT_TRUE(of_kind(events, "journal_reset").empty()) << "the journal is not thrown away";
  auto warnings = of_kind(events, "log");
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0]
                .value("message", "")
                .find(g.journal_file().string() + " offset " + std::to_string(b) +
                      ": the record of step 'b' (2 of 3) is damaged"),
            std::string::npos)
      << warnings[0].dump();
  // Only b is checked again (and found done); a and c are known done.
  EXPECT_EQ(g.count("check-a"), 1);
  EXPECT_EQ(g.count("check-b"), 2);
  EXPECT_EQ(g.count("check-c"), 1);
  for (const char* s : {"a", "b", "c"}) EXPECT_EQ(g.count(std::string("effect-") + s), 1) << s;
  // Written whole again: the next start finds nothing to repair.
  std::vector<json> later;
  EXPECT_EQ(g.engine(&later)->run(abc_plan()), Outcome::succeeded);
  EXPECT_TRUE(of_kind(later, "log").empty());
}

TEST(PlanEngine, CorruptJournalAtStartWaitsForThePlan) {
  FakeGuest g;
  ASSERT_EQ(g.engine()->run(abc_plan()), Outcome::succeeded);
  ASSERT_TRUE(factory::write_file_atomic(g.journal_file(), "{\"schema\":").ok());
  std::vector<json> events;
  auto e = g.engine(&events);
  EXPECT_EQ(e->resume(), Outcome::idle);  // the stored plan is lost with it
  EXPECT_EQ(of_kind(events, "journal_reset").size(), 1u);
  EXPECT_EQ(e->resume(), Outcome::idle);  // and it does not loop on it
  EXPECT_EQ(of_kind(events, "journal_reset").size(), 1u);
  EXPECT_EQ(e->run(abc_plan()), Outcome::succeeded);  // the coordinator's copy arrives
  EXPECT_EQ(g.count("effect-a"), 1);
}

TEST(PlanEngine, JournalIsWrittenBeforeTheAction) {
  FakeGuest g;
  ASSERT_EQ(g.engine()->run(plan_of({fake("a"), fake("b", {{"observe_journal", true}})})),
            Outcome::succeeded);
  // What apply() saw on disk: state/phase/entries/attempts.
  EXPECT_EQ(factory::testing::slurp(g.env.root / "fake" / "observed-b"), "running/apply/1/1");
}

TEST(PlanEngine, StepProgressReachesTheSink) {
  FakeGuest g;
  std::vector<json> events;
  ASSERT_EQ(g.engine(&events)->run(plan_of({fake("m", {{"progress", true}})})), Outcome::succeeded);
  json p;
  for (auto& e : of_kind(events, "progress"))
    if (e["state"] == "progress") p = e;
  EXPECT_EQ(
      p,
      json({{"kind", "progress"},
            {"plan_hash", factory::catalog::plan_hash(plan_of({fake("m", {{"progress", true}})}))},
            {"step", "m"},
            {"state", "progress"},
            {"attempt", 1},
            {"percent", 42},
            {"message", "halfway"}}));
}

TEST(PlanEngine, StepPastItsDeadlineFailsAsTimedOut) {
  FakeGuest g;
  std::vector<json> events;
  auto e = g.engine(&events);
  EXPECT_EQ(e->run(plan_of({fake("slow", {{"sleep_ms", 1100}}, 0, /*timeout_s=*/1)})),
            Outcome::failed);
  EXPECT_EQ(e->status_json()["steps"][0]["message"], "timed out after 1s: deadline passed");
}

TEST(PlanEngine, AStepThatThrowsFailsThePlanNotTheAgent) {
  FakeGuest g;
  auto e = g.engine();
  EXPECT_EQ(e->run(plan_of({fake("t", {{"throw", true}})})), Outcome::failed);
  EXPECT_EQ(e->status_json()["steps"][0]["message"], "apply threw: boom in t (a bug in the agent)");
}

TEST(PlanEngine, PlanWithAnUnknownStepKindIsRefusedBeforeAnythingRuns) {
  FakeGuest g;
  json plan = plan_of({fake("a"), {{"id", "x"}, {"kind", "teleport"}}});
  std::vector<json> events;
  auto e = g.engine(&events);
  EXPECT_EQ(e->run(plan), Outcome::failed);
  EXPECT_EQ(g.count("check-a"), 0);
  EXPECT_EQ(
      e->status_json()["steps"][1]["message"],
      "unknown step kind 'teleport': this agent is older than the plan; update the agent binary");
  EXPECT_EQ(of_kind(events, "plan").back()["failed_step"], "x");
}

TEST(PlanEngine, SystemRebootHookUsesSystemctlOrRebootFromPath) {
  // Stand-ins on a PATH of their own: nothing here can reboot the machine.
  factory::testing::TempDir dir;
  auto bin = dir / "bin";
  std::filesystem::create_directories(bin);
  auto stand_in = [&](const std::string& name, const std::string& body) {
    std::ofstream(bin / name) << "#!/bin/sh\n" << body << "\n";
    std::filesystem::permissions(bin / name, std::filesystem::perms::owner_all);
  };
  std::string old_path = ::getenv("PATH") ? ::getenv("PATH") : "";
  ::setenv("PATH", bin.c_str(), 1);
  auto hook = system_reboot_hook();
  auto none = hook();
  stand_in("reboot", "echo \"reboot $*\" >> " + (dir / "calls").string());
  auto by_reboot = hook();
  stand_in("systemctl", "echo \"systemctl $*\" >> " + (dir / "calls").string());
  auto by_systemctl = hook();
  stand_in("systemctl", "echo 'Failed to reboot: access denied'; exit 1");
  auto refused = hook();
  ::setenv("PATH", old_path.c_str(), 1);

  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().message, "reboot: command not found on PATH");
  EXPECT_TRUE(by_reboot.ok());
  EXPECT_TRUE(by_systemctl.ok());
  EXPECT_EQ(factory::testing::slurp(dir / "calls"), "reboot \nsystemctl reboot\n");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("access denied"), std::string::npos)
      << refused.error().message;
}

TEST(PlanEngine, AStepFailedJustBeforeACrashIsNotRunAgain) {
  // Killed between journaling the failed step and the failed plan: the journal
  // says "running" with a failed step; the restarted agent reports the failure.
  FakeGuest g;
  g.set("fail-b");
  ASSERT_EQ(g.engine()->run(abc_plan()), Outcome::failed);
  auto st = PlanJournal::parse(factory::testing::slurp(g.journal_file()));
  ASSERT_TRUE(st.ok());
  st->state = PlanState::running;
  ASSERT_TRUE(PlanJournal(g.journal_file().parent_path()).save(*st).ok());
  EXPECT_EQ(g.engine()->resume(), Outcome::failed);
  EXPECT_EQ(g.count("apply-b"), 1);
}

TEST(PlanEngine, MalformedPlanIsRefusedWithoutTouchingTheJournal) {
  FakeGuest g;
  std::vector<json> events;
  auto e = g.engine(&events);
  EXPECT_EQ(e->run(json{{"tier", "x"}, {"steps", {{{"id", "a"}}}}}), Outcome::failed);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["state"], "failed");
  EXPECT_EQ(events[0]["message"], "plan: step 'a': kind: required (a string)");
  EXPECT_FALSE(std::filesystem::exists(g.journal_file()));
}

TEST(PlanEngine, ARebootThatCannotBeRequestedFailsTheStep) {
  FakeGuest g;
  std::vector<json> events;
  PlanEngine e(
      g.env, fake_registry(), [&](json ev) { events.push_back(ev); },
      [] {
        return factory::Status(
            factory::Error(factory::Errc::not_found, "reboot: command not found on PATH"));
      });
  EXPECT_EQ(e.run(plan_of({fake("driver", {{"reboot", true}})})), Outcome::failed);
  EXPECT_EQ(e.status_json()["steps"][0]["message"],
            "could not reboot the guest: reboot: command not found on PATH; reboot the VM, the "
            "plan continues "
            "after boot");
}

TEST(PlanEngine, AStepInterruptedByTheAgentsStopIsLeftToResumeNotFailed) {
  // The agent stops (SIGTERM) while step b is applying: what the stop cut
  // short (here a failure) is not the step's verdict, and not a crash.
  FakeGuest g;
  g.set("fail-b");
  json plan = plan_of({fake("a"), fake("b", {{"sleep_ms", 300}}), fake("c")});
  std::vector<json> events;
  auto e = g.engine(&events);
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    e->interrupt();
  });
  EXPECT_EQ(e->run(plan), Outcome::stopped);
  stopper.join();
  auto st = e->status_json();
  EXPECT_EQ(st["state"], "running");
  EXPECT_EQ(st["steps"][1]["state"], "running");
  EXPECT_EQ(st["steps"][1]["failures"], 0);
  EXPECT_EQ(st["steps"][1]["entries"], 0) << "a planned stop is not counted as a crash";
  EXPECT_EQ(st["steps"][2]["state"], "pending");
  EXPECT_EQ(g.count("apply-c"), 0);
  EXPECT_EQ(e->run(plan), Outcome::stopped) << "once interrupted, it runs nothing more";
  EXPECT_EQ(g.count("apply-b"), 1);

  // The next start: b's check decides, b runs again, the plan finishes.
  g.clear("fail-b");
  auto again = g.engine();
  EXPECT_EQ(again->resume(), Outcome::succeeded);
  EXPECT_EQ(g.count("check-b"), 2);
  EXPECT_EQ(g.count("apply-b"), 2);
  EXPECT_EQ(g.count("effect-c"), 1);
}
