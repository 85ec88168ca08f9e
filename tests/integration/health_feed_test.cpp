// Health end to end with the real binaries on loopback: a factory-agent on a
// simulated H200 guest sends health as state (non-durable `health` frames,
// on its own 200 ms schedule, while its plan's step runs for minutes); the
// coordinator keeps the latest per tenant in memory, saves it coalesced (one
// row per tenant, surviving a restart) and shows it in /v1/tenants,
// `factory status` and /metrics under dcgm-exporter's names; a sample with
// fields out of bounds loses those fields, counted by reason.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "common/atomic_file.hpp"
#include "contract/protocol.hpp"
#include "tests/guestsim/guest_sim.hpp"
#include "tests/support/coordinator_harness.hpp"

using namespace factory::testing;
using namespace std::chrono_literals;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A catalog of one tier whose only step runs until the test says so (up to
// ten minutes), with Ollama in its health section.
const char* kSlowCatalog = R"(version: 1
tiers:
  - name: slow
    description: One step that takes minutes.
    vm: {cpu: "2", memory: 4Gi, disk: 20Gi, image: "https://example.invalid/i.img", gpus: 1, gpu_resource: ""}
    health:
      ollama: true
    steps:
      - id: long
        kind: script
        timeout: 15m
        params:
          run: i=0; while [ ! -f "$FACTORY_ROOT/go" ] && [ $i -lt 6000 ]; do sleep 0.1; i=$((i+1)); done
)";

std::string frame(const std::string& type, uint64_t seq, const json& body) {
  factory::proto::Envelope e;
  e.type = type;
  e.seq = seq;
  e.body = body;
  return factory::proto::serialize(e);
}

std::string metric_line(const std::string& metrics, const std::string& prefix,
                        const std::string& needle = "") {
  std::istringstream in(metrics);
  for (std::string l; std::getline(in, l);)
    if (l.rfind(prefix, 0) == 0 && l.find(needle) != std::string::npos) return l;
  return "";
}

class HealthFeed : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ofstream(dir_.path() / "slow.yaml") << kSlowCatalog;
    h_ = std::make_unique<CoordinatorHarness>(
        dir_.path(), "catalog: " + (dir_.path() / "slow.yaml").string() + "\n");
    sim_ = std::make_unique<GuestSim>(dir_.path() / "t1", GuestSim::Options{"h200", 0});
  }
  AgentOptions on_the_guest(std::vector<std::string> extra = {}) {
    AgentOptions o;
    o.state_dir_name = "agent-t1";
    o.root = sim_->root();
    o.path_env = sim_->path();
    o.extra_args = {"--health-interval", "0.2", "--ollama-url", sim_->ollama_url()};
    o.extra_args.insert(o.extra_args.end(), extra.begin(), extra.end());
    return o;
  }
  json health_of(const std::string& tenant) {
    auto t = h_->tenant(tenant);
    return t ? (*t)["health"] : json();
  }

  TempDir dir_{"health-feed"};
  std::unique_ptr<CoordinatorHarness> h_;
  std::unique_ptr<GuestSim> sim_;
};

