// The QEMU provider's pure parts: quantities, the base image's description,
// the command lines, which cards a tenant may get, and the config keys.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "common/atomic_file.hpp"
#include "coordinator/config/coordinator_config.hpp"
#include "coordinator/qemu/accel.hpp"
#include "coordinator/qemu/gpus.hpp"
#include "coordinator/qemu/launch.hpp"
#include "tests/coordinator/host_tree.hpp"
#include "tests/support/test_support.hpp"

using namespace factory;
using namespace factory::qemu;
using factory::testing::TempDir;

namespace {

bool has_pair(const std::vector<std::string>& argv, const std::string& flag,
              const std::string& value) {
  for (size_t i = 0; i + 1 < argv.size(); ++i)
    if (argv[i] == flag && argv[i + 1] == value) return true;
  return false;
}

bool has(const std::vector<std::string>& argv, const std::string& arg) {
  return std::find(argv.begin(), argv.end(), arg) != argv.end();
}

Launch sample_launch() {
  Launch l;
  l.tenant = "tenant-1";
  l.dir = "/var/lib/factory/vms/tenant-1";
  l.vcpus = 2;
  l.memory_mib = 2048;
  l.accel = "tcg";
  l.ssh_port = 30022;
  l.image.disk = "/images/base/disk.qcow2";
  l.image.format = "qcow2";
  return l;
}

}  // namespace

TEST(QemuQuantities, CpusRoundUpAndSizesAreBytes) {
  EXPECT_EQ(*vcpus_from_quantity("8"), 8);
  EXPECT_EQ(*vcpus_from_quantity("500m"), 1);
  EXPECT_EQ(*vcpus_from_quantity("2.5"), 3);
  EXPECT_EQ(*vcpus_from_quantity("2000m"), 2);
  EXPECT_FALSE(vcpus_from_quantity("lots").ok());
  EXPECT_FALSE(vcpus_from_quantity("1000").ok());
  EXPECT_EQ(*bytes_from_quantity("16Gi"), 16ull << 30);
  EXPECT_EQ(*bytes_from_quantity("2048Mi"), 2048ull << 20);
  EXPECT_EQ(*bytes_from_quantity("2G"), 2000000000ull);
  EXPECT_EQ(*bytes_from_quantity("1e3"), 1000ull);
  EXPECT_EQ(*bytes_from_quantity("100Gi"), 100ull << 30);
  auto bad = bytes_from_quantity("16GB");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("unknown suffix 'GB'"), std::string::npos);
}

TEST(QemuLaunch, CommandLineHasTheMachineTheSeedTheForwardAndTheSockets) {
  Launch l = sample_launch();
  auto a = qemu_argv("/usr/bin/qemu-system-x86_64", l);
  EXPECT_EQ(a.front(), "/usr/bin/qemu-system-x86_64");
  EXPECT_TRUE(has_pair(a, "-machine", "q35"));
  EXPECT_TRUE(has_pair(a, "-accel", "tcg"));
  EXPECT_TRUE(has_pair(a, "-smp", "2"));
  EXPECT_TRUE(has_pair(a, "-m", "2048M"));
  EXPECT_TRUE(has_pair(a, "-name", "guest=factory-vm-tenant-1,process=factory-vm-tenant-1"));
  // TCG emulates QEMU's own CPU model; only KVM gets the host's.
  EXPECT_FALSE(has(a, "-cpu"));
  EXPECT_TRUE(has_pair(a, "-drive",
                       "file=/var/lib/factory/vms/tenant-1/disk.qcow2,if=virtio,format=qcow2,"
                       "discard=unmap"));
  EXPECT_TRUE(has_pair(a, "-drive",
                       "file=/var/lib/factory/vms/tenant-1/seed.iso,if=virtio,format=raw,"
                       "media=cdrom,readonly=on"));
  EXPECT_TRUE(has_pair(a, "-netdev", "user,id=net0,hostfwd=tcp:127.0.0.1:30022-:22"));
  // Relative to the VM's folder, QEMU's working directory (socket paths are short).
  EXPECT_TRUE(has_pair(a, "-qmp", "unix:qmp.sock,server=on,wait=off"));
  EXPECT_TRUE(has_pair(a, "-pidfile", "/var/lib/factory/vms/tenant-1/qemu.pid"));
  EXPECT_TRUE(has_pair(a, "-chardev",
                       "file,id=console,path=/var/lib/factory/vms/tenant-1/console.log,append=on"));
  // No boot loader given: the firmware boots the disk; no card: no vfio.
  EXPECT_FALSE(has(a, "-kernel"));
  for (const auto& x : a) EXPECT_EQ(x.find("vfio"), std::string::npos) << x;
  // A guest reboot must reset the machine, not end QEMU.
  EXPECT_FALSE(has(a, "-no-reboot"));
}

