// The whole gpu-k8s-mig tier, as the built-in catalog defines it, run by the
// plan engine with the built-in step kinds on the simulated H200 guest
// (tests/guestsim, profile h200; NOT a real guest: RKE2, kubectl, helm, the
// GPU Operator's mig-manager and the card's MIG are stand-ins, see
// tests/guestsim/README.md and mig_sim.py). It ends with the node advertising
// the config's slices, allocatable nvidia.com/mig-1g.18gb: 7, and the card's
// seven MIG devices in nvidia-smi -L.
#include <gtest/gtest.h>

#include <sstream>

#include "agent/guest/mig.hpp"
#include "agent/health/gpu_health.hpp"
#include "agent/health/k8s_health.hpp"
#include "agent/plan/engine.hpp"
#include "tests/agent/step_harness.hpp"
#include "tests/guestsim/guest_sim.hpp"

namespace factory::testing {
namespace {

using agent::PlanEngine;
using nlohmann::json;

// The simulator has captures of the H200 at its own driver only (580.159.04,
// preinstalled in the real VM): the GPU Operator's driver pin is set to it,
// since a driver container of another version could only print made-up output.
json mig_plan() {
  auto cat = catalog::builtin();
  EXPECT_TRUE(cat) << cat.error().message;
  auto tier = cat->tier("gpu-k8s-mig");
  EXPECT_TRUE(tier);
  json plan = (*tier)->plan();
  for (auto& s : plan["steps"])
    if (s["id"] == "gpu-operator") {
      s["params"]["driver_version"] = "580.159.04";
      s["params"]["values"]["driver"]["version"] = "580.159.04";
    }
  return plan;
}

agent::PlanEngineOptions no_sleep() {
  agent::PlanEngineOptions opts;
  opts.sleep = [](std::chrono::milliseconds) {};
  return opts;
}

class GpuK8sMigTier : public ::testing::Test {
 protected:
  void SetUp() override {
    sim_ = std::make_unique<GuestSim>(dir_.path(), GuestSim::Options{"h200", 0});
    path_ = std::make_unique<GuestSim::PathScope>(sim_->path());
    sim_->set_knob("rke2_ready_delay", "0");
  }
  void TearDown() override {
    path_.reset();
    sim_.reset();
  }
  agent::StepRegistry registry() {
    agent::StepRegistry reg;
    agent::register_builtin_steps(reg);
    return reg;
  }
  TempDir dir_{"k8s-mig"};
  std::unique_ptr<GuestSim> sim_;
  std::unique_ptr<GuestSim::PathScope> path_;
};

TEST_F(GpuK8sMigTier, TheSimulatedH200ReachesReadyWithSevenSlicesAllocatable) {
  json plan = mig_plan();
  auto no_reboot = [] { return Status(Error(Errc::internal, "mig-manager applies it in place")); };
  PlanEngine engine(
      sim_->env(), registry(), [](json) {}, no_reboot, no_sleep());
  ASSERT_EQ(engine.run(plan), PlanEngine::Outcome::succeeded) << engine.status_json().dump(2);
  const json status = engine.status_json();
  std::vector<std::string> ids;
  for (const auto& s : status["steps"]) ids.push_back(s["id"]);
  EXPECT_EQ(ids, (std::vector<std::string>{"gpu-present", "rke2", "gpu-operator",
                                           "label-mig-config", "mig-allocatable"}));

  // The node: the config's slices, and the card no longer a whole nvidia.com/gpu.
  auto k8s = agent::collect_k8s_health(sim_->env(), "/etc/rancher/rke2/rke2.yaml",
                                       "nvidia.com/mig-1g.18gb");
  EXPECT_EQ(k8s["allocatable"], 7) << k8s.dump(2);
  auto whole = agent::collect_k8s_health(sim_->env());
  EXPECT_EQ(whole["allocatable"], nullptr) << whole.dump(2);

  // The card, as nvidia-smi in the guest shows it: MIG on, seven 1g.18gb devices.
  auto list = sim_->sh({"nvidia-smi", "-L"});
  ASSERT_EQ(list.exit_code, 0) << list.output;
  auto devs = agent::parse_mig_devices(list.output);
  ASSERT_TRUE(devs) << devs.error().message;
  ASSERT_EQ(devs->size(), 7u) << list.output;
  for (const auto& d : *devs) EXPECT_EQ(d.profile, "1g.18gb");
  auto mode = sim_->sh(
      {"nvidia-smi", "-i", "0", "--query-gpu=index,mig.mode.current", "--format=csv,noheader"});
  EXPECT_EQ(mode.output, "0, Enabled\n");

  // Health reports the mode and each slice with its profile and memory.
  auto gpu = agent::collect_gpu_health(sim_->env());
  ASSERT_EQ(gpu["gpus"].size(), 1u) << gpu.dump(2);
  EXPECT_EQ(gpu["gpus"][0]["mig_mode"], "Enabled");
  ASSERT_EQ(gpu["gpus"][0]["mig_instances"].size(), 7u) << gpu.dump(2);
  for (const auto& m : gpu["gpus"][0]["mig_instances"]) {
    EXPECT_EQ(m["profile"], "1g.18gb");
    EXPECT_EQ(m["memory_gib"], 16.0);
    EXPECT_EQ(m["uuid"].get<std::string>().rfind("MIG-", 0), 0u);
  }

  // Done is done: the same plan again changes nothing.
  std::string before = sim_->counters();
  PlanEngine again(
      sim_->env(), registry(), [](json) {}, no_reboot, no_sleep());
  EXPECT_EQ(again.run(plan), PlanEngine::Outcome::succeeded);
  EXPECT_EQ(sim_->counters(), before);
}

TEST_F(GpuK8sMigTier, WithoutTheLabelMigManagerCutsNothingAndTheWaitFails) {
  json plan = mig_plan();
  json steps = json::array();
  for (auto& s : plan["steps"])
    if (s["id"] != "label-mig-config") steps.push_back(s);
  steps.back()["timeout_seconds"] = 3;
  plan["steps"] = steps;
  PlanEngine engine(
      sim_->env(), registry(), [](json) {}, [] { return ok_status(); }, no_sleep());
  ASSERT_EQ(engine.run(plan), PlanEngine::Outcome::failed);
  auto last = engine.status_json()["steps"].back();
  EXPECT_EQ(last["id"], "mig-allocatable");
  EXPECT_EQ(last["state"], "failed");
  auto mode = sim_->sh(
      {"nvidia-smi", "-i", "0", "--query-gpu=index,mig.mode.current", "--format=csv,noheader"});
  EXPECT_EQ(mode.output, "0, Disabled\n");
}

}  // namespace
}  // namespace factory::testing
