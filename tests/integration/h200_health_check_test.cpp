// scripts/h200-health-check.sh, the check the lead runs on the H200 VM, run
// here on the simulated H200 guest (its nvidia-smi answers with the real
// machine's captures): it runs the agent and nvidia-smi back to back, keeps
// what they printed, prints both and the verdict, and says plainly when
// they differ. The comparison itself is replayed on the committed captures
// in tests/agent/health_compare_test.cpp.
#include <gtest/gtest.h>

#include "tests/agent/fake_nvml.hpp"
#include "tests/guestsim/guest_sim.hpp"
#include "tests/support/test_support.hpp"

using namespace factory::testing;
namespace fs = std::filesystem;

namespace {

factory::CommandResult run_check(const GuestSim& sim, const fs::path& out) {
  return run({"/bin/bash", (source_dir() / "scripts/h200-health-check.sh").string(), out.string()},
             std::chrono::seconds(60),
             {{"PATH", sim.path()},
              {"FACTORY_AGENT", agent_bin()},
              {"FACTORY_HEALTH_ROOT", sim.root().string()}});
}

TEST(H200HealthCheck, AgreesWhenTheAgentReadsWhatNvidiaSmiReads) {
  TempDir dir("h200-check");
  GuestSim sim(dir.path(), {"h200", 0});
  auto out = dir.path() / "out";
  auto r = run_check(sim, out);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("VERDICT: agree"), std::string::npos) << r.output;
  // Both outputs are shown, and kept with the commands that made them.
  EXPECT_NE(r.output.find("==== factory-agent health -o json --raw"), std::string::npos);
  EXPECT_NE(r.output.find("143771, 0, 616, 143156"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Reserved                                       : 616 MiB"),
            std::string::npos)
      << r.output;
  for (const char* f : {"agent-health.json", "nvidia-smi-query-gpu.csv", "nvidia-smi-q-memory.txt",
                        "verdict.txt", "verdict.json", "env.txt", "COMMANDS"})
    EXPECT_TRUE(fs::exists(out / f)) << f;
  auto verdict = nlohmann::json::parse(slurp(out / "verdict.json"));
  EXPECT_EQ(verdict["verdict"], "agree");
  EXPECT_GE(verdict["checks"].size(), 15u) << "11 query fields and 4 -q memory figures";
}

TEST(H200HealthCheck, SaysSoWhenTheyDiffer) {
  TempDir dir("h200-check");
  GuestSim sim(dir.path(), {"h200", 0});
  // An NVML without v2 memory info (the old reading: the reserved memory
  // counted as used) on the simulated machine.
  auto so = factory::agent::build_fake_nvml(
      dir.path(), factory::agent::fake_nvml_source("int nvmlDeviceGetMemoryInfo_v2"));
  factory::agent::install_fake_nvml(sim.root(), so);
  auto r = run_check(sim, dir.path() / "out");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("VERDICT: differ"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"memory_used_mib\": 616"), std::string::npos) << r.output;
}

TEST(H200HealthCheck, NeedsTheAgentBesideIt) {
  TempDir dir("h200-check");
  auto r = run({"/bin/bash", (source_dir() / "scripts/h200-health-check.sh").string(),
                (dir.path() / "out").string()},
               std::chrono::seconds(30), {{"FACTORY_AGENT", (dir.path() / "nope").string()}});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("put the binary beside this script"), std::string::npos) << r.output;
}

}  // namespace
