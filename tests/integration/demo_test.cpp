// The README's main job (`make demo`) as a test: coordinator with its file
// store, the Kubernetes API test double playing KubeVirt, `factory tenant
// create tenant-1 --tier gpu-vm --wait` (tenant-2 --tier gpu-k8s, t5 --tier
// model-endpoint and one chat completion through its endpoint), and a
// simulated guest running the
// rendered user-data (agent downloaded from the coordinator, hash checked),
// enrolling and provisioning itself through the driver's reboot (counted).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/support/test_support.hpp"

using namespace factory::testing;
namespace fs = std::filesystem;

namespace {
// The tenant of that name in a list of them ({} when it is missing).
nlohmann::json by_name(const nlohmann::json& list, const std::string& name) {
  for (const auto& t : list)
    if (t.value("name", "") == name) return t;
  ADD_FAILURE() << "no tenant " << name << " in " << list.dump().substr(0, 2000);
  return nlohmann::json::object();
}

int count(const std::string& hay, const std::string& needle) {
  int n = 0;
  for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) ++n;
  return n;
}
}  // namespace

TEST(Demo, BothTiersBecomeReadyWithTheirGpus) {
  TempDir dir("demo");
  auto r = run({"/bin/bash", (source_dir() / "scripts/demo.sh").string(), FACTORY_BINARY_DIR},
               std::chrono::minutes(6), {{"FACTORY_DEMO_OUT", dir.path().string()}});
  ASSERT_EQ(r.exit_code, 0) << r.output << slurp(dir.path() / "coordinator.log").substr(0, 4000);
  EXPECT_NE(r.output.find("SIMULATED"), std::string::npos) << "the output says what is simulated";
  auto status = nlohmann::json::parse(slurp(dir.path() / "status.json"));
  ASSERT_EQ(status["tenants"].size(), 3u);
  auto t = by_name(status["tenants"], "tenant-1");
  EXPECT_EQ(t["name"], "tenant-1");
  EXPECT_EQ(t["phase"], "ready");
  EXPECT_EQ(t["tier"], "gpu-vm");
  EXPECT_TRUE(t["agent"]["connected"]);
  auto& gpu = t["health"]["gpu"];
  ASSERT_EQ(gpu["gpus"].size(), 1u);
  EXPECT_EQ(gpu["gpus"][0]["name"], "NVIDIA L4");
  EXPECT_EQ(gpu["gpus"][0]["memory_total_mib"], 23034);
  EXPECT_EQ(gpu["driver_version"], "615.71.09");
  auto& models = t["health"]["ollama"]["models"];
  ASSERT_EQ(models.size(), 1u);
  EXPECT_EQ(models[0]["name"], "llama3.2:1b");
  EXPECT_EQ(models[0]["gpu_percent"], 100);
  EXPECT_EQ(models[0]["size"], models[0]["size_vram"]);
  // Every step done, through the driver's reboot exactly once: the simulated
  // guest counts its reboots, and the agent ran once before it and once after.
  for (auto& [id, step] : t["plan"]["steps"].items())
    EXPECT_TRUE(step["state"] == "succeeded" || step["state"] == "skipped") << id << ": " << step;
  const auto guests = dir.path() / "work/guests";
  EXPECT_EQ(slurp(guests / "tenant-1/root/.guestsim/state/counters/reboot"), "1\n");
  EXPECT_EQ(count(slurp(dir.path() / "tenant-1-agent.log"), "---- agent start "), 2);
  // tenant-2: the catalog's second item on the runbook's tenant-2 guest. The
  // GPU Operator brings its own driver: no reboot.
  auto k = by_name(status["tenants"], "tenant-2");
  EXPECT_EQ(k["name"], "tenant-2");
  EXPECT_EQ(k["tier"], "gpu-k8s");
  EXPECT_EQ(k["phase"], "ready");
  EXPECT_EQ(k["health"]["k8s"]["resource"], "nvidia.com/gpu");
  EXPECT_EQ(k["health"]["k8s"]["allocatable"], 10) << "HAMi splits the one card ten ways";
  EXPECT_EQ(k["health"]["gpu"]["driver_version"], "580.126.20") << "the GPU Operator's driver";
  EXPECT_FALSE(fs::exists(guests / "tenant-2/root/.guestsim/state/counters/reboot"));
  // Nothing reached a guard in either guest (vm_runner.py would have failed
  // the demo, but say so here too).
  for (const char* g : {"tenant-1", "tenant-2"})
    EXPECT_EQ(slurp(guests / g / "root/.guestsim/log/guarded.log"), "") << g;
  auto agent_log = slurp(dir.path() / "tenant-1-agent.log");
  EXPECT_NE(agent_log.find("enrolled as tenant tenant-1"), std::string::npos);
  auto cloud = slurp(dir.path() / "tenant-1-cloud-init-output.log");
  EXPECT_NE(cloud.find("(exit 0)"), std::string::npos) << cloud;
  // `factory usage` at the demo's end: GPU time counted for every tenant,
  // from the Kubernetes double's VMI timestamps (docs/usage.md).
  auto usage = nlohmann::json::parse(slurp(dir.path() / "usage.json"));
  for (const std::string name : {"tenant-1", "tenant-2", "t5"}) {
    auto u = by_name(usage["tenants"], name);
    EXPECT_EQ(u["gpu_model"], "nvidia.com/AD104GL_L4") << u;
    EXPECT_GT(u.value("gpu_seconds", 0), 0) << u;
    EXPECT_TRUE(u["keys"].is_array()) << u;
    EXPECT_EQ(u["project"], "default") << u;
  }
  // t5's one chat completion, counted under its default key from the stand-in
  // Ollama's own counts, as its agent reported them (a durable event).
  auto t5_keys = by_name(usage["tenants"], "t5")["keys"];
  ASSERT_EQ(t5_keys.size(), 1u) << t5_keys;
  EXPECT_EQ(t5_keys[0]["name"], "default");
  EXPECT_GE(t5_keys[0].value("requests", 0), 1) << t5_keys;
  EXPECT_GT(t5_keys[0].value("completion_tokens", 0), 0) << t5_keys;
  EXPECT_NE(r.output.find("GPU-SECONDS"), std::string::npos) << "the demo prints factory usage";
  EXPECT_NE(r.output.find("PROMPT TOKENS"), std::string::npos) << "and t5's tokens per key";
  // The metrics the status feed serves are valid Prometheus text (promtool),
  // with the DCGM series of both tenants' GPUs.
  const std::string metrics = slurp(dir.path() / "metrics.txt");
  EXPECT_EQ(promtool_complaints(metrics), "");
  EXPECT_NE(metrics.find("factory_tenants{phase=\"ready\"} 3"), std::string::npos);
  for (const std::string t : {"tenant-1", "tenant-2"}) {
    bool found = false;
    std::istringstream lines(metrics);
    for (std::string l; std::getline(lines, l);)
      found |= l.rfind("DCGM_FI_DEV_FB_USED{gpu=\"0\",UUID=\"GPU-", 0) == 0 &&
               l.find("modelName=\"NVIDIA L4\"") != std::string::npos &&
               l.find("tenant=\"" + t + "\"") != std::string::npos;
    EXPECT_TRUE(found) << t << "'s GPU in DCGM_FI_DEV_FB_USED:\n" << metrics;
  }
  EXPECT_NE(metrics.find("factory_tenant_allocatable_gpus{tenant=\"tenant-2\",tier=\"gpu-k8s\","
                         "resource=\"nvidia.com/gpu\"} 10"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("factory_ollama_model_gpu_ratio{tenant=\"tenant-1\",tier=\"gpu-vm\","
                         "model=\"llama3.2:1b\"} 1"),
            std::string::npos)
      << metrics;
  // The status feed as the demo recorded it: GET /v1/tenants, the event
  // stream of the whole run, and the dashboard in Chromium.
  auto tenants = nlohmann::json::parse(slurp(dir.path() / "tenants.json"));
  ASSERT_EQ(tenants["tenants"].size(), 3u);
  for (const auto& each : tenants["tenants"])
    EXPECT_TRUE(each["health"].is_object()) << each.value("name", "");
  // t5, the runbook's third customer: a keyed model API, no login. The demo
  // printed one chat completion through its endpoint and the 401 without the key.
  auto e = by_name(status["tenants"], "t5");
  EXPECT_EQ(e["tier"], "model-endpoint");
  EXPECT_EQ(e["phase"], "ready");
  auto chat = nlohmann::json::parse(slurp(dir.path() / "t5-chat-completion.json"), nullptr, false);
  EXPECT_EQ(chat.value("object", ""), "chat.completion")
      << slurp(dir.path() / "t5-chat-completion.json");
  EXPECT_NE(r.output.find("without the key: HTTP 401"), std::string::npos) << r.output;
  auto t5 = nlohmann::json::parse(slurp(dir.path() / "t5.json"));
  EXPECT_EQ(t5["endpoint"]["answers"], true) << t5["endpoint"].dump();
  EXPECT_NE(metrics.find("factory_endpoint_up{tenant=\"t5\",tier=\"model-endpoint\"} 1"),
            std::string::npos)
      << metrics;
  const std::string events = slurp(dir.path() / "events.txt");
  for (const std::string t : {"tenant-1", "tenant-2"}) {
    bool connect = false, health = false, ready = false;
    std::istringstream in(events);
    std::string type;
    for (std::string l; std::getline(in, l);) {
      if (l.rfind("event: ", 0) == 0) type = l.substr(7);
      if (l.rfind("data: ", 0) != 0) continue;
      auto d = nlohmann::json::parse(l.substr(6), nullptr, false);
      if (d.is_discarded() || d.value("tenant", "") != t) continue;
      connect |= type == "agent" && d.value("connected", false);
      health |= type == "health";
      ready |= type == "phase" && d.value("phase", "") == "ready";
    }
    EXPECT_TRUE(connect && health && ready)
        << t << ": connect " << connect << ", health " << health << ", ready " << ready << "\n"
        << events.substr(0, 4000);
  }
  if (run({"/bin/sh", "-c", "command -v chromium"}).exit_code == 0) {
    const std::string png = slurp(dir.path() / "dashboard.png");
    EXPECT_GT(png.size(), 10000u) << slurp(dir.path() / "dashboard-probe.log");
    EXPECT_EQ(png.substr(1, 3), "PNG");
  } else {
    EXPECT_NE(r.output.find("skipping build/demo/dashboard.png: chromium"), std::string::npos)
        << r.output;
  }
  // No process of the run is left behind.
  auto ps = run({"/bin/sh", "-c",
                 "ps -eo args | grep -F '" + dir.path().string() + "' | grep -v grep || true"});
  EXPECT_EQ(ps.output, "") << "left running:\n" << ps.output;
}

// A simulator that breaks stops the demo at once with its reason (here the
// guest simulator has no captures to answer with): vm_runner.py exits 1 and
// the demo says why, instead of waiting out `tenant create --wait`'s 3 minutes.
TEST(Demo, ABrokenSimulatorStopsItAtOnceSayingWhy) {
  TempDir dir("demo-broken");
  const auto start = std::chrono::steady_clock::now();
  auto r = run({"/bin/bash", (source_dir() / "scripts/demo.sh").string(), FACTORY_BINARY_DIR},
               std::chrono::minutes(2),
               {{"FACTORY_DEMO_OUT", dir.path().string()},
                {"FACTORY_FIXTURES_DIR", (dir.path() / "no-fixtures").string()}});
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("the VM simulator stopped"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("no fixtures at " + (dir.path() / "no-fixtures").string()),
            std::string::npos)
      << r.output;
  EXPECT_LT(took, std::chrono::seconds(60)) << "it waited for the tenant instead";
  auto ps = run({"/bin/sh", "-c",
                 "ps -eo args | grep -F '" + dir.path().string() + "' | grep -v grep || true"});
  EXPECT_EQ(ps.output, "") << "left running:\n" << ps.output;
}
