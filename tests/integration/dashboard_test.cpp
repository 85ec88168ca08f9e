// The dashboard at / of the API port in headless Chromium (Debian's
// `chromium`, driven by tests/support/dashboard_probe.js): signed in with a
// read-only token, two tenants' cards as their agents reported them, a live
// update from /v1/events without a reload, and a guest's markup shown as
// text. The screenshot it takes is docs/dashboard.png.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <tuple>

#include "common/atomic_file.hpp"
#include "tests/integration/own_agent.hpp"
#include "tests/support/coordinator_harness.hpp"

using namespace factory::testing;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

const std::string kMarkup = "<img src=x onerror=\"window.__factory_xss=1\"><b>bold</b>";
// A right-to-left override (Trojan Source) and a left-to-right isolate:
// the coordinator keeps them as sent (they are text; a C0 control in a
// summary is dropped there), the CLI shows them escaped, and so must the
// page (issue 23, point 8).
const std::string kBidi =
    "\xe2\x80\xae"
    "fdp.exe\xe2\x81\xa6";

json vm_sample(int util, int temp) {
  return {{"time", "2026-12-01T00:00:00Z"},
          {"hostname", "tenant-1-vm"},
          {"gpu",
           {{"source", "nvml"},
            {"driver_version", "580.126.20"},
            {"gpus",
             {{{"index", 0},
               {"name", "NVIDIA H200"},
               {"uuid", "GPU-5a3c0f3e-0000-0000-0000-000000000001"},
               {"memory_total_mib", 143771},
               {"memory_used_mib", 9216},
               {"utilization_percent", util},
               {"temperature_c", temp},
               {"power_draw_w", 212.4},
               {"power_limit_w", 700.0}}}}}},
          {"ollama",
           {{"version", "0.5.7"},
            {"models",
             {{{"name", "llama3.2:1b"},
               {"size", 2000000000},
               {"size_vram", 2000000000},
               {"gpu_percent", 100}},
              {{"name", kMarkup}, {"size", 10}, {"size_vram", 5}, {"gpu_percent", 50}}}}}}};
}

json k8s_sample() {
  return {{"time", "2026-12-01T00:00:00Z"},
          {"hostname", "tenant-2-vm"},
          {"gpu",
           {{"source", "nvidia-smi"},
            {"gpus",
             {{{"index", 0},
               {"name", "NVIDIA L4"},
               {"uuid", "GPU-5a3c0f3e-0000-0000-0000-000000000002"},
               {"memory_total_mib", 23034},
               {"memory_used_mib", 512},
               {"utilization_percent", 3},
               {"temperature_c", 38}}}},
            {"diagnoses",
             {{{"code", "gpu_ecc_errors"},
               {"summary", "volatile uncorrected ECC errors " + kMarkup + kBidi},
               {"fix", "drain the node and reset the GPU"}}}}}},
          {"k8s", {{"resource", "nvidia.com/gpu"}, {"allocatable", 10}, {"capacity", 10}}}};
}

}  // namespace

