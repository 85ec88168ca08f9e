// Unit tests of the host module's pieces: PCI addresses, reading sysfs the way
// the kernel lays it out, pci.ids, and the KubeVirt resource-name derivation.
#include <gtest/gtest.h>

#include "coordinator/host/host_state.hpp"
#include "coordinator/host/inventory.hpp"
#include "coordinator/host/pci.hpp"
#include "coordinator/host/pci_ids.hpp"
#include "coordinator/host/resource_name.hpp"
#include "tests/coordinator/host_tree.hpp"
#include "tests/support/test_support.hpp"

using namespace factory::host;
using namespace factory::testing;
using namespace factory::testing::hosttree;

TEST(PciAddress, ParsesFullAndShortForms) {
  auto a = PciAddress::parse("0000:01:00.0");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->str(), "0000:01:00.0");
  EXPECT_EQ(a->slot(), "0000:01:00");
  // lspci's short form means domain 0000; upper case is folded.
  auto b = PciAddress::parse("41:00.0");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->str(), "0000:41:00.0");
  EXPECT_EQ(PciAddress::parse("0000:C1:1F.7")->str(), "0000:c1:1f.7");
  // VMD domains go past 0xffff and are printed with more digits.
  EXPECT_EQ(PciAddress::parse("10000:e1:00.0")->str(), "10000:e1:00.0");
  EXPECT_TRUE(PciAddress::parse("0000:01:00.0")->same_slot(*PciAddress::parse("01:00.1")));
  EXPECT_FALSE(PciAddress::parse("0000:01:00.0")->same_slot(*PciAddress::parse("41:00.0")));
}

TEST(PciAddress, RejectsMalformedWithOneClearLine) {
  for (const char* bad :
       {"", "01:00", "0000:1:00.0", "0000:01:00.8", "0000:01:20.0", "0000:01:00.", "000:01:00.0",
        "0000:0g:00.0", "0000:01:00.0 ", "bus1", "0000:01:00:00.0"}) {
    auto r = PciAddress::parse(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code, factory::Errc::invalid_argument);
    EXPECT_NE(r.error().message.find("malformed PCI address"), std::string::npos);
    EXPECT_NE(r.error().message.find("0000:01:00.0"), std::string::npos)
        << "shows the expected form";
    EXPECT_EQ(r.error().message.find('\n'), std::string::npos);
  }
}