TEST_F(HealthFeed, FlowsAsStateWhileTheStepRunsForMinutes) {
  h_->start();
  auto tok = h_->create_token("t1");
  // The tenant is of the slow tier: the coordinator sends its plan on hello.
  h_->stop();
  auto rec = h_->stored_record("t1");
  ASSERT_TRUE(rec);
  (*rec)["tier"] = "slow";
  h_->write_stored_record(*rec);
  h_->start();
  AgentProcess agent(*h_, tok, on_the_guest());

  auto step_state = [&] {
    auto t = h_->tenant("t1");
    // Before the agent's first progress the plan may have no steps yet (null).
    if (!t || !(*t)["plan"].is_object() || !(*t)["plan"]["steps"].is_object()) return std::string();
    const json& long_step = (*t)["plan"]["steps"]["long"];
    return long_step.is_object() ? long_step.value("state", "") : std::string();
  };
  ASSERT_TRUE(eventually([&] { return step_state() == "started"; }, 30s)) << agent.log();
  // While the step runs, samples keep arriving on the agent's 200 ms schedule.
  ASSERT_TRUE(eventually([&] { return health_of("t1").is_object(); }, 10s)) << agent.log();
  auto metrics = h_->metrics();
  auto samples = [&](const std::string& m) {
    auto l = metric_line(m, "factory_health_samples_total{tenant=\"t1\"}");
    return l.empty() ? 0.0 : std::stod(l.substr(l.rfind(' ') + 1));
  };
  double n0 = samples(metrics);
  std::string seen0 = health_of("t1").value("received_at", "");
  // The guest's figures do not change, so the agent sends one every
  // max_quiet (6) intervals: 1.2 s.
  ASSERT_TRUE(eventually([&] { return samples(h_->metrics()) >= n0 + 3; }, 15s)) << agent.log();
  EXPECT_EQ(step_state(), "started") << "health came while the step ran";

  json h = health_of("t1");
  EXPECT_EQ(h["hostname"], "vm");
  EXPECT_EQ(h["gpu"]["source"], "nvidia-smi");
  EXPECT_EQ(h["gpu"]["gpus"][0]["name"], "NVIDIA H200");
  EXPECT_EQ(h["gpu"]["gpus"][0]["memory_used_mib"], 0);
  EXPECT_EQ(h["gpu"]["gpus"][0]["memory_reserved_mib"], 616);
  EXPECT_TRUE(h["ollama"].is_object()) << "the tier's health section says Ollama";
  EXPECT_FALSE(h.contains("k8s"));
  EXPECT_NE(h.value("received_at", ""), "");
  EXPECT_FALSE(h.value("plan_hash", "").empty());
  auto t = *h_->tenant("t1");
  ASSERT_TRUE(t["active_diagnoses"].is_array());
  EXPECT_EQ(t["active_diagnoses"][0]["code"], "ollama_not_answering");
  EXPECT_EQ(t["active_diagnoses"][0]["source"], "health");

  // Health is not history: no event of it, and one row per tenant on disk.
  for (const auto& e : h_->stored_events("t1"))
    EXPECT_NE(e["event"].value("kind", ""), "health") << e.dump();

  // At a glance.
  auto table = h_->factory({"status"});
  EXPECT_EQ(table.exit_code, 0) << table.output;
  for (const char* want :
       {"TENANT", "TIER", "PHASE", "AGENT", FACTORY_VERSION, "GPU", "UTIL", "MEMORY", "TEMP",
        "MODELS/SLICES", "PROBLEMS", "t1", "slow", "provisioning 0/1", "NVIDIA H200", "0%",
        "0.0/140.4 GiB", "39C", "ollama_not_answering"})
    EXPECT_NE(table.output.find(want), std::string::npos) << want << "\n" << table.output;

  // The step ends; the plan's end is news the agent sends at once.
  std::ofstream(sim_->root() / "go") << "go\n";
  ASSERT_TRUE(
      eventually([&] { return h_->tenant("t1").value_or(json())["phase"] == "ready"; }, 30s));

  // Coalesced on disk, and there after a restart before the agent is back.
  agent.proc().stop();
  h_->stop();
  auto rows = h_->stored_health();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows["t1"]["gpu"]["gpus"][0]["memory_reserved_mib"], 616);
  h_->start();
  EXPECT_EQ(health_of("t1")["gpu"]["gpus"][0]["name"], "NVIDIA H200");
  (void)seen0;
}

