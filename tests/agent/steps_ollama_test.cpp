// The ollama_install and ollama_model steps against the simulated guest
// (tests/guestsim) and the stand-in Ollama server (tests/fakes/ollama_server.py,
// Ollama's REST API on loopback; it downloads and runs no model). Most tests
// use the H200 profile, whose driver is already loaded (what the stand-in
// server looks at to place a model on the GPU).
#include <gtest/gtest.h>

#include <fstream>

#include "agent/steps/ollama_install.hpp"
#include "tests/agent/step_harness.hpp"
#include "tests/guestsim/guest_sim.hpp"

namespace factory::testing {
namespace {

using agent::StepOutcome;
using namespace std::chrono_literals;

class OllamaSteps : public ::testing::Test {
 protected:
  void make(const std::string& profile = "h200") {
    sim_ = std::make_unique<GuestSim>(dir_.path(), GuestSim::Options{profile, 0});
    path_ = std::make_unique<GuestSim::PathScope>(sim_->path());
  }
  void TearDown() override {
    path_.reset();
    sim_.reset();
  }
  StepHarness install() { return StepHarness(sim_->env(), catalog_step("gpu-vm", "ollama")); }
  StepHarness model(const std::string& name = "llama3.2:1b") {
    auto spec = catalog_step("gpu-vm", "model-llama3.2:1b");
    spec.params["model"] = name;
    return StepHarness(sim_->env(), spec);
  }
  void installed() {
    auto h = install();
    auto a = h.apply();
    ASSERT_TRUE(a.ok()) << describe(a);
    auto v = h.verify();
    ASSERT_TRUE(v.ok()) << describe(v) << "\n" << sim_->ollama_log();
  }