TEST(QemuLaunch, KvmDirectKernelAndEachGpuOnItsOwnRootPort) {
  Launch l = sample_launch();
  l.accel = "kvm";
  l.image.kernel = "/images/base/vmlinuz";
  l.image.initrd = "/images/base/initrd.img";
  l.image.append = "root=LABEL=root rw console=ttyS0 ds=nocloud";
  l.gpus = {"0000:01:00.0", "0000:41:00.0"};
  auto a = qemu_argv("qemu-system-x86_64", l);
  EXPECT_TRUE(has_pair(a, "-cpu", "host"));
  EXPECT_TRUE(has_pair(a, "-kernel", "/images/base/vmlinuz"));
  EXPECT_TRUE(has_pair(a, "-initrd", "/images/base/initrd.img"));
  EXPECT_TRUE(has_pair(a, "-append", "root=LABEL=root rw console=ttyS0 ds=nocloud"));
  EXPECT_TRUE(has_pair(a, "-device", "pcie-root-port,id=gpuport0,bus=pcie.0,chassis=1"));
  EXPECT_TRUE(has_pair(a, "-device", "vfio-pci,host=0000:01:00.0,bus=gpuport0"));
  EXPECT_TRUE(has_pair(a, "-device", "pcie-root-port,id=gpuport1,bus=pcie.0,chassis=2"));
  EXPECT_TRUE(has_pair(a, "-device", "vfio-pci,host=0000:41:00.0,bus=gpuport1"));
}

TEST(QemuLaunch, SystemdRunMakesTheTransientUnitThatRestarts) {
  Launch l = sample_launch();
  auto q = qemu_argv("qemu-system-x86_64", l);
  auto a = systemd_run_argv("systemd-run", q, l);
  EXPECT_EQ(a.front(), "systemd-run");
  EXPECT_TRUE(has(a, "--unit=factory-vm-tenant-1"));
  EXPECT_TRUE(has(a, "--property=Restart=always"));
  EXPECT_TRUE(has(a, "--working-directory=/var/lib/factory/vms/tenant-1"));
  auto dd = std::find(a.begin(), a.end(), "--");
  ASSERT_NE(dd, a.end());
  EXPECT_EQ(std::vector<std::string>(dd + 1, a.end()), q);
}

TEST(QemuImage, FolderWithImageJsonOrADiskFile) {
  TempDir dir("img");
  EXPECT_NE(load_base_image("").error().message.find("build-image.sh"), std::string::npos);
  EXPECT_NE(load_base_image((dir / "absent").string()).error().message.find("does not exist"),
            std::string::npos);
  ASSERT_TRUE(write_file_atomic(dir / "disk.qcow2", std::string("QFI\xfb", 4) + "rest", 0644).ok());
  ASSERT_TRUE(write_file_atomic(dir / "vmlinuz", "k", 0644).ok());
  ASSERT_TRUE(write_file_atomic(dir / "initrd.img", "i", 0644).ok());
  EXPECT_NE(load_base_image(dir.path().string()).error().message.find("without image.json"),
            std::string::npos);
  ASSERT_TRUE(
      write_file_atomic(dir / "image.json",
                        R"({"disk": "disk.qcow2", "kernel": "vmlinuz", "initrd": "initrd.img",
                                    "append": "root=LABEL=root rw console=ttyS0 ds=nocloud"})",
                        0644)
          .ok());
  auto img = load_base_image(dir.path().string());
  ASSERT_TRUE(img.ok()) << img.error().message;
  EXPECT_EQ(img->format, "qcow2");
  EXPECT_EQ(img->disk, (dir / "disk.qcow2").string());
  EXPECT_EQ(img->kernel, (dir / "vmlinuz").string());
  EXPECT_TRUE(img->direct_kernel());
  ASSERT_TRUE(write_file_atomic(dir / "plain.img", std::string(1024, '\0'), 0644).ok());
  auto raw = load_base_image((dir / "plain.img").string());
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(raw->format, "raw");
  EXPECT_FALSE(raw->direct_kernel());
  std::filesystem::remove(dir / "vmlinuz");
  EXPECT_NE(load_base_image(dir.path().string()).error().message.find("is missing"),
            std::string::npos);
}

