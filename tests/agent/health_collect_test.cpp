// collect_gpu_health / collect_ollama_health on the simulated guest
// (tests/guestsim; its nvidia-smi answers with the real captures). NVML is
// absent under every simulated root unless a test puts the stand-in there
// (fake_nvml.hpp), so most of these exercise the nvidia-smi fallbacks; NVML
// itself is tested in health_parsers_test. And the deadlines: a collector
// that hangs is a diagnosis, never a wait.
#include <gtest/gtest.h>

#include <fstream>

#include "agent/health/gpu_health.hpp"
#include "agent/health/report.hpp"
#include "tests/agent/fake_nvml.hpp"
#include "tests/agent/step_harness.hpp"
#include "tests/guestsim/guest_sim.hpp"

namespace factory::testing {
namespace {

using nlohmann::json;

class Health : public ::testing::Test {
 protected:
  void make(const std::string& profile) {
    sim_ = std::make_unique<GuestSim>(dir_.path(), GuestSim::Options{profile, 0});
    path_ = std::make_unique<GuestSim::PathScope>(sim_->path());
  }
  void TearDown() override {
    path_.reset();
    sim_.reset();
  }
  // How often a stand-in ran (its lines in the simulator's call log).
  int calls_of(const std::string& name) const {
    std::ifstream in(sim_->root() / ".guestsim/log/calls.log");
    int n = 0;
    for (std::string line; std::getline(in, line);) n += line.rfind(name + " ", 0) == 0;
    return n;
  }
  static std::vector<std::string> codes(const json& j) {
    std::vector<std::string> out;
    if (j.contains("diagnoses"))
      for (const auto& d : j["diagnoses"]) out.push_back(d["code"]);
    return out;
  }

