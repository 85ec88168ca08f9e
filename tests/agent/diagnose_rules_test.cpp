// The diagnosis rules on constructed observations: each code, and the order
// between them when several things are wrong at once.
#include <gtest/gtest.h>

#include "agent/diagnose/known.hpp"
#include "agent/diagnose/rules.hpp"

namespace factory::agent {
namespace {

PciFunction l4(const std::string& driver = "") {
  PciFunction f;
  f.address = "0000:09:00.0";
  f.vendor = 0x10de;
  f.device = 0x27b8;
  f.class_code = 0x030200;
  f.driver = driver;
  return f;
}

GpuDriverObservations healthy() {
  GpuDriverObservations o;
  o.gpus = {l4("nvidia")};
  o.module_loaded = true;
  o.driver_package = "nvidia-headless-open";
  o.package = {true, false, "install ok installed", "615.71.09-1ubuntu1"};
  o.expected_version = "615.71.09";
  o.smi_version = "615.71.09";
  return o;
}

// The kernel log of kubevirt/kubevirt#11093 (a 24 GB card behind EFI).
const char* kBar0Log =
    "[   72.161016] nvidia-nvlink: Nvlink Core is being initialized, major device number 236\n"
    "[   72.161022] NVRM: This PCI I/O region assigned to your NVIDIA device is invalid:\n"
    "               NVRM: BAR0 is 0M @ 0x0 (PCI:0000:08:00.0)\n"
    "[   72.162204] nvidia: probe of 0000:08:00.0 failed with error -1\n"
    "[   72.162223] NVRM: The NVIDIA probe routine failed for 1 device(s).\n";

TEST(DiagnoseGpuDriver, HealthyHasNoDiagnosis) {
  EXPECT_FALSE(diagnose_gpu_driver(healthy()));
}

TEST(DiagnoseGpuDriver, NoGpuBeatsEverything) {
  auto o = healthy();
  o.gpus.clear();
  o.kernel_log = kBar0Log;
  auto d = diagnose_gpu_driver(o);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->code, "gpu_not_on_pci_bus");
  EXPECT_NE(d->summary.find("the VM never received the card"), std::string::npos);
  EXPECT_NE(d->fix.find("vfio-pci"), std::string::npos);
  EXPECT_NE(d->fix.find("deviceName matches the allowlisted resource"), std::string::npos);
}

TEST(DiagnoseGpuDriver, Bar0BeatsRebootPending) {
  // After the reboot the module refused to load because of the BAR: another
  // reboot would not help, so "reboot pending" would be wrong.
  auto o = healthy();
  o.gpus = {l4("")};
  o.module_loaded = false;
  o.kernel_log = kBar0Log;
  auto d = diagnose_gpu_driver(o);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->code, "gpu_bar0_unmapped");
  EXPECT_EQ(d->details["pci_address"], "0000:08:00.0");
  EXPECT_EQ(d->details["kernel_log_line"], "NVRM: BAR0 is 0M @ 0x0 (PCI:0000:08:00.0)");
  EXPECT_NE(d->fix.find("MMIO"), std::string::npos);
  EXPECT_NE(d->fix.find("on the host"), std::string::npos);
}

TEST(DiagnoseGpuDriver, OldBar0LineIgnoredWhenTheDriverWorks) {
  auto o = healthy();
  o.kernel_log = kBar0Log;  // an earlier boot's; the VM was fixed since
  EXPECT_FALSE(diagnose_gpu_driver(o));
}

TEST(DiagnoseGpuDriver, InstalledNotLoadedIsRebootPending) {
  auto o = healthy();
  o.gpus = {l4("")};
  o.module_loaded = false;
  o.smi_version.clear();
  auto d = diagnose_gpu_driver(o);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->code, "driver_reboot_pending");
  EXPECT_NE(d->summary.find("615.71.09-1ubuntu1"), std::string::npos);
  o.rebooted_since_install = false;
  EXPECT_EQ(diagnose_gpu_driver(o)->code, "driver_reboot_pending");
}

