// `factory host check` through the real binary, on host trees laid out like
// the kernel's sysfs: the runbook's 2xL4 host, the real H200 guest (no IOMMU),
// a card sharing its IOMMU group with a NIC, nvidia-persistenced and another
// process holding cards, and a card already on vfio-pci.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/coordinator/host_tree.hpp"
#include "tests/support/test_support.hpp"

using namespace factory::testing;
using namespace factory::testing::hosttree;
using nlohmann::json;

namespace {

json check_json(const HostTree& t, std::vector<std::string> extra = {}, int* exit_code = nullptr) {
  std::vector<std::string> args = {"check", "-o", "json"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto r = factory_host(t, args);
  if (exit_code) *exit_code = r.exit_code;
  try {
    return json::parse(r.output);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not JSON (" << e.what() << "):\n" << r.output;
    return json::object();
  }
}

const json& check_named(const json& doc, const std::string& name) {
  for (const auto& c : doc["checks"])
    if (c["name"] == name) return c;
  static const json none = json::object();
  ADD_FAILURE() << "no check named " << name << " in " << doc["checks"].dump(1);
  return none;
}

const json& gpu_at(const json& doc, const std::string& addr) {
  for (const auto& g : doc["gpus"])
    if (g["address"] == addr) return g;
  static const json none = json::object();
  ADD_FAILURE() << "no gpu " << addr;
  return none;
}

// Puts a function on vfio-pci as a finished bind leaves it.
void put_on_vfio(HostTree& t, const std::string& addr, bool with_driverctl) {
  t.add_driver("vfio-pci");
  for (const char* m : {"vfio", "vfio_iommu_type1", "vfio_pci"})
    write_text(t / ("/sys/module/" + std::string(m) + "/initstate"), "live\n");
  t.unlink_driver(addr);
  t.link_driver(addr, "vfio-pci");
  write_text(t.device_dir(addr) / "driver_override", "vfio-pci\n");
  write_text(t / "/etc/modules-load.d/vfio.conf", "vfio\nvfio_iommu_type1\nvfio_pci\n");
  if (with_driverctl) write_text(t / ("/etc/driverctl.d/pci-" + addr), "vfio-pci\n");
}

}  // namespace

TEST(HostCheck, RunbookHostListsBothL4sWithTheirResourceName) {
  TempDir dir("host");
  HostTree t(dir);
  build_l4_runbook(t);
  int rc = -1;
  json doc = check_json(t, {}, &rc);
  EXPECT_EQ(rc, 0) << doc.dump(2);

  // The JSON shape the issue fixes, exactly.
  ASSERT_TRUE(doc.is_object());
  EXPECT_EQ(doc.size(), 2u);
  for (const auto& c : doc["checks"]) {
    EXPECT_EQ(c.size(), 4u) << c.dump();
    for (const char* k : {"name", "verdict", "detail", "fix"}) EXPECT_TRUE(c.contains(k)) << k;
    EXPECT_TRUE(c["verdict"] == "ok" || c["verdict"] == "warn") << c.dump();
    if (c["verdict"] == "ok")
      EXPECT_TRUE(c["fix"].is_null());
    else
      EXPECT_TRUE(c["fix"].is_string() && !c["fix"].get<std::string>().empty());
  }
  ASSERT_EQ(doc["gpus"].size(), 2u);
  for (const auto& g : doc["gpus"]) {
    EXPECT_EQ(g.size(), 10u) << g.dump();
    for (const char* k : {"address", "vendor_id", "device_id", "subsystem_id", "name", "driver",
                          "iommu_group", "group_members", "override", "resource_name"})
      EXPECT_TRUE(g.contains(k)) << k;
    EXPECT_EQ(g["vendor_id"], "10de");
    EXPECT_EQ(g["device_id"], "27b8");
    EXPECT_EQ(g["subsystem_id"], "10de:16ca");
    EXPECT_EQ(g["name"], "AD104GL [L4]");
    EXPECT_EQ(g["driver"], "nvidia");
    EXPECT_EQ(g["group_members"], json::array());
    EXPECT_TRUE(g["override"].is_null());
    EXPECT_EQ(g["resource_name"], "nvidia.com/AD104GL_L4");
  }
  EXPECT_EQ(gpu_at(doc, "0000:01:00.0")["iommu_group"], 13);
  EXPECT_EQ(gpu_at(doc, "0000:41:00.0")["iommu_group"], 35);

  EXPECT_EQ(check_named(doc, "cpu-virtualization")["detail"], "AMD-V (svm flag in /proc/cpuinfo)");
  EXPECT_EQ(check_named(doc, "kvm")["verdict"], "ok");
  const std::string iommu = check_named(doc, "iommu")["detail"];
  EXPECT_EQ(iommu.rfind("AMD-Vi, ", 0), 0u) << iommu;
  EXPECT_NE(iommu.find("ivhd7"), std::string::npos);
  EXPECT_NE(check_named(doc, "vfio-modules")["detail"].get<std::string>().find("not loaded yet"),
            std::string::npos);
  EXPECT_EQ(check_named(doc, "pci-ids")["detail"], "/usr/share/misc/pci.ids (version 2023.04.10)");
  EXPECT_EQ(check_named(doc, "gpu 0000:01:00.0")["verdict"], "ok");
  EXPECT_EQ(check_named(doc, "nvidia-persistenced")["detail"], "not running");
}

TEST(HostCheck, RunbookHostTableAndYaml) {
  TempDir dir("host");
  HostTree t(dir);
  build_l4_runbook(t);
  auto table = factory_host(t, {"check"});
  EXPECT_EQ(table.exit_code, 0) << table.output;
  EXPECT_NE(table.output.find("CHECK"), std::string::npos);
  EXPECT_NE(table.output.find("RESOURCE NAME"), std::string::npos);
  EXPECT_NE(table.output.find("nvidia.com/AD104GL_L4"), std::string::npos);
  EXPECT_NE(table.output.find("Passthrough can work on this machine."), std::string::npos);
  auto yaml = factory_host(t, {"check", "-o", "yaml"});
  EXPECT_EQ(yaml.exit_code, 0);
  EXPECT_NE(yaml.output.find("resource_name: \"nvidia.com/AD104GL_L4\""), std::string::npos)
      << yaml.output;
}

TEST(HostCheck, RealH200GuestSaysPlainlyItCannotPassACardThrough) {
  TempDir dir("host");
  HostTree t(dir);
  build_h200_guest(t);
  int rc = -1;
  json doc = check_json(t, {}, &rc);
  EXPECT_EQ(rc, 1) << "non-zero: passthrough cannot work; not a crash (70)";
  const auto& iommu = check_named(doc, "iommu");
  EXPECT_EQ(iommu["verdict"], "fail");
  EXPECT_NE(iommu["detail"].get<std::string>().find("this machine cannot pass a card through"),
            std::string::npos);
  EXPECT_EQ(check_named(doc, "gpu 0000:00:06.0")["verdict"], "fail");
  EXPECT_EQ(check_named(doc, "kvm")["verdict"], "ok") << "the capture lists /dev/kvm";
  EXPECT_EQ(check_named(doc, "cpu-virtualization")["verdict"], "warn")
      << "no /proc/cpuinfo captured";
  ASSERT_EQ(doc["gpus"].size(), 1u);
  const auto& g = doc["gpus"][0];
  EXPECT_EQ(g["address"], "0000:00:06.0");
  EXPECT_EQ(g["device_id"], "2335");
  EXPECT_EQ(g["subsystem_id"], "10de:18bf");
  EXPECT_EQ(g["driver"], "nvidia");
  EXPECT_TRUE(g["iommu_group"].is_null());
  EXPECT_TRUE(g["name"].is_null()) << "the guest has no pci.ids";
  EXPECT_EQ(g["resource_name"], "nvidia.com/2335");
  const auto& ids = check_named(doc, "pci-ids");
  EXPECT_EQ(ids["verdict"], "warn");
  EXPECT_NE(ids["detail"].get<std::string>().find("raw device ID 2335"), std::string::npos)
      << ids.dump();

  auto table = factory_host(t, {"check"});
  EXPECT_EQ(table.exit_code, 1);
  EXPECT_NE(table.output.find("Passthrough cannot work on this machine as it is"),
            std::string::npos);
}

TEST(HostCheck, H200NameComesFromTheNewerPciIdsAndTheOldOneSaysItFellBack) {
  TempDir dir("host");
  HostTree t(dir);
  build_h200_guest(t);
  json doc = check_json(
      t, {"--pci-ids", (fixtures_dir() / "third-party" / "pci.ids-nvidia-2025.07.11").string()});
  EXPECT_EQ(doc["gpus"][0]["name"], "GH100 [H200 SXM 141GB]");
  EXPECT_EQ(doc["gpus"][0]["resource_name"], "nvidia.com/GH100_H200_SXM_141GB");
  EXPECT_EQ(check_named(doc, "pci-ids")["verdict"], "ok");

  const std::string debian = (host_fixtures() / "pci.ids-debian12-2023.04.10-nvidia").string();
  doc = check_json(t, {"--pci-ids", debian});
  EXPECT_EQ(doc["gpus"][0]["resource_name"], "nvidia.com/2335");
  EXPECT_TRUE(doc["gpus"][0]["name"].is_null());
  const auto& ids = check_named(doc, "pci-ids");
  EXPECT_EQ(ids["verdict"], "warn");
  EXPECT_NE(
      ids["detail"].get<std::string>().find("10de:2335 is not in " + debian +
                                            " (version 2023.04.10), so the resource name falls "
                                            "back to the raw device ID 2335"),
      std::string::npos)
      << ids.dump();
  EXPECT_NE(ids["fix"].get<std::string>().find("--pci-ids"), std::string::npos);
}

TEST(HostCheck, MissingPciIdsFileIsOneLineAndNonZero) {
  TempDir dir("host");
  HostTree t(dir);
  build_l4_runbook(t);
  auto r = factory_host(t, {"check", "--pci-ids", (dir / "pci.ids").string()});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(lines(r.output).size(), 1u) << r.output;
  EXPECT_EQ(
      r.output.rfind("factory: --pci-ids " + (dir / "pci.ids").string() + ": no such file", 0), 0u)
      << r.output;
}

TEST(HostCheck, CardSharingItsGroupWithANicInUseFails) {
  TempDir dir("host");
  HostTree t(dir);
  t.overlay(host_fixtures() / "amd-epyc-host" / "root");
  t.add(facts_file("workstation-shared-group"));
  int rc = -1;
  json doc = check_json(t, {}, &rc);
  EXPECT_EQ(rc, 1);
  const auto& c = check_named(doc, "gpu 0000:21:00.0");
  EXPECT_EQ(c["verdict"], "fail");
  EXPECT_NE(
      c["detail"].get<std::string>().find(
          "IOMMU group 14 also holds 0000:22:00.0 (8086:1533, class 0200, driver igb), which the "
          "host is using"),
      std::string::npos)
      << c.dump();
  EXPECT_NE(c["detail"].get<std::string>().find("group not viable"), std::string::npos);
  // Every NVIDIA function is listed, the audio function too, with its group's other members.
  ASSERT_EQ(doc["gpus"].size(), 2u);
  EXPECT_EQ(gpu_at(doc, "0000:21:00.0")["group_members"],
            json::array({"0000:20:03.1", "0000:21:00.1", "0000:22:00.0"}));
  EXPECT_EQ(gpu_at(doc, "0000:21:00.1")["driver"], "snd_hda_intel");
}

TEST(HostCheck, ReportsPersistencedAndOtherProcessesHoldingACard) {
  TempDir dir("host");
  HostTree t(dir);
  build_l4_runbook(t);
  t.add_process(2201, "nvidia-persistenced", {"/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia1"});
  t.add_process(3100, "python3", {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia1"});
  json doc = check_json(t);
  EXPECT_NE(check_named(doc, "nvidia-persistenced")["detail"].get<std::string>().find(
                "running (pid 2201)"),
            std::string::npos);
  EXPECT_EQ(check_named(doc, "gpu 0000:01:00.0")["verdict"], "ok") << "only persistenced holds it";
  const auto& busy = check_named(doc, "gpu 0000:41:00.0");
  EXPECT_EQ(busy["verdict"], "warn");
  EXPECT_NE(busy["detail"].get<std::string>().find("python3 (pid 3100) through /dev/nvidia1"),
            std::string::npos);
}

TEST(HostCheck, CardAlreadyOnVfioAndOneNotPersisted) {
  TempDir dir("host");
  HostTree t(dir);
  build_l4_runbook(t);
  put_on_vfio(t, "0000:01:00.0", /*with_driverctl=*/true);
  put_on_vfio(t, "0000:41:00.0", /*with_driverctl=*/false);
  json doc = check_json(t);
  EXPECT_EQ(gpu_at(doc, "0000:01:00.0")["driver"], "vfio-pci");
  EXPECT_EQ(gpu_at(doc, "0000:01:00.0")["override"], "vfio-pci");
  EXPECT_TRUE(gpu_at(doc, "0000:41:00.0")["override"].is_null());
  EXPECT_EQ(check_named(doc, "gpu 0000:01:00.0")["verdict"], "ok");
  const auto& lost = check_named(doc, "gpu 0000:41:00.0");
  EXPECT_EQ(lost["verdict"], "warn");
  EXPECT_EQ(lost["fix"], "factory host bind --pci 0000:41:00.0");
  EXPECT_EQ(check_named(doc, "vfio-modules")["detail"], "vfio, vfio_iommu_type1, vfio_pci loaded");
  EXPECT_EQ(check_named(doc, "vfio-modules-at-boot")["detail"],
            "listed in /etc/modules-load.d/vfio.conf");
}

TEST(HostCheck, IommuTurnedOffOnTheCommandLineFails) {
  TempDir dir("host");
  HostTree t(dir);
  build_l4_runbook(t);
  write_text(t / "/proc/cmdline", "BOOT_IMAGE=/boot/vmlinuz-6.8.0-45-generic ro amd_iommu=off\n");
  int rc = -1;
  json doc = check_json(t, {}, &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_EQ(check_named(doc, "kernel-cmdline")["verdict"], "fail");
  EXPECT_NE(
      check_named(doc, "kernel-cmdline")["fix"].get<std::string>().find("remove amd_iommu=off"),
      std::string::npos);
}

TEST(HostCheck, CardOnVfioWithItsAudioLeftOnTheHostFails) {
  TempDir dir("host");
  HostTree t(dir);
  t.overlay(host_fixtures() / "amd-epyc-host" / "root");
  t.add(facts_file("workstation-shared-group"));
  t.unlink_driver("0000:22:00.0");
  put_on_vfio(t, "0000:21:00.0", /*with_driverctl=*/true);  // 0000:21:00.1 stays on snd_hda_intel
  int rc = -1;
  json doc = check_json(t, {}, &rc);
  EXPECT_EQ(rc, 1);
  const auto& c = check_named(doc, "gpu 0000:21:00.0");
  EXPECT_EQ(c["verdict"], "fail");
  EXPECT_NE(c["detail"].get<std::string>().find("its own 0000:21:00.1 on snd_hda_intel is not"),
            std::string::npos)
      << c.dump();
  EXPECT_EQ(c["fix"], "factory host bind --pci 0000:21:00.0");
}
