// The mig step against the simulated H200 guest (tests/guestsim: the real
// card's `nvidia-smi mig -lgip` capture and NVIDIA's documented output for
// what the real card's MIG mode may not be changed to show; NOT a real
// guest). The test drives check -> apply -> reboot -> verify as the plan
// engine would, and reads the stand-ins' call log for the order of commands.
#include <gtest/gtest.h>

#include "tests/agent/step_harness.hpp"
#include "tests/guestsim/guest_sim.hpp"

namespace factory::testing {
namespace {

using agent::StepOutcome;

agent::StepSpec mig_spec(nlohmann::json params) {
  agent::StepSpec s;
  s.id = "mig";
  s.kind = "mig";
  s.params = std::move(params);
  s.timeout = std::chrono::minutes(5);
  return s;
}

const nlohmann::json kSevenSmall = {{"instances", {{"1g.18gb", 7}}}};

// The nvidia-smi calls of the call log, in order, as "nvidia-smi <args>".
std::vector<std::string> smi_calls(const GuestSim& sim, const std::string& needle) {
  std::vector<std::string> out;
  std::istringstream in(sim.calls_log());
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("nvidia-smi ", 0) == 0 && line.find(needle) != std::string::npos)
      out.push_back(line);
  return out;
}

size_t first_call(const GuestSim& sim, const std::string& needle) {
  std::istringstream in(sim.calls_log());
  std::string line;
  for (size_t i = 0; std::getline(in, line); ++i)
    if (line.rfind("nvidia-smi ", 0) == 0 && line.find(needle) != std::string::npos) return i;
  return std::string::npos;
}

class MigStep : public ::testing::Test {
 protected:
  void make(const std::string& profile = "h200") {
    sim_ = std::make_unique<GuestSim>(dir_.path(), GuestSim::Options{profile, 0});
    path_ = std::make_unique<GuestSim::PathScope>(sim_->path());
  }
  void TearDown() override {
    path_.reset();
    sim_.reset();
  }
  TempDir dir_{"migstep"};
  std::unique_ptr<GuestSim> sim_;
  std::unique_ptr<GuestSim::PathScope> path_;
};

TEST_F(MigStep, SevenSmallSlicesOnTheH200WithTheCardsOwnProfileIds) {
  make();
  // The stand-in answers -lgip with the real card's capture, byte for byte
  // (the capture then holds -lgi's one line).
  std::string capture =
      slurp(fixtures_dir() / "h200-passthrough-vm/2026-12-01/nvidia-smi-mig-lgip-and-lgi.txt");
  capture = capture.substr(0, capture.find("No MIG-enabled devices found."));
  EXPECT_EQ(sim_->sh({"nvidia-smi", "mig", "-lgip"}).output, capture);

  StepHarness h(sim_->env(), mig_spec(kSevenSmall));
  ASSERT_TRUE(h.ok());
  auto c = h.check();
  ASSERT_TRUE(c);
  EXPECT_FALSE(*c);

  auto a = h.apply();
  ASSERT_TRUE(a.ok()) << describe(a);
  EXPECT_NE(a.message.find("GPU 0 in MIG mode: 7 x 1g.18gb (16.00 GiB each)"), std::string::npos)
      << a.message;
  EXPECT_NE(a.message.find("MIG-"), std::string::npos) << a.message;
  // -mig 1 applied at once (no reboot), IDs read off -lgip: 19 is 1g.18gb on an H200.
  EXPECT_EQ(sim_->counter("reboot"), 0);
  EXPECT_EQ(smi_calls(*sim_, "-i 0 -mig 1").size(), 1u);
  EXPECT_LT(first_call(*sim_, "-lgip"), first_call(*sim_, "-cgi"));
  auto create = smi_calls(*sim_, "-cgi");
  ASSERT_EQ(create.size(), 1u);
  EXPECT_NE(create[0].find("-cgi 19,19,19,19,19,19,19 -C"), std::string::npos) << create[0];

  auto again = h.check();
  ASSERT_TRUE(again);
  EXPECT_TRUE(*again);
  // Re-running apply on a done GPU creates nothing twice.
  auto re = h.apply();
  ASSERT_TRUE(re.ok()) << describe(re);
  EXPECT_EQ(smi_calls(*sim_, "-cgi").size(), 1u);
  EXPECT_EQ(smi_calls(*sim_, "-dgi").size(), 0u);
}

TEST_F(MigStep, PendingModeRebootsOnceThenCreatesTheSlices) {
  make();
  sim_->set_knob("mig_mode_pending");
  StepHarness h(sim_->env(), mig_spec({{"instances", {{"3g.71gb", 1}, {"1g.18gb", 4}}}}));
  auto a = h.apply();
  ASSERT_EQ(a.kind, StepOutcome::Kind::reboot_required) << describe(a);
  EXPECT_NE(a.message.find("pending"), std::string::npos) << a.message;
  ASSERT_EQ(sim_->reboot().exit_code, 0);
  EXPECT_EQ(sim_->counter("reboot"), 1);

  auto c = h.check();
  ASSERT_TRUE(c);
  EXPECT_FALSE(*c);  // enabled now, but no instances yet
  auto b = h.apply();
  ASSERT_TRUE(b.ok()) << describe(b);
  // The larger slice first, so it gets its aligned placement.
  auto create = smi_calls(*sim_, "-cgi");
  ASSERT_EQ(create.size(), 1u);
  EXPECT_NE(create[0].find("-cgi 9,19,19,19,19 -C"), std::string::npos) << create[0];
  EXPECT_NE(b.message.find("1 x 3g.71gb (69.75 GiB each)"), std::string::npos) << b.message;
  EXPECT_EQ(sim_->counter("reboot"), 1);
}

TEST_F(MigStep, ModeStillPendingAfterTheRebootIsADiagnosisNotALoop) {
  make();
  sim_->set_knob("mig_mode_pending");
  sim_->set_knob("mig_mode_stuck");
  StepHarness h(sim_->env(), mig_spec(kSevenSmall));
  ASSERT_EQ(h.apply().kind, StepOutcome::Kind::reboot_required);
  ASSERT_EQ(sim_->reboot().exit_code, 0);
  auto b = h.apply();
  ASSERT_EQ(b.kind, StepOutcome::Kind::failed) << describe(b);
  ASSERT_TRUE(b.diagnosis);
  EXPECT_EQ(b.diagnosis->code, "mig_mode_still_pending");
}

TEST_F(MigStep, ReconfiguringTearsDownComputeThenGpuInstancesFirst) {
  make();
  {
    StepHarness h(sim_->env(), mig_spec(kSevenSmall));
    ASSERT_TRUE(h.apply().ok());
  }
  StepHarness h(sim_->env(), mig_spec({{"instances", {{"3g.71gb", 2}}}}));
  auto c = h.check();
  ASSERT_TRUE(c);
  EXPECT_FALSE(*c);
  auto a = h.apply();
  ASSERT_TRUE(a.ok()) << describe(a);
  EXPECT_NE(a.message.find("2 x 3g.71gb"), std::string::npos) << a.message;
  size_t dci = first_call(*sim_, "-dci"), dgi = first_call(*sim_, "-dgi");
  size_t cgi2 = first_call(*sim_, "-cgi 9,9");
  ASSERT_NE(dci, std::string::npos);
  EXPECT_LT(dci, dgi);
  EXPECT_LT(dgi, cgi2);
}

TEST_F(MigStep, TeardownInOrderDciDgiThenMigOff) {
  make();
  {
    StepHarness h(sim_->env(), mig_spec(kSevenSmall));
    ASSERT_TRUE(h.apply().ok());
  }
  StepHarness off(sim_->env(), mig_spec({{"enabled", false}}));
  auto c = off.check();
  ASSERT_TRUE(c);
  EXPECT_FALSE(*c);
  auto a = off.apply();
  ASSERT_TRUE(a.ok()) << describe(a);
  EXPECT_EQ(a.message, "MIG disabled on GPU 0");
  size_t dci = first_call(*sim_, "-dci"), dgi = first_call(*sim_, "-dgi");
  size_t mig0 = first_call(*sim_, "-i 0 -mig 0");
  ASSERT_NE(mig0, std::string::npos);
  EXPECT_LT(dci, dgi);
  EXPECT_LT(dgi, mig0);
  auto done = off.check();
  ASSERT_TRUE(done);
  EXPECT_TRUE(*done);
}

TEST_F(MigStep, AProfileThisCardDoesNotOfferIsNamedWithWhatItOffers) {
  make();
  // 1g.10gb is an H100 80GB's small slice, not an H200's.
  StepHarness h(sim_->env(), mig_spec({{"instances", {{"1g.10gb", 7}}}}));
  auto a = h.apply();
  ASSERT_EQ(a.kind, StepOutcome::Kind::failed) << describe(a);
  EXPECT_NE(a.message.find("offers no MIG profile 1g.10gb"), std::string::npos) << a.message;
  EXPECT_NE(a.message.find("1g.18gb"), std::string::npos) << a.message;
  EXPECT_EQ(smi_calls(*sim_, "-cgi").size(), 0u);
}

TEST_F(MigStep, TheRunbooksL4HasNoMig) {
  make("l4");
  // The L4 needs its driver first for nvidia-smi to answer at all.
  StepHarness drv(sim_->env(), catalog_step("gpu-vm", "nvidia-driver"));
  ASSERT_EQ(drv.apply().kind, StepOutcome::Kind::reboot_required);
  ASSERT_EQ(sim_->reboot().exit_code, 0);
  ASSERT_TRUE(drv.verify().ok());

  StepHarness h(sim_->env(), mig_spec(kSevenSmall));
  auto a = h.apply();
  ASSERT_EQ(a.kind, StepOutcome::Kind::failed) << describe(a);
  ASSERT_TRUE(a.diagnosis);
  EXPECT_EQ(a.diagnosis->code, "mig_not_supported");
  EXPECT_NE(a.diagnosis->summary.find("NVIDIA L4"), std::string::npos) << a.diagnosis->summary;
  EXPECT_EQ(smi_calls(*sim_, "-mig 1").size(), 0u);
}

TEST_F(MigStep, ParamsAreCheckedWhereEveryKindsAre) {
  make();
  agent::StepRegistry reg;
  agent::register_builtin_steps(reg);
  auto refused = [&](nlohmann::json p, const std::string& what) {
    auto s = reg.create(mig_spec(std::move(p)));
    ASSERT_FALSE(s) << what;
    EXPECT_NE(s.error().message.find(what), std::string::npos) << s.error().message;
  };
  refused(nlohmann::json::object(), "params.instances: must name at least one profile");
  refused({{"instances", {{"1g.18GB", 7}}}}, "params.instances.1g.18GB: is not a MIG profile");
  refused({{"instances", {{"1g.18gb", 0}}}}, "must be a count from 1 to 7");
  refused({{"instances", {{"3g.71gb", 2}, {"1g.18gb", 2}}}}, "asks for 8 compute slices");
  refused({{"gpu", -1}, {"instances", {{"1g.18gb", 1}}}}, "params.gpu");
  refused({{"instances", {{"1g.18gb", 1}}}, {"count", 1}}, "params: unknown key 'count'");
}

}  // namespace
}  // namespace factory::testing