TEST(DiagnoseGpuDriver, RebootedAndStillNotLoaded) {
  auto o = healthy();
  o.gpus = {l4("")};
  o.module_loaded = false;
  o.rebooted_since_install = true;
  o.kernel_log = "[    1.0] some other message\n";
  auto d = diagnose_gpu_driver(o);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->code, "driver_not_loading");
}

TEST(DiagnoseGpuDriver, NotInstalledIsNoDiagnosis) {
  // The normal state before the step runs.
  auto o = healthy();
  o.gpus = {l4("")};
  o.module_loaded = false;
  o.package = {};
  EXPECT_FALSE(diagnose_gpu_driver(o));
}

TEST(DiagnoseGpuDriver, LoadedButBoundElsewhere) {
  auto o = healthy();
  o.gpus = {l4("nouveau")};
  auto d = diagnose_gpu_driver(o);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->code, "gpu_not_bound_to_nvidia");
  EXPECT_EQ(d->details["driver"], "nouveau");
}

TEST(DiagnoseGpuDriver, VersionMismatch) {
  auto o = healthy();
  o.smi_version = "580.159.04";
  auto d = diagnose_gpu_driver(o);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->code, "driver_version_mismatch");
  EXPECT_EQ(d->details["found"], "580.159.04");
}

TEST(DiagnosePackageFailure, DkmsBuildFailure) {
  std::string out =
      "Setting up nvidia-dkms-open (615.71.09-1ubuntu1) ...\n"
      "Building module:\n"
      "'make' -j8 KERNEL_UNAME=6.8.0-142-generic modules...(bad exit status: 2)\n"
      "Error! Bad return status for module build on kernel: 6.8.0-142-generic (x86_64)\n"
      "Consult /var/lib/dkms/nvidia/615.71.09/build/make.log for more information.\n"
      "E: Sub-process /usr/bin/dpkg returned an error code (1)\n";
  auto d =
      diagnose_package_failure("apt-get install -y nvidia-headless-open", out, "6.8.0-142-generic");
  EXPECT_EQ(d.code, "dkms_build_failed");
  EXPECT_NE(d.fix.find("linux-headers-6.8.0-142-generic"), std::string::npos);
  EXPECT_NE(d.details["output_tail"].get<std::string>().find("Bad return status"),
            std::string::npos);
}

TEST(DiagnosePackageFailure, OtherAptFailure) {
  std::string out = "E: Unable to locate package nvidia-headless-open\n";
  auto d =
      diagnose_package_failure("apt-get install -y nvidia-headless-open", out, "6.8.0-142-generic");
  EXPECT_EQ(d.code, "apt_failed");
  EXPECT_EQ(d.details["command"], "apt-get install -y nvidia-headless-open");
  EXPECT_NE(d.details["output_tail"].get<std::string>().find("Unable to locate"),
            std::string::npos);
}

TEST(DiagnoseNvidiaSmi, Whereabouts) {
  EXPECT_FALSE(diagnose_nvidia_smi({true, false, "/run/nvidia/driver"}));
  auto op = diagnose_nvidia_smi({false, true, "/run/nvidia/driver"});
  ASSERT_TRUE(op);
  EXPECT_EQ(op->code, "gpu_operator_nvidia_smi_chroot");
  EXPECT_NE(op->fix.find("chroot /run/nvidia/driver nvidia-smi"), std::string::npos);
  auto none = diagnose_nvidia_smi({false, false, "/run/nvidia/driver"});
  ASSERT_TRUE(none);
  EXPECT_EQ(none->code, "nvidia_smi_not_on_path");
}

TEST(DiagnoseModel, FullyOnGpuIsFine) {
  EXPECT_FALSE(diagnose_model_placement("llama3.2:1b", 1600000000, 1600000000));
}