TEST(PciBus, ReadsTheRunbookHostLikeTheKernelShowsIt) {
  TempDir dir("host");
  HostTree t(dir);
  build_l4_runbook(t);
  PciBus bus{HostRoot(t.root())};
  auto fns = bus.functions();
  ASSERT_TRUE(fns.ok()) << fns.error().message;
  std::vector<std::string> nvidia;
  for (const auto& f : *fns)
    if (f.is_nvidia()) nvidia.push_back(f.address.str());
  EXPECT_EQ(nvidia, (std::vector<std::string>{"0000:01:00.0", "0000:41:00.0"}));

  auto l4 = bus.function(*PciAddress::parse("0000:41:00.0"));
  ASSERT_TRUE(l4.ok());
  EXPECT_EQ(l4->vendor_id(), "10de");
  EXPECT_EQ(l4->device_id(), "27b8");
  EXPECT_EQ(l4->subsystem_id(), "10de:16ca");
  EXPECT_EQ(l4->class_id(), "0302");
  EXPECT_TRUE(l4->is_display());
  EXPECT_EQ(l4->driver, "nvidia");  // from the `driver` link
  ASSERT_TRUE(l4->iommu_group.has_value());
  EXPECT_EQ(*l4->iommu_group, 35u);    // from the `iommu_group` link
  EXPECT_EQ(l4->driver_override, "");  // "(null)" in sysfs
  EXPECT_EQ(bus.iommu_group_members(35).size(), 1u);
  EXPECT_TRUE(bus.iommu_groups_present());

  auto bridge = bus.function(*PciAddress::parse("0000:40:01.1"));
  ASSERT_TRUE(bridge.ok());
  EXPECT_TRUE(bridge->is_bridge());

  auto missing = bus.function(*PciAddress::parse("0000:99:00.0"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, factory::Errc::not_found);
  EXPECT_NE(missing.error().message.find("no PCI function 0000:99:00.0"), std::string::npos);
}

TEST(PciBus, ReadsTheRealH200GuestWithoutIommuGroups) {
  TempDir dir("host");
  HostTree t(dir);
  build_h200_guest(t);
  PciBus bus{HostRoot(t.root())};
  auto fns = bus.functions();
  ASSERT_TRUE(fns.ok()) << fns.error().message;
  ASSERT_EQ(fns->size(), 7u);  // every line of host-facts.txt
  const auto& h200 = fns->back();
  EXPECT_EQ(h200.address.str(), "0000:00:06.0");
  EXPECT_EQ(h200.device_id(), "2335");
  EXPECT_EQ(h200.subsystem_id(), "10de:18bf");
  EXPECT_EQ(h200.driver, "nvidia");
  EXPECT_FALSE(h200.iommu_group.has_value());
  EXPECT_FALSE(bus.iommu_groups_present());
}

TEST(HostState, ModulesProcessesAndOverrides) {
  TempDir dir("host");
  HostTree t(dir);
  build_l4_runbook(t);
  HostRoot root(t.root());
  auto mods = probe_vfio_modules(root);
  ASSERT_EQ(mods.size(), 3u);
  for (const auto& m : mods) {
    EXPECT_FALSE(m.loaded) << m.name;
    ASSERT_TRUE(m.available.has_value()) << m.name;
    EXPECT_TRUE(*m.available) << m.name
                              << " is in modules.dep (vfio-pci.ko.zst counts as vfio_pci)";
    EXPECT_EQ(m.boot_file, "") << m.name;
  }
  write_text(t / "/etc/modules-load.d/vfio.conf", "# for passthrough\nvfio\nvfio_iommu_type1\n");
  write_text(t / "/etc/modules", "vfio-pci   # Debian's file\n");
  mods = probe_vfio_modules(root);
  EXPECT_EQ(mods[0].boot_file, "/etc/modules-load.d/vfio.conf");
  EXPECT_EQ(mods[2].boot_file, "/etc/modules");

  EXPECT_EQ(nvidia_device_minor(root, *PciAddress::parse("0000:41:00.0")), 1u);
  t.add_process(2201, "nvidia-persistenced", {"/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia1"});
  t.add_process(3100, "python3", {"/dev/nvidia1"});
  auto p = persistenced_process(root);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->pid, 2201);
  EXPECT_EQ(p->comm, "nvidia-persiste");  // the kernel keeps 15 characters
  auto holders = nvidia_device_holders(root, 1);
  ASSERT_EQ(holders.size(), 2u);
  EXPECT_EQ(holders[1].comm, "python3");

  EXPECT_FALSE(driverctl_override(root, *PciAddress::parse("0000:01:00.0")).has_value());
  write_text(t / "/etc/driverctl.d/pci-0000:01:00.0", "vfio-pci\n");
  EXPECT_EQ(driverctl_override(root, *PciAddress::parse("0000:01:00.0")), "vfio-pci");

  auto cpu = probe_cpu_virtualization(root);
  EXPECT_TRUE(cpu.readable);
  EXPECT_EQ(cpu.flag, "svm");
  EXPECT_EQ(cpu.vendor, "AuthenticAMD");
  EXPECT_EQ(iommu_units(root).size(), 8u);
}