  TempDir dir_{"ollama"};
  std::unique_ptr<GuestSim> sim_;
  std::unique_ptr<GuestSim::PathScope> path_;
};

TEST(OllamaCliVersion, Forms) {
  using agent::steps::parse_ollama_cli_version;
  EXPECT_EQ(parse_ollama_cli_version("ollama version 0.40.2\n"),
            "0.40.2");  // the runbook's capture
  EXPECT_EQ(parse_ollama_cli_version("ollama version is 0.5.7\n"), "0.5.7");
  EXPECT_EQ(parse_ollama_cli_version("Warning: could not connect to a running Ollama instance\n"
                                     "Warning: client version is 0.40.2\n"),
            "0.40.2");
  EXPECT_EQ(parse_ollama_cli_version("bash: ollama: command not found\n"), "");
}

TEST_F(OllamaSteps, InstallEnablesTheServiceAndItAnswers) {
  make();
  auto h = install();
  ASSERT_TRUE(h.ok());
  auto c = h.check();
  ASSERT_TRUE(c);
  EXPECT_FALSE(*c);

  auto a = h.apply();
  ASSERT_TRUE(a.ok()) << describe(a);
  auto v = h.verify();
  ASSERT_TRUE(v.ok()) << describe(v);
  EXPECT_NE(v.message.find("Ollama 0.40.2 answers at " + sim_->ollama_url()), std::string::npos)
      << v.message;
  EXPECT_EQ(sim_->counter("ollama.install"), 1);
  EXPECT_EQ(sim_->counter("curl.install.sh"), 1);
  EXPECT_EQ(sim_->sh({"systemctl", "is-enabled", "ollama"}).output, "enabled\n");
  auto ver = sim_->sh({"ollama", "--version"});
  EXPECT_EQ(ver.output, "ollama version 0.40.2\n");

  auto done = h.check();
  ASSERT_TRUE(done);
  EXPECT_TRUE(*done);
  // Applied again (a crash after the install): the install is not repeated.
  EXPECT_TRUE(h.apply().ok());
  EXPECT_EQ(sim_->counter("ollama.install"), 1);
}

TEST_F(OllamaSteps, ServiceNotAnswering) {
  make();
  sim_->set_knob("ollama_not_answering");
  auto h = install();
  ASSERT_TRUE(h.apply().ok());  // systemctl starts it; it dies at once
  auto v = h.verify(1500ms);
  ASSERT_EQ(v.kind, StepOutcome::Kind::failed) << describe(v);
  ASSERT_TRUE(v.diagnosis);
  EXPECT_EQ(v.diagnosis->code, "ollama_not_answering");
  EXPECT_EQ(v.diagnosis->details["url"], sim_->ollama_url());
  EXPECT_NE(v.output_tail.find("Active: failed"), std::string::npos) << v.output_tail;

  // Fixed, and restarted: the step's verify succeeds.
  sim_->clear_knob("ollama_not_answering");
  sim_->sh({"systemctl", "restart", "ollama"});
  EXPECT_TRUE(h.verify().ok());
}

TEST_F(OllamaSteps, InstallScriptFailure) {
  make();
  sim_->set_knob("ollama_install_fail");
  auto h = install();
  auto a = h.apply();
  ASSERT_EQ(a.kind, StepOutcome::Kind::failed) << describe(a);
  EXPECT_NE(a.output_tail.find("returned error: 404"), std::string::npos) << a.output_tail;
  EXPECT_EQ(sim_->counter("ollama.install"), 0);
}

TEST_F(OllamaSteps, InstallScriptNotReachable) {
  make();
  auto spec = catalog_step("gpu-vm", "ollama");
  spec.params["install_url"] = "https://mirror.invalid/install.sh";
  StepHarness h(sim_->env(), spec);
  auto a = h.apply();
  ASSERT_EQ(a.kind, StepOutcome::Kind::failed) << describe(a);
  ASSERT_TRUE(a.diagnosis);
  EXPECT_EQ(a.diagnosis->code, "download_failed");
  EXPECT_NE(a.output_tail.find("Could not resolve host: mirror.invalid"), std::string::npos)
      << a.output_tail;
}

TEST_F(OllamaSteps, VersionMismatch) {
  make();
  installed();
  // Something replaced Ollama with another version behind the agent's back.
  std::ofstream(sim_->root() / ".guestsim/state/ollama/version") << "0.39.0\n";
  auto h = install();
  auto v = h.verify(1s);
  ASSERT_EQ(v.kind, StepOutcome::Kind::failed) << describe(v);
  EXPECT_EQ(v.diagnosis->code, "ollama_version_mismatch");
  EXPECT_EQ(v.diagnosis->details["found"], "0.39.0");
}

TEST_F(OllamaSteps, ModelPulledWithProgressAndLoadedFullyOnTheGpu) {
  make();
  installed();
  sim_->set_knob("ollama_pull_delay", "0.015");  // ~1.5 s of progress lines
  auto h = model();
  ASSERT_TRUE(h.ok());
  auto c = h.check();
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_FALSE(*c);

  auto t0 = std::chrono::steady_clock::now();
  auto a = h.apply();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(a.ok()) << describe(a);

  // Progress: percentages that only grow, end at 100, at most ~2 a second.
  ASSERT_GE(h.events.size(), 2u);
  int last = -1;
  for (const auto& e : h.events) {
    ASSERT_TRUE(e.contains("percent")) << e.dump();
    EXPECT_GE(e["percent"].get<int>(), last) << e.dump();
    last = e["percent"];
    EXPECT_NE(e["message"].get<std::string>().find("pulling llama3.2:1b"), std::string::npos);
  }
  EXPECT_EQ(last, 100);
  EXPECT_EQ(h.events.back()["completed"], h.events.back()["total"]);
  EXPECT_LE(h.events.size(), static_cast<size_t>(secs * 2) + 2) << "over " << secs << " s";

  auto v = h.verify();
  ASSERT_TRUE(v.ok()) << describe(v);
  EXPECT_NE(v.message.find("llama3.2:1b loaded: 1.6 GB, 100% GPU"), std::string::npos) << v.message;
  auto done = h.check();
  ASSERT_TRUE(done);
  EXPECT_TRUE(*done);
  EXPECT_EQ(sim_->counter("ollama.pull_request.llama3.2:1b"), 1);
  EXPECT_EQ(sim_->counter("ollama.download_complete.llama3.2:1b"), 1);
  EXPECT_EQ(sim_->counter("ollama.load.llama3.2:1b"), 1);
}

TEST_F(OllamaSteps, CutDownloadIsDiagnosedAndResumedNotRepeated) {
  make();
  installed();
  sim_->set_knob("ollama_pull_cut", "40");
  auto h = model();
  auto a = h.apply();
  ASSERT_EQ(a.kind, StepOutcome::Kind::failed) << describe(a);
  ASSERT_TRUE(a.diagnosis);
  EXPECT_EQ(a.diagnosis->code, "model_download_interrupted");
  int pct = a.diagnosis->details["percent"];
  EXPECT_GE(pct, 35);
  EXPECT_LE(pct, 45);
  auto c = h.check();
  ASSERT_TRUE(c);
  EXPECT_FALSE(*c);

  sim_->clear_knob("ollama_pull_cut");
  auto retry = h.apply();
  ASSERT_TRUE(retry.ok()) << describe(retry);
  EXPECT_EQ(sim_->counter("ollama.pull_request.llama3.2:1b"), 2);
  EXPECT_EQ(sim_->counter("ollama.download_complete.llama3.2:1b"), 1);
  // Every byte of the model crossed the (simulated) wire exactly once.
  EXPECT_EQ(sim_->counter("ollama.bytes.llama3.2:1b"), 1321082688 + 1429 + 7711 + 6016 + 96);
  EXPECT_TRUE(h.verify().ok());
}

TEST_F(OllamaSteps, UnknownModelNameGetsTheServersError) {
  make();
  installed();
  auto h = model("llama9.9:404b");
  auto a = h.apply();
  ASSERT_EQ(a.kind, StepOutcome::Kind::failed) << describe(a);
  ASSERT_TRUE(a.diagnosis);
  EXPECT_EQ(a.diagnosis->code, "model_not_found");
  EXPECT_EQ(a.diagnosis->details["server_error"], "pull model manifest: file does not exist");
  EXPECT_NE(a.message.find("llama9.9:404b"), std::string::npos);
}

TEST_F(OllamaSteps, PartlyOnTheCpuSaysHowMuch) {
  make();
  installed();
  sim_->set_knob("ollama_vram_fraction", "0.75");
  auto h = model();
  ASSERT_TRUE(h.apply().ok());
  auto v = h.verify();
  ASSERT_EQ(v.kind, StepOutcome::Kind::failed) << describe(v);
  ASSERT_TRUE(v.diagnosis);
  EXPECT_EQ(v.diagnosis->code, "model_partly_on_cpu");
  EXPECT_NE(v.diagnosis->summary.find("1.2 GB of 1.6 GB on the GPU, 25% on the CPU"),
            std::string::npos)
      << v.diagnosis->summary;

  // A tier that accepts CPU offload reports it and goes on.
  auto spec = catalog_step("gpu-vm", "model-llama3.2:1b");
  spec.params["require_full_gpu"] = false;
  StepHarness lenient(sim_->env(), spec);
  auto ok = lenient.verify();
  EXPECT_TRUE(ok.ok()) << describe(ok);
  EXPECT_NE(ok.message.find("75% GPU"), std::string::npos) << ok.message;
}

TEST_F(OllamaSteps, NoDriverMeansAllOnTheCpu) {
  // The runbook guest before the driver: Ollama finds no GPU when it starts.
  make("l4");
  installed();
  auto h = model();
  ASSERT_TRUE(h.apply().ok());
  auto v = h.verify();
  ASSERT_EQ(v.kind, StepOutcome::Kind::failed) << describe(v);
  EXPECT_EQ(v.diagnosis->code, "model_partly_on_cpu");
  EXPECT_NE(v.diagnosis->summary.find("0 B of 1.6 GB on the GPU, 100% on the CPU"),
            std::string::npos)
      << v.diagnosis->summary;
  EXPECT_NE(v.diagnosis->fix.find("systemctl restart ollama"), std::string::npos);
}

TEST_F(OllamaSteps, ModelStepWithoutOllama) {
  make();
  auto h = model();
  auto c = h.check();
  EXPECT_FALSE(c);  // the check could not run: nothing answers
  auto a = h.apply();
  ASSERT_EQ(a.kind, StepOutcome::Kind::failed) << describe(a);
  EXPECT_EQ(a.diagnosis->code, "ollama_not_answering");
  EXPECT_EQ(h.verify().diagnosis->code, "ollama_not_answering");
}

}  // namespace
}  // namespace factory::testing
