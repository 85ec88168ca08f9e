// `factory host bind` / `unbind` through the real binary on host trees, with
// stand-ins for what cannot run here:
//  - the kernel's driver binding: KernelStandIn (host_tree.hpp) reacts to the
//    writes to bind / unbind / drivers_probe / driver_override as the kernel
//    does, moving the `driver` links, and logs each write it saw;
//  - driverctl, modprobe, systemctl: the scripts in tests/fixtures/host/bin,
//    first on PATH, which log their argv and change the tree as the real tools
//    change the host (driverctl's /etc/driverctl.d/pci-<addr>, /sys/module/<m>
//    and the vfio-pci driver directory, the persistence daemon's /proc entry).
// The log therefore lists, in order, every command run and every sysfs file
// written with its value.
#include <gtest/gtest.h>

#include "tests/coordinator/host_tree.hpp"
#include "tests/support/test_support.hpp"

using namespace factory::testing;
using namespace factory::testing::hosttree;

namespace {

using Lines = std::vector<std::string>;

// The line on stderr (the output's "factory: " line).
std::string error_line(const factory::CommandResult& r) {
  for (const auto& l : lines(r.output))
    if (l.rfind("factory: ", 0) == 0) return l;
  return "";
}

// Bad input: one line, non-zero exit, nothing changed, nothing run.
void expect_refused(const HostTree& t, const std::vector<std::string>& args,
                    const std::string& line_start, std::map<std::string, std::string> env = {}) {
  Snapshot before = snapshot(t.root());
  auto r = factory_host(t, args, env);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_EQ(lines(r.output).size(), 1u) << "one clear line:\n" << r.output;
  EXPECT_EQ(r.output.rfind(line_start, 0), 0u) << r.output;
  EXPECT_EQ(snapshot_diff(before, snapshot(t.root())), Lines{}) << "nothing changed";
  EXPECT_EQ(t.log_lines(), Lines{}) << "nothing run, nothing written";
}

void preload_vfio(HostTree& t) {
  t.add_driver("vfio-pci");
  for (const char* m : {"vfio", "vfio_iommu_type1", "vfio_pci"})
    write_text(t / ("/sys/module/" + std::string(m) + "/initstate"), "live\n");
  write_text(t / "/etc/modules-load.d/vfio.conf", "vfio\nvfio_iommu_type1\nvfio_pci\n");
}

// Only the paths under these prefixes may differ.
void expect_changes_only_under(const Snapshot& before, const Snapshot& after,
                               const Lines& prefixes) {
  for (const auto& d : snapshot_diff(before, after)) {
    std::string path = d.substr(d.find(' ') + 1);
    bool allowed = false;
    for (const auto& p : prefixes) allowed |= path.rfind(p, 0) == 0;
    EXPECT_TRUE(allowed) << d;
  }
}

}  // namespace

