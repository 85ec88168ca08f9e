// Tier upgrades in the plan engine (PlanEngine::tier_upgrade,
// contract/tier_upgrade.hpp): only the order's steps run, as a new journal
// generation; a failed step whose kind can go back puts the previous
// params back (a second generation), one that cannot leaves the plan
// failed for `retry`; each turn is one tier_upgrade event; a kill anywhere
// resumes. The guest is tests/agent/plan_fakes.hpp's; the driver is
// VersionedDriver below, a double registered under the kind nvidia_driver
// (so the engine treats it as the kind that can go back) that stands in for
// the real step's behaviour: a version installed, loaded at the next boot,
// verified after it. The real step in a simulated guest is
// tests/integration/tier_upgrade_test.cpp's.
#include <gtest/gtest.h>

#include "agent/plan/engine.hpp"
#include "contract/catalog.hpp"
#include "contract/tier_upgrade.hpp"
#include "tests/agent/plan_fakes.hpp"

using namespace factory::agent;
using namespace factory::agent::testfakes;
using Outcome = PlanEngine::Outcome;
using factory::Result;

namespace {

// Files under <root>/fake/: drv-installed (the version the packages hold;
// "<version>-half-configured" after a failed install),
// drv-loaded (the version the running kernel has), noload-<version> (that
// version's module fails to load at boot), fail-drv-<version> (its install
// fails), count-apply-drv-<version>.
std::string read_flag(const fs::path& root, const std::string& f) {
  std::ifstream in(fake_dir(root) / f);
  std::string s;
  std::getline(in, s);
  return s;
}

class VersionedDriver : public Step {
 public:
  explicit VersionedDriver(const StepSpec& s) : version_(s.params.value("version", "")) {}
  Result<bool> check(StepContext& ctx) override {
    const auto& r = ctx.env.root;
    return read_flag(r, "drv-loaded") == version_ && read_flag(r, "drv-installed") == version_;
  }
  StepOutcome apply(StepContext& ctx) override {
    const auto& r = ctx.env.root;
    maybe_kill(r, "drv-" + version_ + ":apply");
    bump_in(r, "apply-drv-" + version_);
    if (has_in(r, "fail-drv-" + version_)) {
      // As dpkg leaves a package whose postinst failed: unpacked, not the
      // version that was there, while the old module stays loaded.
      set_in(r, "drv-installed", version_ + "-half-configured");
      return StepOutcome::failure(
          "DKMS could not build " + version_, "Bad return status for module build",
          Diagnosis{"dkms_build_failed", "the module did not build", "see make.log", {}});
    }
    set_in(r, "drv-installed", version_);
    if (read_flag(r, "drv-loaded") == version_) return StepOutcome::success("loaded");
    return StepOutcome::reboot("driver " + version_ + " installed; rebooting to load it");
  }
  StepOutcome verify(StepContext& ctx) override {
    if (read_flag(ctx.env.root, "drv-loaded") == version_) return StepOutcome::success("loaded");
    return StepOutcome::failure(
        "the guest rebooted and driver " + version_ + " is not loaded", "",
        Diagnosis{"driver_not_loading", "the module did not load", "see the kernel log", {}});
  }

 private:
  std::string version_;
};

// The guest boots: the installed driver loads, unless its module refuses.
void boot(FakeGuest& g) {
  g.boot();
  const auto& r = g.env.root;
  std::string v = read_flag(r, "drv-installed");
  set_in(r, "drv-loaded", has_in(r, "noload-" + v) ? "" : v);
}

std::unique_ptr<PlanEngine> engine(FakeGuest& g, std::vector<json>* events) {
  StepRegistry reg = fake_registry();
  reg.add("nvidia_driver", [](const StepSpec& s) -> Result<std::unique_ptr<Step>> {
    return std::unique_ptr<Step>(std::make_unique<VersionedDriver>(s));
  });
  PlanEngineOptions o;
  o.sleep = [](std::chrono::milliseconds) {};
  PlanEventSink sink = [events](json e) {
    if (events) events->push_back(std::move(e));
  };
  return std::make_unique<PlanEngine>(g.env, std::move(reg), sink, g.reboot_hook(), o);
}

json drv(const std::string& version) {
  return {{"id", "nvidia-driver"},
          {"kind", "nvidia_driver"},
          {"params", {{"version", version}}},
          {"timeout_seconds", 60},
          {"retries", 0}};
}

json plan_with(const std::string& driver, const std::string& model = "m1") {
  return plan_of({fake("gpu"), drv(driver), fake(model)}, "gpu-vm");
}

json order(const json& from, const json& to, const std::string& id = "tier-1") {
  factory::proto::TierUpgradeOrder o;
  o.upgrade_id = id;
  o.from_hash = factory::catalog::plan_hash(from);
  o.to_hash = factory::catalog::plan_hash(to);
  o.plan = to;
  o.steps = factory::catalog::diff_plans(from, to).to_run();
  return o.to_json();
}

// Runs the agent as systemd would after each reboot until it settles.
Outcome settle(FakeGuest& g, Outcome o, std::vector<json>* events) {
  for (int i = 0; o == Outcome::rebooting && i < 6; ++i) {
    boot(g);
    o = engine(g, events)->resume();
  }
  return o;
}

// The guest on driver 615 with everything done.
void provision(FakeGuest& g, const json& plan) {
  auto o = engine(g, nullptr)->run(plan);
  ASSERT_EQ(settle(g, o, nullptr), Outcome::succeeded);
  ASSERT_EQ(read_flag(g.env.root, "drv-loaded"), "615");
}

std::vector<std::string> upgrade_trail(const std::vector<json>& events) {
  std::vector<std::string> out;
  for (const auto& e : of_kind(events, "tier_upgrade")) out.push_back(e["state"]);
  return out;
}

}  // namespace