TEST(PciIds, ParsesVendorsDevicesSubsystemsAndVersion) {
  auto ids =
      PciIds::load(fixtures_dir() / "third-party" / "pci.ids-nvidia-2025.07.11", "third-party");
  ASSERT_TRUE(ids.ok()) << ids.error().message;
  EXPECT_EQ(ids->version(), "2025.07.11");
  EXPECT_EQ(ids->vendor_name(0x10de), "NVIDIA Corporation");
  EXPECT_EQ(ids->device_name(0x10de, 0x27b8), "AD104GL [L4]");
  EXPECT_EQ(ids->device_name(0x10de, 0x2335), "GH100 [H200 SXM 141GB]");
  // A subsystem line ("\t\t103c 2335  GeForce 820M") is not a device line.
  EXPECT_EQ(ids->subsystem_name(0x10de, 0x0020, 0x1043, 0x0200), "V3400 TNT");
  EXPECT_FALSE(ids->device_name(0x10de, 0xffff).has_value());

  auto debian = PciIds::load(host_fixtures() / "pci.ids-debian12-2023.04.10-nvidia", "debian");
  ASSERT_TRUE(debian.ok());
  EXPECT_EQ(debian->version(), "2023.04.10");
  EXPECT_EQ(debian->device_name(0x10de, 0x27b8), "AD104GL [L4]");
  EXPECT_FALSE(debian->device_name(0x10de, 0x2335).has_value())
      << "Debian 12's list predates the H200";

  // The class list at the end is not a vendor.
  auto p = PciIds::parse(
      "10de  NVIDIA Corporation\n\t27b8  AD104GL [L4]\nC 03  Display controller\n"
      "\t02  3D controller\n",
      "inline");
  EXPECT_EQ(p.device_name(0x10de, 0x0002), std::nullopt);
  EXPECT_EQ(p.device_name(0x10de, 0x27b8), "AD104GL [L4]");
}

TEST(PciIds, MissingOverrideFileIsAnErrorButMissingDistroListIsNot) {
  TempDir dir("host");
  HostTree t(dir);
  build_h200_guest(t);  // the real guest has no pci.ids
  auto none = find_pci_ids(HostRoot(t.root()), "");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  auto typo = find_pci_ids(HostRoot(t.root()), (dir / "nope.ids").string());
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.error().message.find("no such file"), std::string::npos);
  write_text(dir / "garbage.ids", "this is not a pci.ids\n");
  EXPECT_FALSE(find_pci_ids(HostRoot(t.root()), (dir / "garbage.ids").string()).ok());
}

TEST(ResourceName, DerivesNamesLikeNvidiasKubevirtDevicePlugin) {
  // The examples.
  EXPECT_EQ(kubevirt_device_name("AD104GL [L4]"), "AD104GL_L4");
  EXPECT_EQ(kubevirt_device_name("GH100 [H200 SXM 141GB]"), "GH100_H200_SXM_141GB");
  // The plugin's own test vectors (pkg/device_plugin/device_plugin_test.go).
  EXPECT_EQ(kubevirt_device_name("GK104GL [GRID K520]"), "GK104GL_GRID_K520");
  EXPECT_EQ(kubevirt_device_name("gk104gl [grid k520]"), "GK104GL_GRID_K520");
  EXPECT_EQ(kubevirt_device_name("gk104.gl [grid/k./520]"), "GK104_GL_GRID_K__520");
  EXPECT_EQ(kubevirt_device_name("GH100 [H100 PCIe]"), "GH100_H100_PCIE");
  // Runs of white space are one underscore; other punctuation just goes.
  EXPECT_EQ(kubevirt_device_name("  GA102GL   [RTX A6000] "), "GA102GL_RTX_A6000");
  EXPECT_EQ(kubevirt_device_name("GH100 [GH200 120GB / 480GB]"), "GH100_GH200_120GB___480GB");
  EXPECT_EQ(kubevirt_device_name("TU104GL [Tesla T4]"), "TU104GL_TESLA_T4");
  EXPECT_EQ(kubevirt_device_name("GA100 [A100 SXM4 80GB]"), "GA100_A100_SXM4_80GB");
}