TEST_F(HealthFeed, MetricsUseDcgmExportersNamesAndPassPromtool) {
  h_->start();
  AgentProcess agent(*h_, h_->create_token("t1"), on_the_guest({"--link-only"}));
  ASSERT_TRUE(eventually([&] { return health_of("t1").is_object(); }, 20s)) << agent.log();
  std::string m = h_->metrics();
  EXPECT_EQ(promtool_complaints(m), "") << m;
  const std::string labels =
      "{gpu=\"0\",UUID=\"GPU-0108b095-397f-7583-e087-ade158522fa2\",pci_bus_id=\"00000000:00:06."
      "0\","
      "device=\"nvidia0\",modelName=\"NVIDIA H200\",hostname=\"vm\",tenant=\"t1\",tier=\"\"}";
  for (const auto& [series, value] :
       std::vector<std::pair<std::string, std::string>>{{"DCGM_FI_DEV_GPU_UTIL", "0"},
                                                        {"DCGM_FI_DEV_MEM_COPY_UTIL", "0"},
                                                        {"DCGM_FI_DEV_FB_USED", "0"},
                                                        {"DCGM_FI_DEV_FB_FREE", "143156"},
                                                        {"DCGM_FI_DEV_FB_RESERVED", "616"},
                                                        {"DCGM_FI_DEV_GPU_TEMP", "39"},
                                                        {"DCGM_FI_DEV_MEMORY_TEMP", "39"},
                                                        {"DCGM_FI_DEV_POWER_USAGE", "128.51"},
                                                        {"DCGM_FI_DEV_SM_CLOCK", "1980"},
                                                        {"DCGM_FI_DEV_MEM_CLOCK", "3201"}})
    EXPECT_NE(m.find(series + labels + " " + value + "\n"), std::string::npos) << series << "\n"
                                                                               << m;
  for (const char* family :
       {"factory_tenants", "factory_agents_connected", "factory_plan_step_duration_seconds",
        "factory_events_ingested_total", "factory_enrollments_total",
        "factory_tenant_allocatable_gpus", "factory_ollama_model_gpu_ratio",
        "factory_agent_messages_rejected_total"})
    EXPECT_NE(m.find(std::string("# TYPE ") + family + " "), std::string::npos) << family;
  EXPECT_NE(m.find("factory_enrollments_total{result=\"accepted\"} 1\n"), std::string::npos);
  // Which version each connected agent runs (the agent reports its own).
  const std::string version = FACTORY_VERSION;
  EXPECT_NE(m.find("factory_agent_version_info{tenant=\"t1\",version=\"" + version + "\"} 1\n"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("factory_agents_by_version{version=\"" + version + "\"} 1\n"), std::string::npos)
      << m;
  // Every series the Grafana dashboard draws is one the coordinator serves.
  auto dashboard = json::parse(slurp(source_dir() / "deploy/grafana/factory-dashboard.json"));
  std::regex name_re("(DCGM_FI_DEV_[A-Z_]+|factory_[a-z_]+)");
  int exprs = 0;
  for (const auto& p : dashboard["panels"])
    for (const auto& t : p["targets"]) {
      std::string e = t["expr"];
      ++exprs;
      for (std::sregex_iterator it(e.begin(), e.end(), name_re), end; it != end; ++it) {
        std::string n = (*it)[1];
        if (n.size() > 7 && n.substr(n.size() - 7) == "_bucket") n.resize(n.size() - 7);
        EXPECT_NE(m.find("# TYPE " + n + " "), std::string::npos) << p["title"] << ": " << n;
      }
    }
  EXPECT_GT(exprs, 10);
  // --link-only runs no plan, but health all the same; no event at all.
  EXPECT_TRUE(h_->stored_events("t1").empty());
}

TEST_F(HealthFeed, FieldsOutOfBoundsAreDroppedAndCounted) {
  h_->start();
  AgentProcess rogue(*h_, h_->create_token("t1"), on_the_guest({"--link-only"}));
  ASSERT_TRUE(eventually([&] { return h_->agent_connected("t1"); }, 10s)) << rogue.log();
  auto id = json::parse(slurp(rogue.state_dir() / "identity.json"));
  auto cert = dir_.path() / "t1.crt";
  auto key = dir_.path() / "t1.key";
  ASSERT_TRUE(factory::write_file_atomic(cert, id["certificate"].get<std::string>(), 0600).ok());
  ASSERT_TRUE(factory::write_file_atomic(key, id["key"].get<std::string>(), 0600).ok());
  rogue.proc().stop();
  json sample = {{"time", "2026-12-01T00:00:00Z"},
                 {"hostname", "vm\x1b[2J"},
                 {"gpu",
                  {{"source", "nvml"},
                   {"gpus",
                    {{{"index", 0},
                      {"name", "NVIDIA H200"},
                      {"memory_total_mib", 143771},
                      {"memory_used_mib", -1},
                      {"utilization_percent", 900},
                      {"temperature_c", "warm"}}}}}}};
  auto r = wscat(h_->agents_url() + "/v1/agent", h_->state_dir() / "ca.crt",
                 {frame("hello", 1, json::object()), frame("health", 2, sample),
                  frame("heartbeat", 3, json::object())},
                 1.0, cert.string(), key.string());
  EXPECT_NE(r.output.find("\"ack\":3"), std::string::npos) << "the session went on\n" << r.output;
  ASSERT_TRUE(eventually(
      [&] {
        auto g = health_of("t1");
        return g.is_object() && g["gpu"]["gpus"].size() == 1 && g["time"] == "2026-12-01T00:00:00Z";
      },
      10s));
  json h = health_of("t1");
  const json& g = h["gpu"]["gpus"][0];
  EXPECT_EQ(g["memory_total_mib"], 143771) << "what was fine is kept";
  EXPECT_TRUE(g["memory_used_mib"].is_null());
  EXPECT_TRUE(g["utilization_percent"].is_null());
  EXPECT_TRUE(g["temperature_c"].is_null());
  EXPECT_EQ(h["hostname"], "") << "a terminal escape never reaches a page or a terminal";
  std::string m = h_->metrics();
  EXPECT_NE(
      m.find("factory_agent_messages_rejected_total{tenant=\"t1\",reason=\"out_of_range\"} 2\n"),
      std::string::npos)
      << m;
  // The reasons of every other message's reader (contract/guest_input.hpp).
  EXPECT_NE(
      m.find("factory_agent_messages_rejected_total{tenant=\"t1\",reason=\"wrong_type\"} 1\n"),
      std::string::npos);
  EXPECT_NE(
      m.find("factory_agent_messages_rejected_total{tenant=\"t1\",reason=\"bad_format\"} 1\n"),
      std::string::npos);
  EXPECT_EQ(h_->log().find("[2J"), std::string::npos) << "nor a log";
}

}  // namespace
