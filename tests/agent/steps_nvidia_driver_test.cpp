// The gpu_present and nvidia_driver steps against the simulated guest
// (tests/guestsim: a directory tree and stand-in programs answering with
// output captured from real machines; NOT a real guest). The test drives
// check -> apply -> simulated reboot -> verify itself, as the plan engine
// would, and reads the stand-ins' counters to prove nothing ran twice.
#include <gtest/gtest.h>

#include "agent/guest/facts.hpp"
#include "common/atomic_file.hpp"
#include "tests/agent/step_harness.hpp"
#include "tests/guestsim/guest_sim.hpp"

namespace factory::testing {
namespace {

using agent::StepOutcome;
namespace fs = std::filesystem;

class NvidiaDriverStep : public ::testing::Test {
 protected:
  void make(const std::string& profile = "l4") {
    sim_ = std::make_unique<GuestSim>(dir_.path(), GuestSim::Options{profile, 0});
    path_ = std::make_unique<GuestSim::PathScope>(sim_->path());
  }
  void TearDown() override {
    path_.reset();
    sim_.reset();
  }
  StepHarness driver(agent::StepSpec spec = catalog_step("gpu-vm", "nvidia-driver")) {
    return StepHarness(sim_->env(), std::move(spec));
  }

  TempDir dir_{"nvdrv"};
  std::unique_ptr<GuestSim> sim_;
  std::unique_ptr<GuestSim::PathScope> path_;
};

TEST_F(NvidiaDriverStep, GpuPresentOnTheRunbookGuest) {
  make("l4");
  StepHarness h(sim_->env(), catalog_step("gpu-vm", "gpu-present"));
  ASSERT_TRUE(h.ok());
  auto c = h.check();
  ASSERT_TRUE(c);
  EXPECT_TRUE(*c);
  auto v = h.verify();
  EXPECT_TRUE(v.ok()) << describe(v);
  EXPECT_NE(v.message.find("10de:27b8 at 0000:09:00.0"), std::string::npos) << v.message;
}

TEST_F(NvidiaDriverStep, GpuPresentFailsWithTheHostSideFixWhenTheCardIsMissing) {
  make("none");
  StepHarness h(sim_->env(), catalog_step("gpu-vm", "gpu-present"));
  auto c = h.check();
  ASSERT_TRUE(c);
  EXPECT_FALSE(*c);
  auto a = h.apply();
  ASSERT_EQ(a.kind, StepOutcome::Kind::failed) << describe(a);
  ASSERT_TRUE(a.diagnosis);
  EXPECT_EQ(a.diagnosis->code, "gpu_not_on_pci_bus");
  EXPECT_NE(a.diagnosis->summary.find("the VM never received the card"), std::string::npos);
  EXPECT_NE(
      a.diagnosis->fix.find("check on the host that the card is on vfio-pci and that deviceName "
                            "matches the allowlisted resource"),
      std::string::npos)
      << a.diagnosis->fix;
  // What the guest does have is reported, so the admin sees the bus.
  EXPECT_EQ(a.diagnosis->details["pci_functions"].size(), 4u);
}

TEST_F(NvidiaDriverStep, GpuPresentParams) {
  make("l4");
  agent::StepSpec spec = catalog_step("gpu-vm", "gpu-present");
  spec.params["min_count"] = 2;  // the runbook guest has one card
  StepHarness two(sim_->env(), spec);
  EXPECT_FALSE(*two.check());
  EXPECT_EQ(two.verify().diagnosis->code, "gpu_not_on_pci_bus");

  agent::StepRegistry reg;
  agent::register_builtin_steps(reg);
  spec.params["vendor"] = "nvidia";
  auto bad = reg.create(spec);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("params.vendor"), std::string::npos);
}

TEST_F(NvidiaDriverStep, FreshGuestInstallsOnceRebootsOnceAndVerifies) {
  make("l4");
  auto h = driver();
  ASSERT_TRUE(h.ok());

  auto c = h.check();
  ASSERT_TRUE(c);
  EXPECT_FALSE(*c);

  auto a = h.apply();
  ASSERT_EQ(a.kind, StepOutcome::Kind::reboot_required) << describe(a);
  EXPECT_NE(a.message.find("615.71.09-1ubuntu1"), std::string::npos);
  EXPECT_FALSE(h.events.empty());  // "installing ...", "downloading ..." progress

  // What the runbook's script does, each once.
  EXPECT_EQ(sim_->counter("apt-get.install.linux-headers-6.8.0-142-generic"), 1);
  EXPECT_EQ(sim_->counter("curl.nvidia-driver-local-repo-ubuntu2404-615.71.09_1.0-1_amd64.deb"), 1);
  EXPECT_EQ(sim_->counter("dpkg.install.nvidia-driver-local-repo-ubuntu2404-615.71.09"), 1);
  EXPECT_EQ(sim_->counter("apt-get.install.nvidia-headless-open"), 1);
  EXPECT_EQ(sim_->counter("apt-get.install.nvidia-persistenced"), 1);
  EXPECT_EQ(sim_->counter("dkms.build"), 1);
  // ca-certificates and curl come with the cloud image: not reinstalled.
  EXPECT_EQ(sim_->counter("apt-get.install.curl"), 0);
  EXPECT_TRUE(fs::exists(
      sim_->root() /
      "var/cache/factory/nvidia-driver-local-repo-ubuntu2404-615.71.09_1.0-1_amd64.deb"));
  // The local repository's key went where apt trusts it.
  bool key = false;
  for (auto& e : fs::directory_iterator(sim_->root() / "usr/share/keyrings"))
    key |= e.path().filename().string().find("-keyring.gpg") != std::string::npos;
  EXPECT_TRUE(key);

  // Before the reboot: installed, not loaded -> the reboot-pending diagnosis.
  auto early = h.verify();
  ASSERT_EQ(early.kind, StepOutcome::Kind::failed) << describe(early);
  ASSERT_TRUE(early.diagnosis);
  EXPECT_EQ(early.diagnosis->code, "driver_reboot_pending");

  // The agent crashing and running apply again before the reboot changes nothing.
  auto again = h.apply();
  EXPECT_EQ(again.kind, StepOutcome::Kind::reboot_required) << describe(again);
  EXPECT_EQ(sim_->counter("apt-get.install.nvidia-headless-open"), 1);
  EXPECT_EQ(sim_->counter("curl.nvidia-driver-local-repo-ubuntu2404-615.71.09_1.0-1_amd64.deb"), 1);
  EXPECT_EQ(sim_->counter("dpkg.install.nvidia-driver-local-repo-ubuntu2404-615.71.09"), 1);

  auto rb = sim_->reboot();
  ASSERT_EQ(rb.exit_code, 0) << rb.output;
  EXPECT_EQ(sim_->counter("reboot"), 1);

  // After boot: the module loaded and bound, nvidia-smi answers with the runbook's L4.
  auto v = h.verify();
  ASSERT_TRUE(v.ok()) << describe(v);
  EXPECT_NE(v.message.find("Kernel driver in use: nvidia"), std::string::npos) << v.message;
  EXPECT_NE(v.message.find("NVIDIA L4 (23034 MiB) at 00000000:09:00.0"), std::string::npos)
      << v.message;
  auto done = h.check();
  ASSERT_TRUE(done);
  EXPECT_TRUE(*done);
  auto lspci = sim_->sh({"lspci", "-nnk", "-d", "10de:"});
  EXPECT_NE(lspci.output.find("Kernel driver in use: nvidia"), std::string::npos) << lspci.output;

  // Nothing was installed twice, across the whole run.
  EXPECT_EQ(sim_->counter("apt-get.install.nvidia-headless-open"), 1);
  EXPECT_EQ(sim_->counter("apt-get.install.nvidia-dkms-open"), 1);
  EXPECT_EQ(sim_->counter("dkms.build"), 1);

  // Held at the pin, once: an unattended upgrade cannot move it.
  EXPECT_EQ(sim_->counter("apt-mark.hold.nvidia-headless-open"), 1);
  EXPECT_EQ(sim_->counter("apt-mark.hold.nvidia-persistenced"), 1);
  EXPECT_EQ(sim_->sh({"apt-mark", "showhold"}).output,
            "nvidia-headless-open\nnvidia-persistenced\n");
  EXPECT_NE(v.message.find("nvidia-headless-open nvidia-persistenced held at 615.71.09-1ubuntu1"),
            std::string::npos)
      << v.message;
  auto s = agent::dpkg_package("nvidia-headless-open");
  EXPECT_TRUE(s.installed && s.held) << s.status;
}

TEST_F(NvidiaDriverStep, AnUnheldDriverIsHeldAndOnlyThePlanReleasesIt) {
  make("l4");
  auto h = driver();
  ASSERT_EQ(h.apply().kind, StepOutcome::Kind::reboot_required);
  ASSERT_EQ(sim_->reboot().exit_code, 0);
  ASSERT_TRUE(h.verify().ok());
  // Someone released it by hand: the step is not done until it is held again.
  ASSERT_EQ(sim_->sh({"apt-mark", "unhold", "nvidia-persistenced"}).exit_code, 0);
  auto c = h.check();
  ASSERT_TRUE(c);
  EXPECT_FALSE(*c);
  auto v = h.verify();
  EXPECT_EQ(v.kind, StepOutcome::Kind::failed);
  EXPECT_NE(v.message.find("nvidia-persistenced not held (apt-mark hold)"), std::string::npos)
      << v.message;
  auto a = h.apply();
  EXPECT_TRUE(a.ok()) << describe(a);
  EXPECT_EQ(sim_->counter("apt-mark.hold.nvidia-persistenced"), 2);
  EXPECT_EQ(sim_->counter("apt-get.install.nvidia-headless-open"), 1) << "nothing reinstalled";
  EXPECT_TRUE(*h.check());
}

TEST_F(NvidiaDriverStep, APlanThatChangesThePinReleasesTheHoldAndHoldsTheNewOne) {
  make("l4");
  auto h = driver();
  ASSERT_EQ(h.apply().kind, StepOutcome::Kind::reboot_required);
  // As if an older pin had been installed and held: apt refuses to move it...
  ASSERT_TRUE(write_file_atomic(sim_->root() / ".guestsim/state/dpkg/nvidia-headless-open",
                                "Status: hold ok installed\nVersion: 615.00.00-1ubuntu1\n", 0644));
  auto moved = sim_->sh({"apt-get", "install", "-y", "nvidia-headless-open"});
  EXPECT_EQ(moved.exit_code, 100);
  EXPECT_NE(moved.output.find("E: Held packages were changed and -y was used without "
                              "--allow-change-held-packages."),
            std::string::npos)
      << moved.output;
  // ...and the plan, whose pin differs, releases it, installs and holds again.
  auto a = h.apply();
  EXPECT_EQ(a.kind, StepOutcome::Kind::reboot_required) << describe(a);
  EXPECT_EQ(sim_->counter("apt-mark.unhold.nvidia-headless-open"), 1);
  EXPECT_EQ(sim_->counter("apt-mark.hold.nvidia-headless-open"), 2);
  auto st = agent::dpkg_package("nvidia-headless-open");
  EXPECT_EQ(st.version, "615.71.09-1ubuntu1");
  EXPECT_TRUE(st.held) << st.status;
}

TEST_F(NvidiaDriverStep, NetworkRepository) {
  make("l4");
  auto spec = catalog_step("gpu-vm", "nvidia-driver");
  spec.params["repo"] = {{"kind", "network"},
                         {"url",
                          "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/"
                          "x86_64/cuda-keyring_1.1-1_all.deb"}};
  auto h = driver(spec);
  auto a = h.apply();
  ASSERT_EQ(a.kind, StepOutcome::Kind::reboot_required) << describe(a);
  EXPECT_EQ(sim_->counter("dpkg.install.cuda-keyring"), 1);
  EXPECT_TRUE(fs::exists(sim_->root() /
                         "var/cache/factory/cuda-keyring_1.1-1_all.deb"));  // default cache_dir
  sim_->reboot();
  auto v = h.verify();
  EXPECT_TRUE(v.ok()) << describe(v);
}

TEST_F(NvidiaDriverStep, Bar0UnmappedIsDiagnosedAndDoesNotRebootAgain) {
  make("l4");
  // A large-BAR card behind guest firmware that could not map it.
  sim_->set_knob("bar0");
  auto h = driver();
  ASSERT_EQ(h.apply().kind, StepOutcome::Kind::reboot_required);
  sim_->reboot();

  auto v = h.verify();
  ASSERT_EQ(v.kind, StepOutcome::Kind::failed) << describe(v);
  ASSERT_TRUE(v.diagnosis);
  EXPECT_EQ(v.diagnosis->code, "gpu_bar0_unmapped");
  EXPECT_EQ(v.diagnosis->details["pci_address"], "0000:09:00.0");
  EXPECT_NE(v.diagnosis->fix.find("64-bit MMIO"), std::string::npos) << v.diagnosis->fix;
  EXPECT_NE(v.output_tail.find("BAR0 is 0M"), std::string::npos) << v.output_tail;

  // A retry of apply after the reboot must not ask for another reboot.
  auto a = h.apply();
  ASSERT_EQ(a.kind, StepOutcome::Kind::failed) << describe(a);
  EXPECT_EQ(a.diagnosis->code, "gpu_bar0_unmapped");
  EXPECT_EQ(sim_->counter("apt-get.install.nvidia-headless-open"), 1);
}

TEST_F(NvidiaDriverStep, DkmsBuildFailureThenFixed) {
  make("l4");
  sim_->set_knob("dkms_fail");
  auto h = driver();
  auto a = h.apply();
  ASSERT_EQ(a.kind, StepOutcome::Kind::failed) << describe(a);
  ASSERT_TRUE(a.diagnosis);
  EXPECT_EQ(a.diagnosis->code, "dkms_build_failed");
  EXPECT_NE(a.output_tail.find("Bad return status for module build"), std::string::npos)
      << a.output_tail;
  EXPECT_EQ(sim_->counter("apt-get.install.nvidia-headless-open"), 0);  // left unconfigured

  sim_->clear_knob("dkms_fail");  // the admin fixed the cause; `factory tenant retry`
  auto retry = h.apply();
  ASSERT_EQ(retry.kind, StepOutcome::Kind::reboot_required) << describe(retry);
  EXPECT_EQ(sim_->counter("apt-get.install.nvidia-headless-open"), 1);
  EXPECT_EQ(sim_->counter("apt-get.install.nvidia-dkms-open"), 1);
  EXPECT_EQ(sim_->counter("dkms.build"), 2);  // the failed build and the good one
}

TEST_F(NvidiaDriverStep, AptFailureCarriesTheOutputTail) {
  make("l4");
  sim_->set_knob("apt_update_fail");
  auto h = driver();
  auto a = h.apply();
  ASSERT_EQ(a.kind, StepOutcome::Kind::failed) << describe(a);
  ASSERT_TRUE(a.diagnosis);
  EXPECT_EQ(a.diagnosis->code, "apt_failed");
  EXPECT_NE(a.message.find("apt-get update"), std::string::npos) << a.message;
  EXPECT_NE(a.output_tail.find("Temporary failure resolving 'archive.ubuntu.com'"),
            std::string::npos)
      << a.output_tail;

  sim_->clear_knob("apt_update_fail");
  sim_->set_knob("apt_install_fail", "nvidia-headless-open");
  // First the headers install (apt_install_fail fails any download).
  auto b = h.apply();
  ASSERT_EQ(b.kind, StepOutcome::Kind::failed) << describe(b);
  EXPECT_EQ(b.diagnosis->code, "apt_failed");
  EXPECT_NE(b.output_tail.find("404  Not Found"), std::string::npos) << b.output_tail;
  sim_->clear_knob("apt_install_fail");
  EXPECT_EQ(h.apply().kind, StepOutcome::Kind::reboot_required);
}

TEST_F(NvidiaDriverStep, CutDownloadLeavesNothingThatLooksFinished) {
  make("l4");
  sim_->set_knob("curl_cut");
  auto h = driver();
  auto a = h.apply();
  ASSERT_EQ(a.kind, StepOutcome::Kind::failed) << describe(a);
  ASSERT_TRUE(a.diagnosis);
  EXPECT_EQ(a.diagnosis->code, "download_failed");
  EXPECT_NE(a.output_tail.find("curl: (18)"), std::string::npos) << a.output_tail;
  for (auto& e : fs::directory_iterator(sim_->root() / "var/cache/factory"))
    ADD_FAILURE() << "left behind: " << e.path();
  EXPECT_EQ(sim_->counter("dpkg.install.nvidia-driver-local-repo-ubuntu2404-615.71.09"), 0);

  sim_->clear_knob("curl_cut");
  EXPECT_EQ(h.apply().kind, StepOutcome::Kind::reboot_required);
  EXPECT_EQ(sim_->counter("dpkg.install.nvidia-driver-local-repo-ubuntu2404-615.71.09"), 1);
}

TEST_F(NvidiaDriverStep, NoGpuStopsBeforeInstallingAnything) {
  make("none");
  auto h = driver();
  auto a = h.apply();
  ASSERT_EQ(a.kind, StepOutcome::Kind::failed) << describe(a);
  EXPECT_EQ(a.diagnosis->code, "gpu_not_on_pci_bus");
  EXPECT_EQ(sim_->counter("apt-get.update"), 0);
  EXPECT_EQ(h.verify().diagnosis->code, "gpu_not_on_pci_bus");
}

TEST_F(NvidiaDriverStep, PreinstalledH200IsDoneAlready) {
  // The device machine's guest: driver 580.159.04 came with the image.
  make("h200");
  auto spec = catalog_step("gpu-vm", "nvidia-driver");
  spec.params["version"] = "580.159.04";
  spec.params["package_version"] = "580.159.04-1ubuntu1";
  auto h = driver(spec);
  auto c = h.check();
  ASSERT_TRUE(c);
  EXPECT_TRUE(*c);
  auto v = h.verify();
  ASSERT_TRUE(v.ok()) << describe(v);
  EXPECT_NE(v.message.find("NVIDIA H200 (143771 MiB) at 00000000:00:06.0"), std::string::npos)
      << v.message;
  EXPECT_EQ(sim_->counter("apt-get.update"), 0);
}

TEST_F(NvidiaDriverStep, OtherDriverVersionIsAMismatch) {
  make("h200");  // 580.159.04 loaded; the catalog pins 615.71.09
  auto h = driver();
  auto c = h.check();
  ASSERT_TRUE(c);
  EXPECT_FALSE(*c);
  auto v = h.verify();
  ASSERT_EQ(v.kind, StepOutcome::Kind::failed) << describe(v);
  EXPECT_EQ(v.diagnosis->code, "driver_version_mismatch");
  EXPECT_EQ(v.diagnosis->details["found"], "580.159.04");
}

TEST_F(NvidiaDriverStep, ParamsFromAHandWrittenPlanAreChecked) {
  make("l4");
  agent::StepRegistry reg;
  agent::register_builtin_steps(reg);
  agent::StepSpec spec;
  spec.id = "drv";
  spec.kind = "nvidia_driver";
  spec.params = {{"version", "615.71.09"},
                 {"package_version", "615.71.09-1ubuntu1"},
                 {"packages", {"nvidia-headless-open"}}};
  auto r = reg.create(spec);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("params.repo"), std::string::npos) << r.error().message;
  spec.params["repo"] = {{"kind", "local"}, {"url", "https://example.invalid/not-a-package.tar"}};
  r = reg.create(spec);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find(".deb"), std::string::npos) << r.error().message;
}

}  // namespace
}  // namespace factory::testing
