// The whole gpu-vm tier, as the catalog defines it, run by the plan engine
// with the built-in step kinds on the simulated runbook guest (tests/guestsim;
// NOT a real guest): the driver's reboot in the middle (a new engine resumes
// after it, as the agent does at boot), then health shows the runbook's end
// state: the L4 at driver 615.71.09 and llama3.2:1b 100% on the GPU. Running
// the finished plan again changes nothing.
#include <gtest/gtest.h>

#include "agent/health/gpu_health.hpp"
#include "agent/plan/engine.hpp"
#include "tests/agent/step_harness.hpp"
#include "tests/guestsim/guest_sim.hpp"

namespace factory::testing {
namespace {

using agent::PlanEngine;

agent::StepRegistry builtin_registry() {
  agent::StepRegistry reg;
  agent::register_builtin_steps(reg);
  return reg;
}

TEST(GpuVmTier, RunbookGuestEndToEndThroughThePlanEngine) {
  TempDir dir("tier");
  GuestSim sim(dir.path());
  auto path = sim.activate();
  auto cat = catalog::builtin();
  ASSERT_TRUE(cat) << cat.error().message;
  auto tier = cat->tier("gpu-vm");
  ASSERT_TRUE(tier);
  nlohmann::json plan = (*tier)->plan();

  std::vector<nlohmann::json> events;
  auto sink = [&](nlohmann::json e) { events.push_back(std::move(e)); };
  bool reboot_requested = false;
  auto reboot_hook = [&]() -> Status {
    reboot_requested = true;
    return ok_status();  // the guest reboots "later": below, before the new engine starts
  };
  agent::PlanEngineOptions opts;
  opts.sleep = [](std::chrono::milliseconds) {};

  {
    PlanEngine first(sim.env(), builtin_registry(), sink, reboot_hook, opts);
    auto out = first.run(plan);
    ASSERT_EQ(out, PlanEngine::Outcome::rebooting) << first.status_json().dump(2);
    EXPECT_TRUE(reboot_requested);
  }
  ASSERT_EQ(sim.reboot().exit_code, 0);

  // The agent after boot: a new engine over the same journal.
  PlanEngine after(sim.env(), builtin_registry(), sink, reboot_hook, opts);
  auto out = after.resume();
  ASSERT_EQ(out, PlanEngine::Outcome::succeeded) << after.status_json().dump(2);

  auto status = after.status_json();
  EXPECT_EQ(status["state"], "succeeded");
  for (const auto& s : status["steps"]) EXPECT_EQ(s["state"], "succeeded") << s.dump(2);

  // Every effect once.
  EXPECT_EQ(sim.counter("reboot"), 1);
  EXPECT_EQ(sim.counter("apt-get.install.nvidia-headless-open"), 1);
  EXPECT_EQ(sim.counter("apt-get.install.nvidia-persistenced"), 1);
  EXPECT_EQ(sim.counter("dkms.build"), 1);
  EXPECT_EQ(sim.counter("ollama.install"), 1);
  EXPECT_EQ(sim.counter("ollama.download_complete.llama3.2:1b"), 1);

  // Progress of the model pull reached the event stream.
  bool pull_progress = false;
  for (const auto& e : events)
    pull_progress |= e.value("state", "") == "progress" && e.contains("percent");
  EXPECT_TRUE(pull_progress);

  // The runbook's end state, as health reports it.
  auto gpu = agent::collect_gpu_health(sim.env());
  EXPECT_EQ(gpu["driver_version"], "615.71.09") << gpu.dump(2);
  ASSERT_EQ(gpu["gpus"].size(), 1u);
  EXPECT_EQ(gpu["gpus"][0]["name"], "NVIDIA L4");
  EXPECT_EQ(gpu["gpus"][0]["memory_total_mib"], 23034);
  EXPECT_EQ(gpu["gpus"][0]["memory_used_mib"], 1670);  // the model is resident
  auto ollama = agent::collect_ollama_health(sim.env());
  EXPECT_EQ(ollama["version"], "0.40.2");
  ASSERT_EQ(ollama["models"].size(), 1u);
  EXPECT_EQ(ollama["models"][0]["name"], "llama3.2:1b");
  EXPECT_EQ(ollama["models"][0]["gpu_percent"], 100);

  // The same plan again: already applied, nothing runs.
  std::string before = sim.counters();
  PlanEngine again(sim.env(), builtin_registry(), sink, reboot_hook, opts);
  EXPECT_EQ(again.run(plan), PlanEngine::Outcome::succeeded);
  EXPECT_EQ(sim.counters(), before);
}

TEST(GpuVmTier, StopsAtTheFirstStepWhenTheCardIsMissing) {
  TempDir dir("tier");
  GuestSim sim(dir.path(), {"none", 0});
  auto path = sim.activate();
  auto cat = catalog::builtin();
  ASSERT_TRUE(cat);
  nlohmann::json plan = (*cat->tier("gpu-vm"))->plan();
  agent::PlanEngineOptions opts;
  opts.sleep = [](std::chrono::milliseconds) {};
  PlanEngine engine(
      sim.env(), builtin_registry(), [](nlohmann::json) {}, [] { return ok_status(); }, opts);
  ASSERT_EQ(engine.run(plan), PlanEngine::Outcome::failed);
  auto status = engine.status_json();
  const auto& first = status["steps"][0];
  EXPECT_EQ(first["id"], "gpu-present");
  EXPECT_EQ(first["state"], "failed");
  EXPECT_EQ(first["diagnosis"]["code"], "gpu_not_on_pci_bus") << first.dump(2);
  EXPECT_EQ(status["steps"][1]["state"], "pending") << status.dump(2);
  EXPECT_EQ(sim.counter("apt-get.update"), 0);
}

}  // namespace
}  // namespace factory::testing