  TempDir dir_{"health"};
  std::unique_ptr<GuestSim> sim_;
  std::unique_ptr<GuestSim::PathScope> path_;
};

TEST_F(Health, H200ThroughNvidiaSmi) {
  make("h200");
  json h = agent::collect_gpu_health(sim_->env());
  EXPECT_EQ(h["source"], "nvidia-smi") << h.dump(2);
  EXPECT_EQ(h["driver_version"], "580.159.04");
  ASSERT_EQ(h["gpus"].size(), 1u);
  const json& g = h["gpus"][0];
  EXPECT_EQ(g["index"], 0);
  EXPECT_EQ(g["name"], "NVIDIA H200");
  EXPECT_EQ(g["uuid"], "GPU-0108b095-397f-7583-e087-ade158522fa2");
  EXPECT_EQ(g["pci_bus_id"], "00000000:00:06.0");
  EXPECT_EQ(g["memory_total_mib"], 143771);
  EXPECT_EQ(g["memory_used_mib"], 0);
  EXPECT_EQ(g["temperature_c"], 39);
  EXPECT_EQ(g["utilization_percent"], 0);
  EXPECT_FALSE(h.contains("diagnoses"));
  // The full query: every figure the captures hold.
  EXPECT_EQ(g["memory_reserved_mib"], 616);
  EXPECT_EQ(g["memory_free_mib"], 143156);
  EXPECT_EQ(g["memory_temperature_c"], 39);
  EXPECT_EQ(g["power_draw_w"], 128.51);
  EXPECT_EQ(g["power_limit_w"], 700.0);
  EXPECT_EQ(g["sm_clock_mhz"], 1980);
  EXPECT_EQ(g["memory_clock_mhz"], 3201);
  EXPECT_EQ(g["pstate"], "P0");
  EXPECT_EQ(g["ecc_errors_uncorrected_volatile"], 0);
  EXPECT_EQ(g["mig_mode"], "Disabled");
  EXPECT_EQ(g["processes"], json::array());
}

TEST_F(Health, H200ThroughNvmlWhenTheDriverHasIt) {
  // Built before the guest's PATH (which has no compiler) is in force.
  auto so = agent::build_fake_nvml(dir_.path(), agent::fake_nvml_source());
  make("h200");
  agent::install_fake_nvml(sim_->root(), so);
  json h = agent::collect_gpu_health(sim_->env());
  EXPECT_EQ(h["source"], "nvml") << h.dump(2);
  EXPECT_EQ(h["cuda_driver_version"], "13.0");
  EXPECT_EQ(h["gpus"][0]["memory_used_mib"], 0);
  // The real NVML's bytes, rounded up as nvidia-smi prints them (truncating
  // them gave 615 and 143155 where nvidia-smi said 616 and 143156).
  EXPECT_EQ(h["gpus"][0]["memory_reserved_mib"], 616);
  EXPECT_EQ(h["gpus"][0]["memory_free_mib"], 143156);
  EXPECT_EQ(h["gpus"][0]["memory_total_mib"], 143771);
  EXPECT_EQ(calls_of("nvidia-smi"), 0) << "NVML answered: nvidia-smi is not run";
}

// bench/agent-footprint.sh on the H200 found every sample loading NVML anew
// (dlopen, nvmlInit, nvmlShutdown, dlclose): 25 ms of CPU a sample and a
// 31 MB peak. It is loaded once and kept while it answers; a read that
// fails (the driver went away) drops it and the next sample loads it again.
TEST_F(Health, NvmlIsLoadedOnceAndKeptWhileItAnswers) {
  const auto inits = dir_.path() / "nvml-inits";
  const auto lost = dir_.path() / "driver-lost";
  std::string src = agent::fake_nvml_source();
  auto swap = [&](const std::string& from, const std::string& to) {
    auto at = src.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    src.replace(at, from.size(), to);
  };
  swap("int nvmlInit_v2(void) { ", "int nvmlInit_v2(void) { FILE* f = fopen(\"" + inits.string() +
                                       "\", \"a\"); if (f) { fputs(\"init\\n\", f); fclose(f); } ");
  // NVML_ERROR_DRIVER_NOT_LOADED (9) while the marker file exists.
  swap("int nvmlDeviceGetCount_v2(unsigned int* n) { ",
       "int nvmlDeviceGetCount_v2(unsigned int* n) { if (access(\"" + lost.string() +
           "\", F_OK) == 0) return 9;");
  src = "#include <stdio.h>\n" + src;
  auto so = agent::build_fake_nvml(dir_.path(), src);
  make("h200");
  agent::install_fake_nvml(sim_->root(), so);
  auto count_inits = [&] {
    std::ifstream in(inits);
    int n = 0;
    for (std::string line; std::getline(in, line);) n += line == "init";
    return n;
  };

  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(agent::collect_gpu_health(sim_->env())["source"], "nvml") << "sample " << i;
  EXPECT_EQ(count_inits(), 1) << "three samples, one nvmlInit";

  std::ofstream(lost) << "";
  EXPECT_NE(agent::collect_gpu_health(sim_->env())["source"], "nvml");
  std::filesystem::remove(lost);
  EXPECT_EQ(agent::collect_gpu_health(sim_->env())["source"], "nvml");
  EXPECT_EQ(count_inits(), 2) << "the failed read dropped it; the next sample loaded it again";
}

TEST_F(Health, RunbookL4AfterTheDriverStep) {
  make("l4");
  // Before the driver: no nvidia-smi anywhere.
  json before = agent::collect_gpu_health(sim_->env());
  EXPECT_EQ(before["source"], "none") << before.dump(2);
  EXPECT_EQ(codes(before), std::vector<std::string>{"nvidia_smi_not_on_path"});
  EXPECT_NE(before["error"].get<std::string>().find("nvml: NVML is not installed"),
            std::string::npos)
      << before["error"];

  StepHarness drv(sim_->env(), catalog_step("gpu-vm", "nvidia-driver"));
  ASSERT_EQ(drv.apply().kind, agent::StepOutcome::Kind::reboot_required);
  // Installed, not yet rebooted: nvidia-smi is there and fails as the real one does.
  json pending = agent::collect_gpu_health(sim_->env());
  EXPECT_EQ(pending["source"], "none");
  EXPECT_NE(pending["error"].get<std::string>().find("couldn't communicate with the NVIDIA driver"),
            std::string::npos)
      << pending["error"];
  sim_->reboot();

  json h = agent::collect_gpu_health(sim_->env());
  EXPECT_EQ(h["source"], "nvidia-smi") << h.dump(2);
  EXPECT_EQ(h["driver_version"], "615.71.09");
  ASSERT_EQ(h["gpus"].size(), 1u);
  EXPECT_EQ(h["gpus"][0]["name"], "NVIDIA L4");
  EXPECT_EQ(h["gpus"][0]["memory_total_mib"], 23034);
  EXPECT_EQ(h["gpus"][0]["temperature_c"], 47);
  EXPECT_EQ(h["gpus"][0]["pstate"], "P8");
  EXPECT_EQ(h["gpus"][0]["power_draw_w"], 17.0);
  // What no capture of the L4 shows stays unknown.
  EXPECT_TRUE(h["gpus"][0]["memory_reserved_mib"].is_null());
  EXPECT_TRUE(h["gpus"][0]["sm_clock_mhz"].is_null());
  EXPECT_TRUE(h["gpus"][0]["mig_mode"].is_null());
}

TEST_F(Health, GpuOperatorGuestGoesThroughTheDriverRoot) {
  make("l4-gpu-operator");
  json h = agent::collect_gpu_health(sim_->env());
  EXPECT_EQ(h["source"], "nvidia-smi") << h.dump(2);
  EXPECT_EQ(h["driver_version"], "580.126.20");
  EXPECT_EQ(h["via"], "chroot " + (sim_->root() / "run/nvidia/driver").string());
  ASSERT_EQ(h["gpus"].size(), 1u);
  EXPECT_EQ(h["gpus"][0]["name"], "NVIDIA L4");
  // The expected state of such a guest: said by `via`, not as a diagnosis
  // that would stand as a problem on a healthy tenant.
  EXPECT_TRUE(codes(h).empty()) << h.dump(2);
}

TEST_F(Health, NoCardIsAHealthStateWithItsDiagnosis) {
  make("none");
  json h = agent::collect_gpu_health(sim_->env());
  EXPECT_EQ(h["source"], "none");
  EXPECT_TRUE(h["gpus"].empty());
  EXPECT_TRUE(h["driver_version"].is_null());
  // The card never reached the guest: that, not the missing nvidia-smi, is
  // what an admin must fix (on the host).
  EXPECT_EQ(codes(h), std::vector<std::string>{"gpu_not_on_pci_bus"});
}

TEST_F(Health, NoDriverLoadedSaysWhy) {
  make("l4");
  sim_->set_knob("bar0", "");
  StepHarness drv(sim_->env(), catalog_step("gpu-vm", "nvidia-driver"));
  ASSERT_EQ(drv.apply().kind, agent::StepOutcome::Kind::reboot_required);
  sim_->reboot();
  json h = agent::collect_gpu_health(sim_->env());
  EXPECT_EQ(h["source"], "none") << h.dump(2);
  auto c = codes(h);
  EXPECT_NE(std::find(c.begin(), c.end(), "gpu_bar0_unmapped"), c.end()) << h.dump(2);
}

TEST_F(Health, WedgedNvidiaSmiIsADiagnosisWithinTheDeadline) {
  make("h200");
  sim_->set_knob("nvidia_smi_hang", "30");
  agent::HealthDeadlines d;
  d.gpu = std::chrono::milliseconds(1500);
  agent::HealthProbe probe(sim_->env(), d);
  auto t0 = std::chrono::steady_clock::now();
  auto h = probe.sample({});
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(took, std::chrono::seconds(5)) << "the sample waited for nvidia-smi";
  EXPECT_EQ(h.gpu.source, "none");
  ASSERT_FALSE(h.gpu.diagnoses.empty()) << h.to_json().dump(2);
  EXPECT_EQ(h.gpu.diagnoses[0].code, "health_collector_hung");
  EXPECT_NE(h.gpu.diagnoses[0].fix.find("Xid"), std::string::npos);
}

// A driver wedged inside NVML blocks the call itself: nothing can kill it,
// so the probe stops waiting at the deadline, reports it, and does not pile
// up another stuck thread at the next sample.
TEST_F(Health, HungNvmlIsNeverWaitedOnAndNotStartedTwice) {
  auto so = agent::build_fake_nvml(dir_.path(), agent::fake_nvml_source("", "sleep(30);"));
  make("h200");
  agent::install_fake_nvml(sim_->root(), so);
  agent::HealthDeadlines d;
  d.gpu = std::chrono::milliseconds(500);
  agent::HealthProbe probe(sim_->env(), d);
  for (int i = 0; i < 3; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    auto h = probe.sample({});
    auto took = std::chrono::steady_clock::now() - t0;
    EXPECT_LT(took, std::chrono::seconds(2)) << "sample " << i;
    ASSERT_EQ(h.gpu.diagnoses.size(), 1u) << h.to_json().dump(2);
    EXPECT_EQ(h.gpu.diagnoses[0].code, "health_collector_hung");
    EXPECT_EQ(h.gpu.diagnoses[0].details["collector"], "gpu");
    EXPECT_TRUE(h.gpu.gpus.empty());
  }
  EXPECT_EQ(calls_of("nvidia-smi"), 0) << "the stuck run was not started again";
}

TEST_F(Health, OllamaModelWithContextLengthAndExpiry) {
  make("l4");
  StepHarness drv(sim_->env(), catalog_step("gpu-vm", "nvidia-driver"));
  ASSERT_EQ(drv.apply().kind, agent::StepOutcome::Kind::reboot_required);
  sim_->reboot();
  StepHarness inst(sim_->env(), catalog_step("gpu-vm", "ollama"));
  ASSERT_TRUE(inst.apply().ok());
  ASSERT_TRUE(inst.verify().ok());
  StepHarness model(sim_->env(), catalog_step("gpu-vm", "model-llama3.2:1b"));
  ASSERT_TRUE(model.apply().ok());
  ASSERT_TRUE(model.verify().ok());  // loads it
  json o = agent::collect_ollama_health(sim_->env());
  ASSERT_EQ(o["models"].size(), 1u) << o.dump(2);
  EXPECT_EQ(o["models"][0]["context_length"], 4096);
  EXPECT_TRUE(o["models"][0]["expires_at"].is_string());
  // nvidia-smi sees the model's runner as a compute process on the L4.
  json g = agent::collect_gpu_health(sim_->env());
  ASSERT_EQ(g["gpus"][0]["processes"].size(), 1u) << g.dump(2);
  EXPECT_EQ(g["gpus"][0]["processes"][0]["pid"], 29211);
  EXPECT_EQ(g["gpus"][0]["processes"][0]["used_memory_mib"], 1662);
  EXPECT_EQ(g["gpus"][0]["memory_used_mib"], 1670);
  EXPECT_EQ(g["gpus"][0]["pstate"], "P0");
}

TEST_F(Health, OllamaNotAnswering) {
  make("h200");
  json o = agent::collect_ollama_health(sim_->env());
  EXPECT_TRUE(o["version"].is_null());
  EXPECT_TRUE(o["models"].empty());
  EXPECT_EQ(codes(o), std::vector<std::string>{"ollama_not_answering"});
  EXPECT_NE(o["error"].get<std::string>().find("127.0.0.1"), std::string::npos) << o["error"];
}

TEST_F(Health, OllamaWithItsModelOnTheGpuAndPartlyOff) {
  make("h200");
  StepHarness inst(sim_->env(), catalog_step("gpu-vm", "ollama"));
  ASSERT_TRUE(inst.apply().ok());
  ASSERT_TRUE(inst.verify().ok());
  json empty = agent::collect_ollama_health(sim_->env());
  EXPECT_EQ(empty["version"], "0.40.2");
  EXPECT_TRUE(empty["models"].empty());

  StepHarness model(sim_->env(), catalog_step("gpu-vm", "model-llama3.2:1b"));
  ASSERT_TRUE(model.apply().ok());
  ASSERT_TRUE(model.verify().ok());
  json o = agent::collect_ollama_health(sim_->env());
  ASSERT_EQ(o["models"].size(), 1u) << o.dump(2);
  EXPECT_EQ(o["models"][0]["name"], "llama3.2:1b");
  EXPECT_EQ(o["models"][0]["size"], o["models"][0]["size_vram"]);
  EXPECT_EQ(o["models"][0]["gpu_percent"], 100);
  EXPECT_FALSE(o.contains("diagnoses"));

  sim_->set_knob("ollama_vram_fraction", "0.5");
  ASSERT_FALSE(model.verify().ok());  // reloads it, half on the CPU now
  json half = agent::collect_ollama_health(sim_->env());
  EXPECT_EQ(half["models"][0]["gpu_percent"], 50);
  EXPECT_EQ(codes(half), std::vector<std::string>{"model_partly_on_cpu"});
}

}  // namespace
}  // namespace factory::testing