TEST(HostBind, BindsOneL4ByAddressAndLeavesTheOtherOnTheHost) {
  TempDir dir("host");
  HostTree t(dir);
  build_l4_runbook(t);
  KernelStandIn kernel(t);
  Snapshot before = snapshot(t.root());

  auto r = factory_host(t, {"bind", "--pci", "0000:01:00.0"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(t.log_lines(), (Lines{
                               "modprobe vfio",
                               "modprobe vfio_iommu_type1",
                               "modprobe vfio_pci",
                               "write /sys/bus/pci/drivers/nvidia/unbind 0000:01:00.0",
                               "write /sys/bus/pci/devices/0000:01:00.0/driver_override vfio-pci",
                               "write /sys/bus/pci/drivers/vfio-pci/bind 0000:01:00.0",
                               "driverctl set-override 0000:01:00.0 vfio-pci",
                           }));
  EXPECT_EQ(t.driver("0000:01:00.0"), "vfio-pci");
  EXPECT_EQ(t.driver_override("0000:01:00.0"), "vfio-pci");
  EXPECT_EQ(read_text(t / "/etc/driverctl.d/pci-0000:01:00.0"), "vfio-pci\n");
  EXPECT_EQ(read_text(t / "/etc/modules-load.d/vfio.conf"), "vfio\nvfio_iommu_type1\nvfio_pci\n");
  EXPECT_NE(r.output.find(
                "0000:01:00.0: on vfio-pci, driver_override vfio-pci, driverctl override vfio-pci"),
            std::string::npos)
      << r.output;

  // 0000:41:00.0 untouched; driverctl holds an override for 0000:01:00.0 only.
  EXPECT_EQ(t.driver("0000:41:00.0"), "nvidia");
  EXPECT_EQ(t.driver_override("0000:41:00.0"), "(null)");
  Lines overrides;
  for (const auto& e : fs::directory_iterator(t / "/etc/driverctl.d"))
    overrides.push_back(e.path().filename().string());
  EXPECT_EQ(overrides, Lines{"pci-0000:01:00.0"});
  Snapshot after = snapshot(t.root());
  expect_changes_only_under(before, after,
                            {"sys/devices/pci0000:01/0000:01:00.0/", "sys/bus/pci/drivers/nvidia/",
                             "sys/bus/pci/drivers/vfio-pci", "sys/module/vfio", "etc"});
  for (const auto& [path, v] : before)
    if (path.find("0000:41:00.0") != std::string::npos) {
      EXPECT_EQ(after[path], v) << path;
    }

  // `driverctl list-overrides` (the stand-in reads the same files) shows what the runbook shows.
  auto list = run({(host_fixtures() / "bin" / "driverctl").string(), "list-overrides"},
                  std::chrono::seconds(10), t.env());
  EXPECT_EQ(list.output, "0000:01:00.0 vfio-pci\n");
}

TEST(HostBind, SecondRunReportsAlreadyBoundAndChangesNothing) {
  TempDir dir("host");
  HostTree t(dir);
  build_l4_runbook(t);
  KernelStandIn kernel(t);
  ASSERT_EQ(factory_host(t, {"bind", "--pci", "0000:01:00.0"}).exit_code, 0);
  const size_t logged = t.log_lines().size();
  Snapshot before = snapshot(t.root());
  auto again = factory_host(t, {"bind", "--pci", "0000:01:00.0"});
  EXPECT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(
      again.output,
      "0000:01:00.0: already bound to vfio-pci and kept there by driverctl; nothing changed\n");
  EXPECT_EQ(snapshot_diff(before, snapshot(t.root())), Lines{});
  EXPECT_EQ(t.log_lines().size(), logged);
}

TEST(HostBind, DryRunPrintsEachActionAndChangesNothing) {
  TempDir dir("host");
  HostTree t(dir);
  build_l4_runbook(t);
  KernelStandIn kernel(t);
  Snapshot before = snapshot(t.root());
  auto r = factory_host(t, {"bind", "--pci", "0000:01:00.0", "--dry-run"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(
      lines(r.output),
      (Lines{
          "host:",
          "  modprobe vfio",
          "  modprobe vfio_iommu_type1",
          "  modprobe vfio_pci",
          "  printf '%s\\n' vfio vfio_iommu_type1 vfio_pci > /etc/modules-load.d/vfio.conf    # so "
          "the modules are there at boot for driverctl's override",
          "0000:01:00.0 (10de:27b8 AD104GL [L4], on nvidia, IOMMU group 13):",
          "  echo 0000:01:00.0 > /sys/bus/pci/devices/0000:01:00.0/driver/unbind",
          "  echo vfio-pci > /sys/bus/pci/devices/0000:01:00.0/driver_override    # so that only "
          "vfio-pci may take it",
          "  echo 0000:01:00.0 > /sys/bus/pci/drivers/vfio-pci/bind",
          "  driverctl set-override 0000:01:00.0 vfio-pci    # a driver_override in sysfs is gone "
          "after a reboot; driverctl re-applies it at boot",
          "dry run: nothing was changed",
      }));
  EXPECT_EQ(snapshot_diff(before, snapshot(t.root())), Lines{});
  EXPECT_EQ(t.log_lines(), Lines{});
}

TEST(HostBind, BadInputGetsOneLineAndChangesNothing) {
  TempDir dir("host");
  HostTree t(dir);
  build_l4_runbook(t);
  KernelStandIn kernel(t);
  ASSERT_NO_FATAL_FAILURE(expect_refused(t, {"bind", "--pci", "0000:01:00"},
                                         "factory: malformed PCI address \"0000:01:00\""));
  ASSERT_NO_FATAL_FAILURE(expect_refused(t, {"bind", "--pci", "0000:01:00.0", "--pci", "1:00.0"},
                                         "factory: malformed PCI address \"1:00.0\""));
  ASSERT_NO_FATAL_FAILURE(
      expect_refused(t, {"bind", "--pci", "0000:99:00.0"},
                     "factory: bind: no PCI function 0000:99:00.0 on this host"));
  ASSERT_NO_FATAL_FAILURE(expect_refused(
      t, {"bind", "--pci", "0000:c1:00.0"},
      "factory: bind: 0000:c1:00.0 is not an NVIDIA function (8086:1521, class 0200)"));
  ASSERT_NO_FATAL_FAILURE(expect_refused(
      t, {"bind", "--pci", "0000:01:00.0", "--pci-ids", (dir / "missing.ids").string()},
      "factory: --pci-ids " + (dir / "missing.ids").string() + ": no such file"));
  ASSERT_NO_FATAL_FAILURE(
      expect_refused(t, {"bind", "--pci", "0000:01:00.0", "--euid", "1000"},
                     "factory: factory host bind writes /sys and /etc, so it must run as root"));
  ASSERT_NO_FATAL_FAILURE(
      expect_refused(t, {"unbind", "--pci", "0000:01:00.0", "--euid", "1000"},
                     "factory: factory host unbind writes /sys and /etc, so it must run as root"));
  ASSERT_NO_FATAL_FAILURE(expect_refused(
      t, {"unbind", "--pci", "0000:00:01.1"},
      "factory: unbind: 0000:00:01.1 is not an NVIDIA function (1022:1483, class 0604)"));
  // A bad address among good ones: refused before anything is touched.
  ASSERT_NO_FATAL_FAILURE(expect_refused(t,
                                         {"bind", "--pci", "0000:01:00.0", "--pci", "0000:c1:00.0"},
                                         "factory: bind: 0000:c1:00.0 is not an NVIDIA function"));
  // Without root the dry run still works: it only reads.
  auto dry = factory_host(t, {"bind", "--pci", "0000:01:00.0", "--dry-run", "--euid", "1000"});
  EXPECT_EQ(dry.exit_code, 0) << dry.output;
}

TEST(HostBind, BindsBothCardsAsTheRunbookDoesAndUnbindsOne) {
  TempDir dir("host");
  HostTree t(dir);
  build_l4_runbook(t);
  KernelStandIn kernel(t);
  // The runbook's PCI_ADDRS form: one space-separated list.
  auto r = factory_host(t, {"bind", "--pci", "0000:01:00.0 0000:41:00.0"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(t.driver("0000:01:00.0"), "vfio-pci");
  EXPECT_EQ(t.driver("0000:41:00.0"), "vfio-pci");
  auto list = run({(host_fixtures() / "bin" / "driverctl").string(), "list-overrides"},
                  std::chrono::seconds(10), t.env());
  EXPECT_EQ(list.output,
            "0000:01:00.0 vfio-pci\n0000:41:00.0 vfio-pci\n");  // as in host-lspci-vfio.txt

  // Unbind gives 0000:41:00.0 back to nvidia and removes its override only.
  std::filesystem::remove(t.log());
  auto u = factory_host(t, {"unbind", "--pci", "0000:41:00.0"});
  ASSERT_EQ(u.exit_code, 0) << u.output;
  EXPECT_EQ(t.log_lines(), (Lines{
                               "driverctl unset-override 0000:41:00.0",
                               "write /sys/bus/pci/devices/0000:41:00.0/driver_override ",
                               "write /sys/bus/pci/drivers/vfio-pci/unbind 0000:41:00.0",
                               "write /sys/bus/pci/drivers_probe 0000:41:00.0",
                           }));
  EXPECT_EQ(t.driver("0000:41:00.0"), "nvidia");
  EXPECT_EQ(t.driver_override("0000:41:00.0"), "(null)");
  EXPECT_FALSE(fs::exists(t / "/etc/driverctl.d/pci-0000:41:00.0"));
  EXPECT_EQ(t.driver("0000:01:00.0"), "vfio-pci");
  EXPECT_TRUE(fs::exists(t / "/etc/driverctl.d/pci-0000:01:00.0"));
  EXPECT_NE(u.output.find("0000:41:00.0: on nvidia, no driver_override, no driverctl override"),
            std::string::npos)
      << u.output;

  // A second unbind has nothing to do.
  Snapshot before = snapshot(t.root());
  auto again = factory_host(t, {"unbind", "--pci", "0000:41:00.0"});
  EXPECT_EQ(again.exit_code, 0);
  EXPECT_EQ(again.output, "0000:41:00.0: not bound to vfio-pci (on nvidia); nothing changed\n");
  EXPECT_EQ(snapshot_diff(before, snapshot(t.root())), Lines{});
}

TEST(HostBind, UnbindDryRunChangesNothing) {
  TempDir dir("host");
  HostTree t(dir);
  build_l4_runbook(t);
  KernelStandIn kernel(t);
  ASSERT_EQ(factory_host(t, {"bind", "--pci", "0000:01:00.0"}).exit_code, 0);
  std::filesystem::remove(t.log());
  Snapshot before = snapshot(t.root());
  auto r = factory_host(t, {"unbind", "--pci", "0000:01:00.0", "--dry-run"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("  driverctl unset-override 0000:01:00.0\n"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("  echo 0000:01:00.0 > /sys/bus/pci/drivers_probe"), std::string::npos);
  EXPECT_EQ(snapshot_diff(before, snapshot(t.root())), Lines{});
  EXPECT_EQ(t.log_lines(), Lines{});
}

TEST(HostBind, BindWriteFailingHalfWayRollsTheCardBack) {
  TempDir dir("host");
  HostTree t(dir);
  build_l4_runbook(t);
  preload_vfio(t);
  // The kernel's bind file replaced by a directory: the write fails with EISDIR
  // after the card has already left nvidia.
  fs::remove(t / "/sys/bus/pci/drivers/vfio-pci/bind");
  fs::create_directory(t / "/sys/bus/pci/drivers/vfio-pci/bind");
  KernelStandIn kernel(t);
  auto r = factory_host(t, {"bind", "--pci", "0000:01:00.0"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(
      error_line(r),
      "factory: bind 0000:01:00.0 failed at \"echo 0000:01:00.0 > "
      "/sys/bus/pci/drivers/vfio-pci/bind\": "
      "Is a directory; rolled back: "
      "0000:01:00.0 is on nvidia, no driver_override, no driverctl override, as before the bind")
      << r.output;
  EXPECT_EQ(t.driver("0000:01:00.0"), "nvidia");
  EXPECT_EQ(t.driver_override("0000:01:00.0"), "(null)");
  EXPECT_FALSE(fs::exists(t / "/etc/driverctl.d"));
  // inotify tells the stand-in that a file was written, not what: it reads the
  // file when it gets to the event. The failed bind is followed at once by the
  // rollback's write to driver_override, so the two driver_override writes may
  // read as one. The bind / unbind writes are exact: factory waits for each
  // one's effect before going on.
  Lines control;
  for (const auto& l : t.log_lines())
    if (l.find("driver_override") == std::string::npos) control.push_back(l);
  EXPECT_EQ(control, (Lines{
                         "write /sys/bus/pci/drivers/nvidia/unbind 0000:01:00.0",
                         "write /sys/bus/pci/drivers/nvidia/bind 0000:01:00.0",
                     }));
}

TEST(HostBind, WhenTheRollbackFailsTooItSaysWhereTheCardIsAndHowToRecover) {
  TempDir dir("host");
  HostTree t(dir);
  build_l4_runbook(t);
  preload_vfio(t);
  for (const char* f : {"/sys/bus/pci/drivers/vfio-pci/bind", "/sys/bus/pci/drivers/nvidia/bind"}) {
    fs::remove(t / f);
    fs::create_directory(t / f);
  }
  KernelStandIn kernel(t);
  auto r = factory_host(t, {"bind", "--pci", "0000:01:00.0"});
  EXPECT_NE(r.exit_code, 0);
  const std::string line = error_line(r);
  EXPECT_NE(
      line.find(
          "rollback incomplete: 0000:01:00.0 is on no driver, no driver_override, no driverctl "
          "override; to recover: echo 0000:01:00.0 > /sys/bus/pci/drivers/nvidia/bind"),
      std::string::npos)
      << r.output;
  EXPECT_NE(
      r.output.find(
          "rollback of \"echo 0000:01:00.0 > /sys/bus/pci/devices/0000:01:00.0/driver/unbind\" "
          "failed"),
      std::string::npos)
      << r.output;
  EXPECT_EQ(t.driver("0000:01:00.0"), "");
}

TEST(HostBind, KernelRefusingTheBindRollsBack) {
  TempDir dir("host");
  HostTree t(dir);
  build_l4_runbook(t);
  KernelStandIn kernel(t);
  kernel.refuse_bind("0000:01:00.0", "vfio-pci");  // vfio-pci's probe failing
  auto r = factory_host(t, {"bind", "--pci", "0000:01:00.0"});
  EXPECT_NE(r.exit_code, 0);
  const std::string line = error_line(r);
  EXPECT_NE(line.find("0000:01:00.0 did not bind to vfio-pci (it is on no driver); the kernel log "
                      "(dmesg) says why"),
            std::string::npos)
      << r.output;
  EXPECT_NE(line.find("rolled back: 0000:01:00.0 is on nvidia"), std::string::npos) << line;
  EXPECT_EQ(t.driver("0000:01:00.0"), "nvidia");
}

TEST(HostBind, DriverctlFailingRollsBackTheWholeCard) {
  TempDir dir("host");
  HostTree t(dir);
  build_l4_runbook(t);
  KernelStandIn kernel(t);
  auto r = factory_host(t, {"bind", "--pci", "0000:01:00.0"}, {{"STANDIN_FAIL_DRIVERCTL", "1"}});
  EXPECT_NE(r.exit_code, 0);
  const std::string line = error_line(r);
  EXPECT_NE(
      line.find("failed at \"driverctl set-override 0000:01:00.0 vfio-pci\": driverctl exited 1: "
                "driverctl: failed to bind device"),
      std::string::npos)
      << r.output;
  EXPECT_NE(
      line.find(
          "rolled back: 0000:01:00.0 is on nvidia, no driver_override, no driverctl override"),
      std::string::npos)
      << line;
  EXPECT_EQ(t.driver("0000:01:00.0"), "nvidia");
  const Lines log = t.log_lines();
  ASSERT_GE(log.size(), 4u);
  EXPECT_EQ(Lines(log.end() - 4, log.end()),
            (Lines{
                "driverctl set-override 0000:01:00.0 vfio-pci",
                "write /sys/bus/pci/drivers/vfio-pci/unbind 0000:01:00.0",
                "write /sys/bus/pci/devices/0000:01:00.0/driver_override ",
                "write /sys/bus/pci/drivers/nvidia/bind 0000:01:00.0",
            }));
}

TEST(HostBind, StopsPersistencedWhileMovingACardAndRestartsItForTheOther) {
  TempDir dir("host");
  HostTree t(dir);
  build_l4_runbook(t);
  preload_vfio(t);
  t.add_process(2201, "nvidia-persistenced", {"/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia1"});
  KernelStandIn kernel(t);
  auto r = factory_host(t, {"bind", "--pci", "0000:01:00.0"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(t.log_lines(), (Lines{
                               "systemctl stop nvidia-persistenced",
                               "write /sys/bus/pci/drivers/nvidia/unbind 0000:01:00.0",
                               "write /sys/bus/pci/devices/0000:01:00.0/driver_override vfio-pci",
                               "write /sys/bus/pci/drivers/vfio-pci/bind 0000:01:00.0",
                               "driverctl set-override 0000:01:00.0 vfio-pci",
                               "systemctl start nvidia-persistenced",
                           }));
  EXPECT_TRUE(fs::exists(t / "/proc/4343/comm")) << "running again for 0000:41:00.0";
  EXPECT_EQ(t.driver("0000:41:00.0"), "nvidia");
}

TEST(HostBind, PersistencedStaysStoppedWhenNoCardIsLeftOnNvidia) {
  TempDir dir("host");
  HostTree t(dir);
  build_l4_runbook(t);
  preload_vfio(t);
  t.add_process(2201, "nvidia-persistenced", {"/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia1"});
  KernelStandIn kernel(t);
  auto r = factory_host(t, {"bind", "--pci", "0000:01:00.0", "--pci", "0000:41:00.0"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const Lines log = t.log_lines();
  EXPECT_EQ(log.front(), "systemctl stop nvidia-persistenced");
  EXPECT_EQ(std::count(log.begin(), log.end(), "systemctl start nvidia-persistenced"), 0);
  EXPECT_FALSE(fs::exists(t / "/proc/2201"));
}

TEST(HostBind, RefusesWhileAnotherProcessHoldsTheCard) {
  TempDir dir("host");
  HostTree t(dir);
  build_l4_runbook(t);
  t.add_process(2201, "nvidia-persistenced", {"/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia1"});
  t.add_process(3100, "python3", {"/dev/nvidiactl", "/dev/nvidia0"});
  KernelStandIn kernel(t);
  ASSERT_NO_FATAL_FAILURE(expect_refused(
      t, {"bind", "--pci", "0000:01:00.0"},
      "factory: bind: 0000:01:00.0 is open by python3 (pid 3100) through /dev/nvidia0; unbinding "
      "nvidia now would hang until they exit: stop them and run bind again"));
}

TEST(HostBind, RefusesACardWhoseGroupHoldsAFunctionTheHostUses) {
  TempDir dir("host");
  HostTree t(dir);
  t.overlay(host_fixtures() / "amd-epyc-host" / "root");
  t.add(facts_file("workstation-shared-group"));
  KernelStandIn kernel(t);
  ASSERT_NO_FATAL_FAILURE(expect_refused(
      t, {"bind", "--pci", "0000:21:00.0"},
      "factory: bind: 0000:21:00.0: IOMMU group 14 also holds 0000:22:00.0 (8086:1533, class "
      "0200, driver igb), which the host is using; KubeVirt needs every function of the group on "
      "vfio-pci (\"group not viable\"), so bind refuses"));
}

TEST(HostBind, MovesTheCardsAudioFunctionWithItAndLeavesTheBridge) {
  TempDir dir("host");
  HostTree t(dir);
  t.overlay(host_fixtures() / "amd-epyc-host" / "root");
  t.add(facts_file("workstation-shared-group"));
  fs::create_directories(t / "/usr/share/hwdata");
  fs::copy_file(host_fixtures() / "pci.ids-debian12-2023.04.10-nvidia",
                t / "/usr/share/hwdata/pci.ids");
  t.unlink_driver("0000:22:00.0");  // the NIC unused: the group is viable
  KernelStandIn kernel(t);
  auto r = factory_host(t, {"bind", "--pci", "0000:21:00.0"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(t.driver("0000:21:00.0"), "vfio-pci");
  EXPECT_EQ(t.driver("0000:21:00.1"), "vfio-pci");
  EXPECT_EQ(t.driver("0000:20:03.1"), "pcieport");
  EXPECT_EQ(t.driver("0000:22:00.0"), "");
  const Lines log = t.log_lines();
  const Lines tail(log.begin() + 3, log.end());  // after the three modprobes
  EXPECT_EQ(tail, (Lines{
                      "write /sys/bus/pci/drivers/nvidia/unbind 0000:21:00.0",
                      "write /sys/bus/pci/devices/0000:21:00.0/driver_override vfio-pci",
                      "write /sys/bus/pci/drivers/vfio-pci/bind 0000:21:00.0",
                      "driverctl set-override 0000:21:00.0 vfio-pci",
                      "write /sys/bus/pci/drivers/snd_hda_intel/unbind 0000:21:00.1",
                      "write /sys/bus/pci/devices/0000:21:00.1/driver_override vfio-pci",
                      "write /sys/bus/pci/drivers/vfio-pci/bind 0000:21:00.1",
                      "driverctl set-override 0000:21:00.1 vfio-pci",
                  }));
  EXPECT_NE(
      r.output.find("0000:21:00.0 (10de:2230 GA102GL [RTX A6000], on nvidia, IOMMU group 14, with "
                    "0000:21:00.1):"),
      std::string::npos)
      << r.output;

  // Unbinding the card gives both functions back to their host drivers.
  auto u = factory_host(t, {"unbind", "--pci", "0000:21:00.0"});
  ASSERT_EQ(u.exit_code, 0) << u.output;
  EXPECT_EQ(t.driver("0000:21:00.0"), "nvidia");
  EXPECT_EQ(t.driver("0000:21:00.1"), "snd_hda_intel");
  EXPECT_FALSE(fs::exists(t / "/etc/driverctl.d/pci-0000:21:00.1"));
}

TEST(HostBind, CardAlreadyOnVfioIsLeftAloneAndAMissingOverrideIsAddedAlone) {
  TempDir dir("host");
  HostTree t(dir);
  build_l4_runbook(t);
  preload_vfio(t);
  for (const char* a : {"0000:01:00.0", "0000:41:00.0"}) {
    t.unlink_driver(a);
    t.link_driver(a, "vfio-pci");
    write_text(t.device_dir(a) / "driver_override", "vfio-pci\n");
  }
  write_text(t / "/etc/driverctl.d/pci-0000:01:00.0", "vfio-pci\n");
  KernelStandIn kernel(t);
  Snapshot before = snapshot(t.root());
  auto r = factory_host(t, {"bind", "--pci", "0000:01:00.0"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("already bound"), std::string::npos);
  EXPECT_EQ(snapshot_diff(before, snapshot(t.root())), Lines{});
  EXPECT_EQ(t.log_lines(), Lines{});

  // 0000:41:00.0 is on vfio-pci but would lose it at reboot: only the override is added.
  auto r2 = factory_host(t, {"bind", "--pci", "0000:41:00.0"});
  EXPECT_EQ(r2.exit_code, 0) << r2.output;
  EXPECT_EQ(t.log_lines(), Lines{"driverctl set-override 0000:41:00.0 vfio-pci"});
}

TEST(HostBind, RealH200GuestHasNoIommuGroupSoBindRefuses) {
  TempDir dir("host");
  HostTree t(dir);
  build_h200_guest(t);
  KernelStandIn kernel(t);
  ASSERT_NO_FATAL_FAILURE(expect_refused(
      t, {"bind", "--pci", "0000:00:06.0"},
      "factory: bind: 0000:00:06.0 has no IOMMU group: the IOMMU is off (or this is a VM without a "
      "virtual IOMMU), so no card can be passed through here"));
}

TEST(HostBind, BuiltInVfioIsNeitherLoadedNorListedForBoot) {
  TempDir dir("host");
  HostTree t(dir);
  build_l4_runbook(t);
  write_text(t / "/lib/modules/6.8.0-45-generic/modules.builtin",
             "kernel/drivers/vfio/vfio.ko\nkernel/drivers/vfio/vfio_iommu_type1.ko\n"
             "kernel/drivers/vfio/pci/vfio-pci.ko\n");
  t.add_driver("vfio-pci");  // a built-in driver is registered from boot
  KernelStandIn kernel(t);
  auto r = factory_host(t, {"bind", "--pci", "0000:41:00.0"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(t.log_lines(), (Lines{
                               "write /sys/bus/pci/drivers/nvidia/unbind 0000:41:00.0",
                               "write /sys/bus/pci/devices/0000:41:00.0/driver_override vfio-pci",
                               "write /sys/bus/pci/drivers/vfio-pci/bind 0000:41:00.0",
                               "driverctl set-override 0000:41:00.0 vfio-pci",
                           }));
  EXPECT_FALSE(fs::exists(t / "/etc/modules-load.d"));
}

// The runbook's host needs no NVIDIA driver: a card may sit on no driver at all.
TEST(HostBind, CardWithoutAHostDriverBindsAndUnbindsToNoDriver) {
  TempDir dir("host");
  HostTree t(dir);
  t.overlay(host_fixtures() / "amd-epyc-host" / "root");
  Facts f = facts_file("l4-runbook");
  for (auto& fn : f.functions)
    if (fn.vendor == "0x10de") fn.driver = fn.native = "";
  t.add(f);
  KernelStandIn kernel(t);
  auto r = factory_host(t, {"bind", "--pci", "0000:41:00.0"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const Lines log = t.log_lines();
  EXPECT_EQ(Lines(log.begin() + 3, log.end()),
            (Lines{
                "write /sys/bus/pci/devices/0000:41:00.0/driver_override vfio-pci",
                "write /sys/bus/pci/drivers/vfio-pci/bind 0000:41:00.0",
                "driverctl set-override 0000:41:00.0 vfio-pci",
            }));
  EXPECT_EQ(t.driver("0000:41:00.0"), "vfio-pci");
  auto u = factory_host(t, {"unbind", "--pci", "0000:41:00.0"});
  ASSERT_EQ(u.exit_code, 0) << u.output;
  EXPECT_EQ(t.driver("0000:41:00.0"), "");
  EXPECT_NE(
      u.output.find("0000:41:00.0: on no driver, no driver_override, no driverctl override (no "
                    "host driver took it"),
      std::string::npos)
      << u.output;
}