TEST(QemuAccel, ProbeSectorIsABootSectorThatEndsQemu) {
  std::string s = probe_boot_sector();
  ASSERT_EQ(s.size(), 512u);
  EXPECT_EQ(static_cast<unsigned char>(s[510]), 0x55);
  EXPECT_EQ(static_cast<unsigned char>(s[511]), 0xAA);
  EXPECT_NE(s.find(kProbeBanner), std::string::npos);
  AcceleratorProbe p;
  p.qemu_binary = "qemu-system-x86_64";
  p.work_dir = "/nonexistent";
  p.mode = "tcg";
  EXPECT_EQ(choose_accelerator(p).name, "tcg");
  p.mode = "kvm";
  EXPECT_EQ(choose_accelerator(p).name, "kvm");
}

namespace {

// Stands in for the kernel that hung under KVM on a CI machine: it printed
// its setup code's line, then nothing, for good. A multiboot image QEMU's
// -kernel loads (the header's a.out fields: loaded whole at 1 MiB), whose
// 32-bit code writes that line to COM1 and halts.
std::string setup_line_then_silence_kernel() {
  const std::uint32_t base = 0x100000, magic = 0x1BADB002, flags = 0x00010000;
  std::string k;
  auto u32 = [&](std::uint32_t v) {
    for (int i = 0; i < 4; ++i) k.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  u32(magic);
  u32(flags);
  u32(0u - (magic + flags));
  u32(base);       // header_addr
  u32(base);       // load_addr
  u32(0);          // load_end_addr: the whole file
  u32(0);          // bss_end_addr: none
  u32(base + 32);  // entry: right after this header
  // mov edx,0x3f8; mov esi,msg; loop: lodsb; test al,al; jz halt; out dx,al;
  // jmp loop; halt: cli; hlt; jmp halt; msg:
  const unsigned char code[] = {0xBA, 0xF8, 0x03, 0x00, 0x00, 0xBE, 0,    0,    0,    0,    0xAC,
                                0x84, 0xC0, 0x74, 0x03, 0xEE, 0xEB, 0xF8, 0xFA, 0xF4, 0xEB, 0xFC};
  k.append(reinterpret_cast<const char*>(code), sizeof code);
  const std::uint32_t msg = base + static_cast<std::uint32_t>(k.size());
  for (int i = 0; i < 4; ++i) k[32 + 6 + i] = static_cast<char>((msg >> (8 * i)) & 0xff);
  k += "Probing EDD (edd=off to disable)... ok\r\n";
  k.push_back('\0');
  k.resize(4096, '\0');
  return k;
}

}  // namespace

// The real-mode probe under TCG (KVM is absent on most machines this runs
// on): the banner is seen, and a sector that prints something else and
// halts is a problem that names what it printed.
TEST(QemuAccel, BootSectorProbeSeesItsBannerAndNamesWhatElseCame) {
  factory::testing::TempDir dir;
  const std::string disk = (dir.path() / "probe.img").string();
  std::string image = probe_boot_sector();
  image.resize(1 << 20, '\0');
  ASSERT_TRUE(write_file_atomic(disk, image, 0600).ok());
  EXPECT_EQ(boot_sector_problem("qemu-system-x86_64", "tcg", disk, kProbeBanner,
                                std::chrono::seconds(30)),
            "");

  image = probe_boot_sector("something else", /*exit=*/false);
  image.resize(1 << 20, '\0');
  ASSERT_TRUE(write_file_atomic(disk, image, 0600).ok());
  const auto t0 = std::chrono::steady_clock::now();
  std::string problem =
      boot_sector_problem("qemu-system-x86_64", "tcg", disk, kProbeBanner, std::chrono::seconds(3));
  EXPECT_NE(problem.find("something else"), std::string::npos) << problem;
  // It halted rather than exiting: the deadline ended it.
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(2900));
}