TEST(PlanTierUpgrade, RunsOnlyTheChangedStepThroughItsRebootAndReportsSucceeded) {
  FakeGuest g;
  const json from = plan_with("615"), to = plan_with("620");
  provision(g, from);
  std::vector<json> events;
  Outcome o = engine(g, &events)->tier_upgrade(order(from, to));
  EXPECT_EQ(o, Outcome::rebooting);
  EXPECT_EQ(settle(g, o, &events), Outcome::succeeded);

  EXPECT_EQ(read_flag(g.env.root, "drv-loaded"), "620");
  EXPECT_EQ(g.count("apply-drv-620"), 1);
  // The unchanged steps were neither applied nor even checked again.
  EXPECT_EQ(g.count("check-gpu"), 1);
  EXPECT_EQ(g.count("check-m1"), 1);
  EXPECT_EQ(step_trail(events),
            (std::vector<std::string>{"nvidia-driver:started", "nvidia-driver:reboot_requested",
                                      "nvidia-driver:started", "nvidia-driver:succeeded"}));
  EXPECT_EQ(upgrade_trail(events), (std::vector<std::string>{"started", "succeeded"}));
  auto done = of_kind(events, "tier_upgrade").back();
  EXPECT_EQ(done["upgrade_id"], "tier-1");
  EXPECT_EQ(done["to_hash"], factory::catalog::plan_hash(to));

  auto loaded = PlanJournal(g.env.state_dir / "plan").load();
  ASSERT_EQ(loaded.kind, PlanJournal::Loaded::Kind::ok);
  EXPECT_EQ(loaded.state.plan_hash, factory::catalog::plan_hash(to));
  EXPECT_EQ(loaded.state.state, PlanState::succeeded);
  EXPECT_EQ(loaded.state.tier_upgrade["role"], "upgrade");
  EXPECT_EQ(loaded.state.tier_upgrade["previous_plan"], from);
  EXPECT_EQ(loaded.state.steps[0].message, "verified gpu") << "carried over from the first boot";
  // The previous generation is kept beside it.
  auto prev = PlanJournal::parse(*factory::read_file(g.env.state_dir / "plan/journal.prev.json"));
  ASSERT_TRUE(prev.ok());
  EXPECT_EQ(prev->plan_hash, factory::catalog::plan_hash(from));

  // The coordinator sends the order again after a reconnection, and then the
  // new plan at hello: nothing runs again and nothing is reported twice.
  events.clear();
  auto e = engine(g, &events);
  EXPECT_EQ(e->tier_upgrade(order(from, to)), Outcome::succeeded);
  EXPECT_EQ(e->run(to), Outcome::succeeded);
  EXPECT_EQ(g.count("apply-drv-620"), 1);
  EXPECT_TRUE(of_kind(events, "tier_upgrade").empty());
}

TEST(PlanTierUpgrade, ADriverThatDoesNotLoadGoesBackToThePreviousOneThroughAReboot) {
  FakeGuest g;
  const json from = plan_with("615"), to = plan_with("620");
  provision(g, from);
  set_in(g.env.root, "noload-620");
  std::vector<json> events;
  Outcome o = settle(g, engine(g, &events)->tier_upgrade(order(from, to)), &events);
  EXPECT_EQ(o, Outcome::succeeded) << "the going back succeeded";

  EXPECT_EQ(read_flag(g.env.root, "drv-loaded"), "615");
  EXPECT_EQ(read_flag(g.env.root, "drv-installed"), "615");
  EXPECT_EQ(g.count("apply-drv-615"), 2) << "the first boot's install and the going back";
  EXPECT_EQ(g.count("reboot-requests"), 3) << "615, 620, 615 again";
  EXPECT_EQ(upgrade_trail(events),
            (std::vector<std::string>{"started", "rolling_back", "rolled_back"}));
  auto back = of_kind(events, "tier_upgrade").back();
  EXPECT_EQ(back["step"], "nvidia-driver");
  EXPECT_EQ(back["diagnosis"]["code"], "driver_not_loading");
  EXPECT_NE(back["message"].get<std::string>().find("driver 620 is not loaded"), std::string::npos)
      << back.dump();

  // Back on the previous plan: the coordinator's plan at hello is finished.
  auto loaded = PlanJournal(g.env.state_dir / "plan").load();
  EXPECT_EQ(loaded.state.plan_hash, factory::catalog::plan_hash(from));
  EXPECT_EQ(loaded.state.state, PlanState::succeeded);
  EXPECT_EQ(loaded.state.tier_upgrade["role"], "rollback");
  events.clear();
  EXPECT_EQ(engine(g, &events)->run(from), Outcome::succeeded);
  EXPECT_TRUE(of_kind(events, "progress").empty());
}

