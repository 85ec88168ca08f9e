// collect_gpu_health / collect_ollama_health on the simulated guest
// (tests/guestsim; its nvidia-smi answers with the real captures). NVML is
// absent here and under every simulated root, so these exercise the
// nvidia-smi fallbacks; NVML itself is tested in health_parsers_test.
#include <gtest/gtest.h>

#include "agent/health/gpu_health.hpp"
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
}

TEST_F(Health, GpuOperatorGuestGoesThroughTheDriverRoot) {
  make("l4-gpu-operator");
  json h = agent::collect_gpu_health(sim_->env());
  EXPECT_EQ(h["source"], "nvidia-smi") << h.dump(2);
  EXPECT_EQ(h["driver_version"], "580.126.20");
  EXPECT_EQ(h["via"], "chroot " + (sim_->root() / "run/nvidia/driver").string());
  ASSERT_EQ(h["gpus"].size(), 1u);
  EXPECT_EQ(h["gpus"][0]["name"], "NVIDIA L4");
  EXPECT_EQ(codes(h), std::vector<std::string>{"gpu_operator_nvidia_smi_chroot"});
  EXPECT_NE(h["diagnoses"][0]["fix"].get<std::string>().find("chroot"), std::string::npos);
}

TEST_F(Health, NoCardNoNvidiaSmi) {
  make("none");
  json h = agent::collect_gpu_health(sim_->env());
  EXPECT_EQ(h["source"], "none");
  EXPECT_TRUE(h["gpus"].empty());
  EXPECT_TRUE(h["driver_version"].is_null());
  EXPECT_EQ(codes(h), std::vector<std::string>{"nvidia_smi_not_on_path"});
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