// The CI machine's failure: a kernel that gets through its setup code and
// then says nothing is not a kernel that boots. The probe ends it at the
// deadline and reports the last line, and a file that is no kernel at all
// is reported as such; both mean TCG (choose_accelerator). A real kernel
// reaching its root mount is checked in e2e_vm, with the image's kernel.
TEST(QemuAccel, AKernelSilentAfterItsSetupLineHasNotBooted) {
  factory::testing::TempDir dir;
  const std::string kernel = (dir.path() / "vmlinuz").string();
  ASSERT_TRUE(write_file_atomic(kernel, setup_line_then_silence_kernel(), 0600).ok());
  auto b = probe_kernel_boot("qemu-system-x86_64", "tcg", kernel, 2, std::chrono::seconds(3));
  ASSERT_TRUE(b.ok()) << b.error().message;
  EXPECT_FALSE(b->reached_root_mount);
  EXPECT_TRUE(b->timed_out);
  EXPECT_EQ(b->last_line, "Probing EDD (edd=off to disable)... ok");
  EXPECT_GE(b->seconds, 2.9);

  ASSERT_TRUE(write_file_atomic(kernel, std::string(4096, 'x'), 0600).ok());
  b = probe_kernel_boot("qemu-system-x86_64", "tcg", kernel, 2, std::chrono::seconds(10));
  ASSERT_TRUE(b.ok()) << b.error().message;
  EXPECT_FALSE(b->reached_root_mount);
  EXPECT_FALSE(b->timed_out);
  EXPECT_FALSE(b->last_line.empty());
}

// ---- cards ----

namespace {

namespace ht = factory::testing::hosttree;

// The runbook's host after `factory host bind 0000:01:00.0`: that L4 on
// vfio-pci with driverctl's override, the other still on nvidia.
void build_one_bound(ht::HostTree& t, bool with_override = true) {
  t.overlay(ht::host_fixtures() / "amd-epyc-host" / "root");
  t.overlay(ht::host_fixtures() / "l4-runbook" / "root");
  auto facts = ht::facts_file("l4-runbook");
  for (auto& f : facts.functions)
    if (f.addr == "0000:01:00.0") f.driver = "vfio-pci";
  t.add(facts);
  std::filesystem::create_directories(t / "/usr/share/misc");
  std::filesystem::copy_file(ht::host_fixtures() / "pci.ids-debian12-2023.04.10-nvidia",
                             t / "/usr/share/misc/pci.ids");
  if (with_override) ht::write_text(t / "/etc/driverctl.d/pci-0000:01:00.0", "vfio-pci\n");
}

}  // namespace

TEST(QemuGpus, OnlyCardsFactoryHostBindPutOnVfioPci) {
  TempDir dir("gpu");
  ht::HostTree t(dir);
  build_one_bound(t);
  auto cards = host_cards(host::HostRoot(t.root()));
  ASSERT_TRUE(cards.ok()) << cards.error().message;
  ASSERT_EQ(cards->size(), 2u);
  EXPECT_EQ((*cards)[0].address, "0000:01:00.0");
  EXPECT_TRUE((*cards)[0].passthrough);
  EXPECT_EQ((*cards)[0].resource, "nvidia.com/AD104GL_L4");
  EXPECT_EQ((*cards)[1].address, "0000:41:00.0");
  EXPECT_FALSE((*cards)[1].passthrough);
  EXPECT_NE((*cards)[1].why_not.find("factory host bind 0000:41:00.0"), std::string::npos);

  auto one = pick_gpus(*cards, "", 1, "tenant-1", {});
  ASSERT_TRUE(one.ok()) << one.error().message;
  EXPECT_EQ(one->resource, "nvidia.com/AD104GL_L4");
  EXPECT_EQ(one->addresses, std::vector<std::string>{"0000:01:00.0"});
  // A tenant's own card is free to it (a re-run of its create).
  EXPECT_TRUE(pick_gpus(*cards, "", 1, "tenant-1", {{"0000:01:00.0", "tenant-1"}}).ok());

  // Never two tenants on one card: the refusal says who holds it and what to do.
  auto two = pick_gpus(*cards, "", 1, "tenant-2", {{"0000:01:00.0", "tenant-1"}});
  ASSERT_FALSE(two.ok());
  EXPECT_EQ(two.error().code, Errc::failed_precondition);
  EXPECT_EQ(two.error().message,
            "no free nvidia.com/AD104GL_L4 on this host: 1 on vfio-pci, 1 in use by tenant-1 "
            "(0000:01:00.0); 0000:41:00.0 is on nvidia: `factory host bind 0000:41:00.0` puts it "
            "on vfio-pci");
  auto many = pick_gpus(*cards, "nvidia.com/AD104GL_L4", 2, "tenant-2", {});
  ASSERT_FALSE(many.ok());
  EXPECT_NE(many.error().message.find("only 1 free nvidia.com/AD104GL_L4 (want 2)"),
            std::string::npos);
  EXPECT_NE(pick_gpus(*cards, "nvidia.com/GH100_H200", 1, "t", {})
                .error()
                .message.find("no free nvidia.com/GH100_H200 on this host: 0 on vfio-pci"),
            std::string::npos);
}