TEST(DiagnoseModel, PartlyOnCpuSaysHowMuch) {
  auto d = diagnose_model_placement("llama3.2:1b", 1600000000, 1200000000);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->code, "model_partly_on_cpu");
  EXPECT_NE(d->summary.find("1.2 GB of 1.6 GB on the GPU, 25% on the CPU"), std::string::npos)
      << d->summary;
  EXPECT_EQ(d->details["cpu_percent"], 25);
  EXPECT_EQ(d->details["gpu_percent"], 75);
}

TEST(DiagnoseModel, AllOnCpuPointsAtTheDriver) {
  auto d = diagnose_model_placement("llama3.2:1b", 1600000000, 0);
  ASSERT_TRUE(d);
  EXPECT_NE(d->summary.find("100% on the CPU"), std::string::npos) << d->summary;
  EXPECT_NE(d->fix.find("restart ollama"), std::string::npos);
}

TEST(DiagnosePull, UnknownNameAndInterrupted) {
  auto nf = diagnose_pull_failure("llama9:1b", 200, "pull model manifest: file does not exist", 0);
  EXPECT_EQ(nf.code, "model_not_found");
  EXPECT_EQ(nf.details["server_error"], "pull model manifest: file does not exist");
  EXPECT_EQ(diagnose_pull_failure("x", 404, "", 0).code, "model_not_found");
  auto cut = diagnose_pull_failure("llama3.2:1b", 200, "max retries exceeded: unexpected EOF", 42);
  EXPECT_EQ(cut.code, "model_download_interrupted");
  EXPECT_NE(cut.summary.find("42%"), std::string::npos);
}

TEST(Diagnose, CombinesWhatIsObserved) {
  GuestObservations o;
  o.gpu = healthy();
  o.gpu->gpus = {l4("")};
  o.gpu->module_loaded = false;
  o.gpu->smi_version.clear();
  o.nvidia_smi = NvidiaSmiObservations{false, true, "/run/nvidia/driver"};
  o.ollama_error = "http://127.0.0.1:11434: connection refused";
  o.ollama_url = "http://127.0.0.1:11434";
  o.models.push_back({"llama3.2:1b", 1600000000, 0});
  auto all = diagnose(o);
  std::vector<std::string> codes;
  for (const auto& d : all) codes.push_back(d.code);
  EXPECT_EQ(codes,
            (std::vector<std::string>{"driver_reboot_pending", "gpu_operator_nvidia_smi_chroot",
                                      "ollama_not_answering", "model_partly_on_cpu"}));

  GuestObservations nogpu;
  nogpu.gpu = GpuDriverObservations{};
  nogpu.nvidia_smi = NvidiaSmiObservations{};
  auto only = diagnose(nogpu);
  ASSERT_EQ(only.size(), 1u);  // no nvidia-smi complaint about a card that is not there
  EXPECT_EQ(only[0].code, "gpu_not_on_pci_bus");
}

TEST(HumanBytes, AsOllamaPrintsThem) {
  EXPECT_EQ(diagnoses::human_bytes(1610612736), "1.6 GB");
  EXPECT_EQ(diagnoses::human_bytes(1321098329), "1.3 GB");
  EXPECT_EQ(diagnoses::human_bytes(2000000000), "2 GB");
  EXPECT_EQ(diagnoses::human_bytes(23034000000ull), "23 GB");
  EXPECT_EQ(diagnoses::human_bytes(512), "512 B");
  EXPECT_EQ(diagnoses::human_bytes(7711), "7.7 KB");
}

TEST(DiagnosisJson, Shape) {
  auto j = diagnoses::gpu_not_on_pci_bus().to_json();
  EXPECT_EQ(j["code"], "gpu_not_on_pci_bus");
  EXPECT_TRUE(j["summary"].is_string());
  EXPECT_TRUE(j["fix"].is_string());
  EXPECT_TRUE(j["details"].is_object());
}

}  // namespace
}  // namespace factory::agent