TEST(ResourceName, FallsBackToTheRawDeviceIdAndSaysSo) {
  auto third = PciIds::load(fixtures_dir() / "third-party" / "pci.ids-nvidia-2025.07.11",
                            "pci.ids-nvidia-2025.07.11");
  auto debian = PciIds::load(host_fixtures() / "pci.ids-debian12-2023.04.10-nvidia",
                             "/usr/share/misc/pci.ids");
  ASSERT_TRUE(third.ok() && debian.ok());

  auto h200 = kubevirt_resource_name(&*third, 0x2335);
  EXPECT_EQ(h200.name, "nvidia.com/GH100_H200_SXM_141GB");
  EXPECT_TRUE(h200.from_pci_ids);
  EXPECT_EQ(h200.note, "");

  auto old = kubevirt_resource_name(&*debian, 0x2335);
  EXPECT_EQ(old.name, "nvidia.com/2335");
  EXPECT_FALSE(old.from_pci_ids);
  EXPECT_NE(old.note.find("10de:2335 is not in /usr/share/misc/pci.ids (version 2023.04.10)"),
            std::string::npos)
      << old.note;

  auto none = kubevirt_resource_name(nullptr, 0x2335);
  EXPECT_EQ(none.name, "nvidia.com/2335");
  EXPECT_NE(none.note.find("no pci.ids"), std::string::npos);

  EXPECT_EQ(kubevirt_resource_name(&*debian, 0x27b8).name, "nvidia.com/AD104GL_L4");
}

TEST(IommuGroup, CardFunctionsMoveBridgesStayHostDevicesBlock) {
  TempDir dir("host");
  HostTree t(dir);
  t.overlay(host_fixtures() / "amd-epyc-host" / "root");
  t.add(facts_file("workstation-shared-group"));
  PciBus bus{HostRoot(t.root())};
  auto inv = take_inventory(bus, nullptr);
  ASSERT_TRUE(inv.ok());
  auto ga = analyze_group(*inv, bus, 14, {*PciAddress::parse("0000:21:00.0")});
  ASSERT_EQ(ga.members.size(), 4u);
  EXPECT_EQ(ga.members[0].role, MemberRole::bridge);  // 0000:20:03.1, pcieport
  EXPECT_EQ(ga.members[1].role, MemberRole::card);    // the GPU
  EXPECT_EQ(ga.members[2].role, MemberRole::card);    // its audio function
  EXPECT_EQ(ga.members[3].role, MemberRole::in_use);  // the NIC on igb
  EXPECT_NE(ga.blocker_text().find("0000:22:00.0 (8086:1533, class 0200, driver igb)"),
            std::string::npos)
      << ga.blocker_text();
  // The same NIC with no driver leaves the group viable.
  t.unlink_driver("0000:22:00.0");
  inv = take_inventory(bus, nullptr);
  ga = analyze_group(*inv, bus, 14, {*PciAddress::parse("0000:21:00.1")});
  EXPECT_TRUE(ga.blockers().empty());
  EXPECT_EQ(ga.to_move().size(), 2u);
}

TEST(HostState, BuiltInVfioNeedsNoLoadingAndNoModulesLoadFile) {
  TempDir dir("host");
  HostTree t(dir);
  build_l4_runbook(t);
  // Some distributions build vfio into the kernel (modules.builtin lists it).
  write_text(t / "/lib/modules/6.8.0-45-generic/modules.builtin",
             "kernel/drivers/vfio/vfio.ko\nkernel/drivers/vfio/vfio_iommu_type1.ko\n"
             "kernel/drivers/vfio/pci/vfio-pci.ko\n");
  auto mods = probe_vfio_modules(HostRoot(t.root()));
  for (const auto& m : mods) {
    EXPECT_TRUE(m.builtin) << m.name;
    EXPECT_TRUE(m.loaded) << m.name;
  }
}