TEST(PlanTierUpgrade, AnAgentKilledWhileGoingBackFinishesItAtItsNextStart) {
  FakeGuest g;
  const json from = plan_with("615"), to = plan_with("620");
  provision(g, from);
  set_in(g.env.root, "fail-drv-620");
  g.kill_at("drv-615:apply");
  std::vector<json> events;
  int status = in_child([&] { engine(g, nullptr)->tier_upgrade(order(from, to)); });
  ASSERT_TRUE(killed_by_sigkill(status));
  // systemd starts the agent again: it resumes the going back from its journal.
  Outcome o = settle(g, engine(g, &events)->resume(), &events);
  EXPECT_EQ(o, Outcome::succeeded);
  EXPECT_EQ(read_flag(g.env.root, "drv-loaded"), "615");
  EXPECT_EQ(upgrade_trail(events), (std::vector<std::string>{"rolled_back"}));
  EXPECT_EQ(of_kind(events, "tier_upgrade").back()["diagnosis"]["code"], "dkms_build_failed");
}

TEST(PlanTierUpgrade, AFailureInAStepThatCannotGoBackStaysFailedAndRetryFinishesIt) {
  FakeGuest g;
  const json from = plan_with("615", "m1"), to = plan_with("615", "m2");
  provision(g, from);
  g.set("fail-m2");
  std::vector<json> events;
  auto e = engine(g, &events);
  EXPECT_EQ(e->tier_upgrade(order(from, to)), Outcome::failed);
  EXPECT_EQ(upgrade_trail(events), (std::vector<std::string>{"started", "failed"}));
  auto failed = of_kind(events, "tier_upgrade").back();
  EXPECT_EQ(failed["step"], "m2");
  EXPECT_EQ(failed["diagnosis"]["code"], "simulated_failure");
  EXPECT_NE(failed["message"].get<std::string>().find("cannot go back"), std::string::npos);
  EXPECT_EQ(g.count("apply-drv-615"), 1) << "the driver did not change and was not touched";

  // Restarting reports nothing twice; the admin fixes the cause and retries.
  events.clear();
  EXPECT_EQ(engine(g, &events)->resume(), Outcome::failed);
  EXPECT_TRUE(of_kind(events, "tier_upgrade").empty());
  g.clear("fail-m2");
  auto r = engine(g, &events)->retry();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, Outcome::succeeded);
  EXPECT_EQ(upgrade_trail(events), (std::vector<std::string>{"succeeded"}));
}

TEST(PlanTierUpgrade, AnOrderNotFromTheFinishedPlanIsRefusedAndChangesNothing) {
  FakeGuest g;
  const json from = plan_with("615"), to = plan_with("620"), other = plan_with("610");
  provision(g, from);
  const std::string before = *factory::read_file(g.journal_file());
  std::vector<json> events;
  auto e = engine(g, &events);
  EXPECT_EQ(e->tier_upgrade(order(other, to)), Outcome::failed);
  json bad = order(from, to);
  bad["to_hash"] = factory::catalog::plan_hash(other);  // the plan is not what it claims
  EXPECT_EQ(e->tier_upgrade(bad), Outcome::failed);
  EXPECT_EQ(upgrade_trail(events), (std::vector<std::string>{"refused", "refused"}));
  EXPECT_NE(of_kind(events, "tier_upgrade")[0]["message"].get<std::string>().find(
                "which the upgrade is from"),
            std::string::npos);
  EXPECT_NE(of_kind(events, "tier_upgrade")[1]["message"].get<std::string>().find("not to_hash"),
            std::string::npos);
  EXPECT_EQ(*factory::read_file(g.journal_file()), before);
  EXPECT_EQ(g.count("apply-drv-620"), 0);
}

TEST(PlanTierUpgrade, TheJournalKeepsItsTierUpgradeAndOneWithoutReadsAsBefore) {
  JournalState st;
  st.plan = plan_with("615");
  st.plan_hash = factory::catalog::plan_hash(st.plan);
  st.tier = "gpu-vm";
  for (const char* id : {"gpu", "nvidia-driver", "m1"}) {
    StepRecord r;
    r.id = id;
    r.kind = std::string(id) == "nvidia-driver" ? "nvidia_driver" : "fake";
    st.steps.push_back(r);
  }
  const std::string plain = PlanJournal::serialize(st);
  EXPECT_EQ(plain.find("tier_upgrade"), std::string::npos);
  auto back = PlanJournal::parse(plain);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(back->tier_upgrade.is_null());

  st.tier_upgrade = {{"id", "tier-1"}, {"role", "rollback"}, {"reason", "step failed"}};
  auto kept = PlanJournal::parse(PlanJournal::serialize(st));
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->tier_upgrade, st.tier_upgrade);
}