TEST(QemuGpus, VfioWithoutDriverctlIsNotFactorysAndNoCardsSaySo) {
  TempDir dir("gpu");
  ht::HostTree t(dir);
  build_one_bound(t, /*with_override=*/false);
  auto cards = host_cards(host::HostRoot(t.root()));
  ASSERT_TRUE(cards.ok());
  EXPECT_FALSE((*cards)[0].passthrough);
  EXPECT_NE((*cards)[0].why_not.find("without driverctl's override"), std::string::npos);
  auto none = pick_gpus(*cards, "", 1, "t", {});
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find("no GPU on this host is on vfio-pci for tenants (want 1)"),
            std::string::npos);
  EXPECT_NE(pick_gpus({}, "", 1, "t", {}).error().message.find("the host has no NVIDIA GPU"),
            std::string::npos);
}

// ---- config ----

TEST(QemuConfig, ProviderQemuAndItsKeys) {
  TempDir dir("cfg");
  auto p = dir / "c.yaml";
  auto load = [&](const std::string& text) {
    std::ofstream(p) << text;
    return coordinator::load_coordinator_config(p.string(), true);
  };
  auto d = load("state_dir: /srv/f\n");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->provider, "kubevirt");  // the default stays
  EXPECT_EQ(d->qemu.vms_dir, "/srv/f/vms");

  auto q = load(
      "state_dir: /srv/f\nprovider: qemu\nagents:\n  listen: 127.0.0.1:9443\n"
      "qemu:\n  base_image: images/base\n  accel: tcg\n  supervisor: child\n");
  ASSERT_TRUE(q.ok()) << q.error().message;
  EXPECT_EQ(q->provider, "qemu");
  // The guest reaches the host's loopback at 10.0.2.2 (QEMU user networking).
  EXPECT_EQ(q->external_url, "wss://10.0.2.2:9443");
  EXPECT_EQ(q->qemu.base_image, (dir / "images/base").string());
  EXPECT_EQ(q->qemu.accel, "tcg");
  EXPECT_EQ(q->qemu.ssh_listen, "127.0.0.1");

  auto explicit_url = load("provider: qemu\nexternal_url: wss://192.0.2.7:8443\n");
  ASSERT_TRUE(explicit_url.ok());
  EXPECT_EQ(explicit_url->external_url, "wss://192.0.2.7:8443");

  EXPECT_NE(load("provider: docker\n").error().message.find("want kubevirt or qemu"),
            std::string::npos);
  EXPECT_NE(load("qemu:\n  acel: tcg\n").error().message.find("unknown key 'qemu.acel'"),
            std::string::npos);
  EXPECT_NE(load("qemu:\n  accel: hvf\n").error().message.find("want auto, kvm or tcg"),
            std::string::npos);
  EXPECT_NE(load("qemu:\n  supervisor: runit\n").error().message.find("auto, systemd or child"),
            std::string::npos);
  EXPECT_NE(load("qemu:\n  ssh_listen: localhost\n").error().message.find("IPv4"),
            std::string::npos);
}