TEST(Dashboard, ShowsTwoTenantsLiveInChromiumAndAGuestsMarkupAsText) {
  if (std::system("command -v chromium >/dev/null 2>&1") != 0)
    FAIL() << "chromium is not installed (scripts/install-deps.sh --test installs it)";
  TempDir dir("dashboard");
  CoordinatorHarness h(dir.path());
  h.start();
  OwnAgent a(h, "tenant-1"), b(h, "tenant-2");
  ASSERT_TRUE(a.enrolled() && b.enrolled());
  // What `factory tenant create` and their plans would have made of them
  // (this test has no cluster): tiers, a finished plan and one under way.
  h.stop();
  for (auto [name, tier, phase, done] : {std::tuple{"tenant-1", "gpu-vm", "ready", 6},
                                         std::tuple{"tenant-2", "gpu-k8s", "provisioning", 4}}) {
    auto rec = h.stored_record(name);
    ASSERT_TRUE(rec) << name;
    (*rec)["tier"] = tier;
    (*rec)["phase"] = phase;
    (*rec)["status"]["plan"] = {
        {"state", done == 6 ? "succeeded" : "running"}, {"steps_done", done}, {"steps_total", 6}};
    // tenant-2's host is being drained (docs/maintenance.md): its card says so.
    if (std::string(name) == "tenant-2")
      (*rec)["status"]["maintenance"] = {
          {"state", "noticed"}, {"node", "utho"}, {"deadline", "2099-12-05T09:00:00Z"}};
    h.write_stored_record(*rec);
  }
  h.start();
  auto sa = a.session({{"agent_version", "0.1.0"}, {"hostname", "tenant-1-vm"}});
  auto sb = b.session({{"agent_version", "0.1.0"}, {"hostname", "tenant-2-vm"}});
  ASSERT_TRUE(sa && sb);
  ASSERT_TRUE(a.send(*sa, "health", vm_sample(12, 40)));
  ASSERT_TRUE(b.send(*sb, "health", k8s_sample()));
  ASSERT_TRUE(eventually([&] {
    auto t1 = h.tenant("tenant-1"), t2 = h.tenant("tenant-2");
    return t1 && t2 && (*t1)["health"].is_object() && (*t2)["health"].is_object();
  }));

  auto made = h.factory({"token", "create", "--read-only"});
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const std::string ro = made.output.substr(0, made.output.find('\n'));
  ASSERT_EQ(ro.rfind("factory-ro-", 0), 0u) << made.output;
  auto token_file = dir.path() / "ro.token";
  ASSERT_TRUE(factory::write_file_atomic(token_file, ro + "\n", 0600).ok());

  const auto png = dir.path() / "dashboard.png";
  const auto log = dir.path() / "probe.log";
  Process probe({"/usr/bin/node", (source_dir() / "tests/support/dashboard_probe.js").string(),
                 "https://127.0.0.1:" + std::to_string(h.api_port()) + "/", token_file.string(),
                 png.string(), "2", "87%"},
                log, {{"NODE_PATH", "/usr/share/nodejs"}});
  ASSERT_TRUE(eventually(
      [&] { return slurp(log).find("READY ") != std::string::npos || !probe.running(); }, 60s))
      << slurp(log);
  ASSERT_NE(slurp(log).find("READY "), std::string::npos) << slurp(log);
  // The live update: tenant-1's GPU gets busy and warm.
  ASSERT_TRUE(a.send(*sa, "health", vm_sample(87, 63)));
  EXPECT_EQ(probe.wait(), 0) << slurp(log);
  const std::string out = slurp(log);
  auto at = out.find("UPDATED ");
  ASSERT_NE(at, std::string::npos) << out;
  auto shown = json::parse(out.substr(at + 8, out.find('\n', at) - at - 8));
  EXPECT_TRUE(shown["same_page"]) << "updated from the stream, not by a reload";
  EXPECT_FALSE(shown["injected"]) << "a guest's text became markup";
  EXPECT_EQ(shown["cookie_visible"], "") << "the session cookie is HttpOnly";
  ASSERT_EQ(shown["cards"].size(), 2u) << shown.dump(2);
  auto& c1 = shown["cards"][0];
  auto& c2 = shown["cards"][1];
  EXPECT_EQ(c1["tenant"], "tenant-1");
  EXPECT_EQ(c1["fields"]["tier"][0], "gpu-vm");
  EXPECT_EQ(c1["fields"]["phase"][0], "ready");
  EXPECT_EQ(c2["fields"]["tier"][0], "gpu-k8s");
  EXPECT_EQ(c2["fields"]["phase"][0], "provisioning 4/6");
  EXPECT_EQ(c1["fields"]["util"][0], "87%");
  EXPECT_EQ(c1["fields"]["temp"][0], "63 °C");
  EXPECT_EQ(c1["fields"]["memory"][0], "9.0 / 140.4 GiB");
  EXPECT_EQ(c1["fields"]["power"][0], "212 / 700 W");
  EXPECT_EQ(c1["fields"]["gpu-name"][0], "0: NVIDIA H200");
  EXPECT_EQ(c1["fields"]["agent"][0], "agent connected (0.1.0) on tenant-1-vm");
  ASSERT_EQ(c1["fields"]["model"].size(), 2u);
  EXPECT_EQ(c1["fields"]["model"][0], "llama3.2:1b — 100% on the GPU");
  EXPECT_EQ(c1["fields"]["model"][1], kMarkup + " — 50% on the GPU") << "shown as the text it is";
  EXPECT_EQ(c2["tenant"], "tenant-2");
  EXPECT_EQ(c2["fields"]["util"][0], "3%");
  EXPECT_EQ(c2["fields"]["slices"][0], "10 / 10 nvidia.com/gpu allocatable");
  EXPECT_EQ(c2["fields"]["maintenance"][0], "maintenance of utho: stops at 2099-12-05T09:00:00Z");
  EXPECT_FALSE(c1["fields"].contains("maintenance")) << "tenant-1 is under no drain";
  ASSERT_EQ(c2["fields"]["diagnosis"].size(), 1u);
  const std::string diag = c2["fields"]["diagnosis"][0];
  EXPECT_NE(diag.find("gpu_ecc_errors"), std::string::npos) << diag;
  EXPECT_NE(diag.find("fix: drain the node and reset the GPU"), std::string::npos) << diag;
  EXPECT_NE(diag.find(kMarkup), std::string::npos) << diag;
  EXPECT_NE(diag.find("\\u202efdp.exe\\u2066"), std::string::npos) << diag;
  EXPECT_EQ(diag.find("\xe2\x80\xae"), std::string::npos) << "the override itself never shows";
  // A PNG, of a page with something on it.
  const std::string img = slurp(png);
  ASSERT_GT(img.size(), 10000u);
  EXPECT_EQ(img.substr(1, 3), "PNG");
  // Kept for docs/dashboard.png (FACTORY_DASHBOARD_PNG names where).
  if (const char* keep = std::getenv("FACTORY_DASHBOARD_PNG"))
    std::filesystem::copy_file(png, keep, std::filesystem::copy_options::overwrite_existing);
}
