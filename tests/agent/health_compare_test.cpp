// The H200 check's comparison (agent/health/compare.hpp,
// scripts/h200-health-check.sh) replayed on committed captures of a real
// H200 VM (tests/fixtures/real/h200-passthrough-vm/2026-12-01): nvidia-smi's
// --query-gpu and -q against what the agent reports through NVML (the
// stand-in library, fake_nvml.hpp, holding that machine's figures). With v2
// memory info they agree; with v1 only (its "used" holds the reserved 616 MiB) the
// check says memory differs, which is what the lead's run on the device
// must not show.
#include <gtest/gtest.h>

#include "agent/health/compare.hpp"
#include "agent/health/nvml.hpp"
#include "agent/health/report.hpp"
#include "tests/agent/fake_nvml.hpp"
#include "tests/support/test_support.hpp"

namespace factory::agent {
namespace {

using factory::testing::fixtures_dir;
using factory::testing::slurp;
using nlohmann::json;

const char* kDevice = "h200-passthrough-vm/2026-12-01/";

// The capture's --format=csv with its header, as the fields it names.
std::vector<std::string> header_fields(const std::string& csv) {
  std::vector<std::string> out;
  std::istringstream in(csv.substr(0, csv.find('\n')));
  for (std::string f; std::getline(in, f, ',');) {
    while (!f.empty() && f.front() == ' ') f.erase(0, 1);
    out.push_back(f.substr(0, f.find(" [")));
  }
  return out;
}

// What `factory-agent health -o json` prints on a guest whose NVML is the
// stand-in built from `source`.
json agent_sample(const factory::testing::TempDir& dir, const std::string& source) {
  auto so = build_fake_nvml(dir.path(), source);
  GuestEnv env;
  env.root = dir.path() / "root";
  install_fake_nvml(env.root, so);
  return collect_health(env, {});
}

SmiComparison compare_with_capture(const json& agent) {
  std::string csv = slurp(fixtures_dir() / (std::string(kDevice) + "nvidia-smi-query-gpu.csv"));
  auto smi = parse_nvidia_smi_csv_with_header(csv);
  EXPECT_TRUE(smi) << smi.error().message;
  auto memory = parse_nvidia_smi_q_memory(
      slurp(fixtures_dir() / (std::string(kDevice) + "nvidia-smi-q.txt")));
  return compare_with_nvidia_smi(agent, *smi, header_fields(csv), memory);
}

const FigureCheck* find(const SmiComparison& c, const std::string& figure) {
  for (const auto& x : c.checks)
    if (x.figure == figure) return &x;
  return nullptr;
}

TEST(HealthCompare, AgentThroughNvmlV2AgreesWithTheDeviceCaptures) {
  factory::testing::TempDir dir("compare");
  json agent = agent_sample(dir, fake_nvml_source());
  ASSERT_EQ(agent["gpu"]["source"], "nvml") << agent.dump(2);
  auto c = compare_with_capture(agent);
  EXPECT_TRUE(c.ok()) << c.to_text();
  // Memory from both of nvidia-smi's outputs, exactly; the rest within tolerance.
  for (const char* f : {"memory.total", "memory.used", "memory.free", "FB Memory Total",
                        "FB Memory Reserved", "FB Memory Used", "FB Memory Free"}) {
    const FigureCheck* x = find(c, f);
    ASSERT_NE(x, nullptr) << f << "\n" << c.to_text();
    EXPECT_EQ(x->tolerance, "exact");
    EXPECT_TRUE(x->ok) << f;
  }
  EXPECT_EQ(find(c, "FB Memory Reserved")->agent, "616");
  EXPECT_EQ(find(c, "FB Memory Used")->agent, "0");
  for (const char* f : {"temperature.gpu", "power.draw", "clocks.current.sm", "pstate",
                        "mig.mode.current", "ecc.errors.uncorrected.volatile.total"})
    EXPECT_NE(find(c, f), nullptr) << f;
  EXPECT_NE(c.to_text().find("VERDICT: agree"), std::string::npos);
  EXPECT_EQ(c.to_json()["verdict"], "agree");
}

TEST(HealthCompare, V1MemoryInfoIsCaughtAsTheBugItWas) {
  factory::testing::TempDir dir("compare");
  json agent = agent_sample(dir, fake_nvml_source("int nvmlDeviceGetMemoryInfo_v2"));
  EXPECT_EQ(agent["gpu"]["gpus"][0]["memory_used_mib"], 616);
  auto c = compare_with_capture(agent);
  EXPECT_FALSE(c.ok());
  EXPECT_FALSE(find(c, "memory.used")->ok);
  EXPECT_EQ(find(c, "memory.used")->agent, "616");
  EXPECT_EQ(find(c, "memory.used")->nvidia_smi, "0");
  EXPECT_FALSE(find(c, "FB Memory Reserved")->ok) << "reserved unknown is not 616";
  EXPECT_NE(c.to_text().find("VERDICT: differ"), std::string::npos) << c.to_text();
}

TEST(HealthCompare, TheOldAgentsDeviceCaptureDiffersOnUsedMemory) {
  // tests/fixtures/device/h200-2026-11-30/agent-health.json: the agent before
  // v2 memory info, on the H200 VM (nvidia-smi -q there: Used 0 MiB).
  json old = json::parse(slurp(factory::testing::source_dir() /
                               "tests/fixtures/device/h200-2026-11-30/agent-health.json"));
  GpuReport smi;
  GpuReading g;
  g.uuid = old["gpu"]["gpus"][0]["uuid"];
  g.memory_total_mib = 143771;
  g.memory_used_mib = 0;
  smi.gpus.push_back(g);
  auto c = compare_with_nvidia_smi(old, smi, {"memory.total", "memory.used"}, {});
  EXPECT_TRUE(find(c, "memory.total")->ok);
  EXPECT_FALSE(find(c, "memory.used")->ok);
  EXPECT_FALSE(c.ok());
}

TEST(HealthCompare, TolerancesAreStatedAndApplied) {
  GpuReport smi;
  GpuReading s;
  s.memory_total_mib = 1000;
  s.temperature_c = 40;
  s.power_draw_w = 100;
  s.sm_clock_mhz = 1000;
  smi.gpus.push_back(s);
  json agent = {{"gpu",
                 {{"gpus",
                   {{{"memory_total_mib", 999},
                     {"temperature_c", 43},
                     {"power_draw_w", 114.0},
                     {"sm_clock_mhz", 1300}}}}}}};
  auto c = compare_with_nvidia_smi(
      agent, smi, {"memory.total", "temperature.gpu", "power.draw", "clocks.sm"}, {});
  EXPECT_FALSE(find(c, "memory.total")->ok) << "memory is exact";
  EXPECT_TRUE(find(c, "temperature.gpu")->ok) << "3 C is within ±3 C";
  EXPECT_TRUE(find(c, "power.draw")->ok) << "14 W is within ±15 W";
  EXPECT_FALSE(find(c, "clocks.sm")->ok) << "30% is outside ±20%";
  // A GPU the agent does not see is a problem, not a pass.
  auto none =
      compare_with_nvidia_smi({{"gpu", {{"gpus", json::array()}}}}, smi, {"memory.total"}, {});
  EXPECT_FALSE(none.ok());
  EXPECT_FALSE(none.problems.empty());
}

}  // namespace
}  // namespace factory::agent
