// The QEMU provider with real QEMU processes (TCG). The base image is an
// empty disk, so the firmware finds nothing to boot and the machine idles:
// what is tested is the provider's part (files, process, supervision,
// finding a VM again, cards), not a guest; tests/e2e boots real guests.
#include "coordinator/qemu/qemu_provider.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "common/atomic_file.hpp"
#include "common/durations.hpp"
#include "coordinator/host/quarantine.hpp"
#include "coordinator/qemu/qmp.hpp"
#include "coordinator/qemu/supervisor.hpp"
#include "tests/coordinator/host_tree.hpp"
#include "tests/support/test_support.hpp"

using namespace factory;
using namespace factory::qemu;
using factory::testing::TempDir;
namespace fs = std::filesystem;

namespace {

// Every QEMU process whose command line names this pidfile.
int qemu_processes_for(const std::string& pidfile) {
  int n = 0;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmd = factory::testing::slurp(e.path() / "cmdline");
    std::string st = factory::testing::slurp(e.path() / "stat");
    auto close = st.rfind(')');
    if (close != std::string::npos && close + 2 < st.size() && st[close + 2] == 'Z') continue;
    for (auto& c : cmd)
      if (c == '\0') c = ' ';
    if (cmd.find(" " + pidfile + " ") != std::string::npos ||
        (cmd.size() >= pidfile.size() + 1 &&
         cmd.compare(cmd.size() - pidfile.size() - 1, pidfile.size(), pidfile) == 0))
      ++n;
  }
  return n;
}

class QemuProviderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = dir_ / "base.qcow2";
    auto r =
        factory::testing::run({"qemu-img", "create", "-q", "-f", "qcow2", base_.string(), "64M"});
    ASSERT_TRUE(r.ok()) << "qemu-img (qemu-utils) is needed: " << r.output;
    opts_.base_image = base_.string();
    opts_.vms_dir = (dir_ / "vms").string();
    opts_.accel = "tcg";
    opts_.supervisor = "child";
    opts_.monitor_every = std::chrono::milliseconds(200);
    opts_.max_backoff = std::chrono::seconds(2);
  }

  // The VMs outlive their provider by design: a test that failed half-way
  // must not leave one running.
  void TearDown() override {
    std::error_code ec;
    for (const auto& d : fs::directory_iterator(opts_.vms_dir, ec))
      if (int pid = running_qemu_pid((d.path() / "qemu.pid").string()); pid > 0)
        ::kill(pid, SIGKILL);
  }

  std::unique_ptr<QemuProvider> provider() {
    auto p = QemuProvider::create(opts_);
    if (!p) factory::testing::setup_failed("QemuProvider: " + p.error().message);
    return std::move(*p);
  }

  tenants::VmSpec spec(const std::string& name) {
    tenants::VmSpec s;
    s.name = name;
    s.cpu = "1";
    s.memory = "128Mi";
    s.disk = "1Gi";
    s.gpus = 0;
    s.tier = "test";
    return s;
  }

  std::string vm_dir(const std::string& t) { return opts_.vms_dir + "/" + t; }

  // The runbook's L4 host (AD104GL, 10de:27b8) as a captured sysfs tree in
  // `dir`, with these cards bound to vfio-pci by `factory host bind`
  // (driverctl kept), for the provider to pick from. One monitor pass, at
  // start only: records written by hand name cards that are not on this
  // machine for a monitor to start QEMU with.
  void l4_host(const TempDir& dir, const std::vector<std::string>& passthrough) {
    namespace ht = factory::testing::hosttree;
    ht::HostTree t(dir);
    t.overlay(ht::host_fixtures() / "amd-epyc-host" / "root");
    auto facts = ht::facts_file("l4-runbook");
    for (auto& f : facts.functions)
      if (std::find(passthrough.begin(), passthrough.end(), f.addr) != passthrough.end())
        f.driver = "vfio-pci";
    t.add(facts);
    for (const auto& a : passthrough)
      ht::write_text(t / ("/etc/driverctl.d/pci-" + a), "vfio-pci\n");
    opts_.host_root = t.root().string();
    opts_.monitor_every = std::chrono::hours(1);
  }

  // `tenant` holds `card`: its vm.json as provision writes it.
  void hold_card(const std::string& tenant, const std::string& card, int ssh_port) {
    VmRecord rec;
    rec.tenant = tenant;
    rec.vcpus = 1;
    rec.memory_mib = 128;
    rec.ssh_port = ssh_port;
    rec.gpus = {card};
    rec.gpu_resource = "nvidia.com/27b8";
    ASSERT_TRUE(ensure_dir(vm_dir(tenant), 0700).ok());
    ASSERT_TRUE(write_file_atomic(vm_dir(tenant) + "/vm.json", rec.to_json().dump(), 0600).ok());
  }

  TempDir dir_{"qp"};
  fs::path base_;
  QemuProviderOptions opts_;
};

mode_t mode_of(const fs::path& p) {
  struct stat st {};
  ::stat(p.c_str(), &st);
  return st.st_mode & 0777;
}

}  // namespace

TEST_F(QemuProviderTest, CreateRunsQemuOverACowDiskWithTheSeedAndDeleteLeavesNothing) {
  auto p = provider();
  auto s = spec("vm-a");
  auto pre = p->preflight(s);
  ASSERT_TRUE(pre.ok()) << pre.error().message;
  EXPECT_FALSE(*p->has_user_data(s));
  std::vector<tenants::VmObject> created;
  auto st = p->provision(s, "#cloud-config\nhostname: vm-a\n", created);
  ASSERT_TRUE(st.ok()) << st.error().message;
  ASSERT_EQ(created.size(), 3u);
  EXPECT_EQ(created[0].ref(), "CloudInitSeed/vm-a");
  EXPECT_EQ(created[1].ref(), "QemuDisk/vm-a");
  EXPECT_EQ(created[2].ref(), "QemuVm/factory-vm-vm-a");
  EXPECT_TRUE(*p->has_user_data(s));

  // The user-data holds the bootstrap token: nobody else reads it.
  const fs::path d = vm_dir("vm-a");
  EXPECT_EQ(mode_of(d), 0700u);
  for (const char* f : {"user-data", "meta-data", "seed.iso", "vm.json", "disk.qcow2"})
    EXPECT_EQ(mode_of(d / f), 0600u) << f;
  // The seed is an ISO 9660 volume labelled cidata (NoCloud's rule).
  std::string iso = factory::testing::slurp(d / "seed.iso");
  ASSERT_GT(iso.size(), 0x8028u + 6);
  EXPECT_EQ(iso.substr(0x8001, 5), "CD001");
  EXPECT_EQ(iso.substr(0x8028, 6), "cidata");
  EXPECT_NE(factory::testing::slurp(d / "meta-data").find("local-hostname: vm-a"),
            std::string::npos);
  // Copy-on-write over the base image.
  auto info = factory::testing::run(
      {"qemu-img", "info", "-U", "--output=json", (d / "disk.qcow2").string()});
  auto ij = nlohmann::json::parse(info.output, nullptr, false);
  EXPECT_EQ(ij.value("backing-filename", ""), base_.string()) << info.output;
  EXPECT_EQ(ij.value("virtual-size", 0ull), 1ull << 30);

  auto o = p->observe_qemu("vm-a");
  ASSERT_TRUE(o.ok()) << o.error().message;
  EXPECT_TRUE(o->vm.exists);
  EXPECT_EQ(o->vm.provider, "qemu");
  EXPECT_EQ(o->vm.status, "Running");
  EXPECT_EQ(o->vm.phase, "running");  // QMP's query-status
  EXPECT_EQ(o->qemu.accelerator, "tcg");
  EXPECT_EQ(o->qemu.supervisor, "child");
  EXPECT_EQ(o->qemu.ssh_host, "127.0.0.1");
  EXPECT_GT(o->vm.ssh_node_port, 0);
  ASSERT_GT(o->qemu.pid, 0);
  EXPECT_EQ(qemu_processes_for(d / "qemu.pid"), 1);
  // The SSH forward listens where the record says.
  EXPECT_NE(factory::testing::run({"ss", "-ltn"})
                .output.find("127.0.0.1:" + std::to_string(o->vm.ssh_node_port)),
            std::string::npos);
  // The seam's observation carries the same, as its details.
  auto seen = p->observe("vm-a", "tenants");
  ASSERT_TRUE(seen.ok()) << seen.error().message;
  EXPECT_EQ(seen->details, o->qemu.to_json());

  auto gone = p->destroy("vm-a", "tenants");
  ASSERT_TRUE(gone.ok()) << gone.error().message;
  std::vector<std::string> refs;
  for (const auto& x : *gone) refs.push_back(x.ref());
  EXPECT_EQ(refs, (std::vector<std::string>{"QemuVm/factory-vm-vm-a", "QemuDisk/vm-a",
                                            "CloudInitSeed/vm-a"}));
  EXPECT_FALSE(fs::exists(d));
  EXPECT_EQ(qemu_processes_for((d / "qemu.pid").string()), 0);
  EXPECT_FALSE(p->observe("vm-a", "tenants")->exists);
  // Nothing found is not an error.
  EXPECT_TRUE(p->destroy("vm-a", "tenants")->empty());
}

TEST_F(QemuProviderTest, AnEndedVmIsStartedAgainAndARestartedCoordinatorFindsItRunning) {
  const std::string pidfile = vm_dir("vm-b") + "/qemu.pid";
  int first = 0;
  {
    auto p = provider();
    auto s = spec("vm-b");
    std::vector<tenants::VmObject> created;
    auto made = p->provision(s, "#cloud-config\n", created);
    ASSERT_TRUE(made.ok()) << made.error().message;
    first = p->observe_qemu("vm-b")->qemu.pid;
    ASSERT_GT(first, 0);
    // The process ends (a crash, a guest poweroff): the monitor starts it again.
    ::kill(first, SIGKILL);
    int second = 0;
    ASSERT_TRUE(factory::testing::eventually(
        [&] {
          auto o = p->observe_qemu("vm-b");
          second = o ? o->qemu.pid : 0;
          return o && o->vm.status == "Running" && second != 0 && second != first;
        },
        std::chrono::seconds(20), std::chrono::milliseconds(200)));
    EXPECT_EQ(p->observe_qemu("vm-b")->qemu.restarts, 1);
    EXPECT_EQ(qemu_processes_for(pidfile), 1);
    first = second;
  }  // the coordinator goes away; its VM does not
  ASSERT_EQ(qemu_processes_for(pidfile), 1);

  auto p = provider();
  p->check_vms();
  auto o = p->observe_qemu("vm-b");
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->vm.status, "Running");
  EXPECT_EQ(o->qemu.pid, first);  // found again by its pidfile, not started twice
  std::this_thread::sleep_for(std::chrono::seconds(1));
  p->check_vms();
  EXPECT_EQ(qemu_processes_for(pidfile), 1);
  EXPECT_EQ(p->observe_qemu("vm-b")->qemu.pid, first);

  // Its QMP socket answers a new coordinator too.
  auto q = qmp_execute(vm_dir("vm-b") + "/qmp.sock", "query-status");
  ASSERT_TRUE(q.ok()) << q.error().message;
  EXPECT_EQ(q->value("status", ""), "running");

  // A create run again for it changes nothing and starts nothing.
  std::vector<tenants::VmObject> again;
  auto s = spec("vm-b");
  ASSERT_TRUE(p->provision(s, "", again).ok());
  EXPECT_TRUE(again.empty());
  EXPECT_EQ(p->observe_qemu("vm-b")->qemu.pid, first);

  ASSERT_TRUE(p->destroy("vm-b", "").ok());
  EXPECT_EQ(qemu_processes_for(pidfile), 0);
}

TEST_F(QemuProviderTest, AStartThatFailsSaysWhyAndRollsBack) {
  // A QEMU that cannot start the machine (an unknown option stands for a
  // card QEMU cannot open): create reports QEMU's own line.
  const fs::path fake = dir_ / "qemu-that-fails";
  ASSERT_TRUE(
      write_file_atomic(fake,
                        "#!/bin/sh\necho 'qemu-system-x86_64: -device vfio-pci,host=0000:01:00.0: "
                        "vfio 0000:01:00.0: no such host device' >&2\nexit 1\n",
                        0755)
          .ok());
  opts_.qemu_binary = fake.string();
  auto p = provider();
  auto s = spec("vm-c");
  std::vector<tenants::VmObject> created;
  auto st = p->provision(s, "#cloud-config\n", created);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("ended at once (exited 1)"), std::string::npos)
      << st.error().message;
  EXPECT_NE(st.error().message.find("no such host device"), std::string::npos);
  EXPECT_EQ(created.size(), 3u);
  EXPECT_TRUE(p->remove(created).empty());
  EXPECT_FALSE(fs::exists(vm_dir("vm-c")));
}

TEST_F(QemuProviderTest, RefusesWhatCannotWorkBeforeMakingAnything) {
  auto p = provider();
  auto s = spec("vm-d");
  s.gpus = 1;  // this machine's sysfs: no NVIDIA card bound by `factory host bind`
  auto st = p->preflight(s);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, Errc::failed_precondition);
  EXPECT_FALSE(fs::exists(vm_dir("vm-d")));

  opts_.base_image = (dir_ / "no-such-image").string();
  auto p2 = provider();
  auto s2 = spec("vm-e");
  auto st2 = p2->preflight(s2);
  ASSERT_FALSE(st2.ok());
  EXPECT_NE(st2.error().message.find("does not exist"), std::string::npos);
}

// A MIG tier on the runbook's L4 host (AD104GL, 10de:27b8): refused before
// anything is made, naming the card, as the KubeVirt provider does.
TEST_F(QemuProviderTest, AMigTierIsRefusedOnTheRunbooksL4WithTheReason) {
  TempDir hdir("gm");
  l4_host(hdir, {"0000:01:00.0"});
  auto p = provider();
  auto s = spec("vm-mig");
  s.gpus = 1;
  s.tier = "gpu-k8s-mig";
  s.needs_mig = true;
  auto st = p->preflight(s);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, Errc::failed_precondition);
  EXPECT_NE(st.error().message.find("tier gpu-k8s-mig needs a MIG-capable GPU"), std::string::npos)
      << st.error().message;
  EXPECT_NE(st.error().message.find("(10de:27b8) at 0000:01:00.0"), std::string::npos)
      << st.error().message;
  EXPECT_FALSE(fs::exists(vm_dir("vm-mig")));
  // The same card serves a tier without MIG.
  s.needs_mig = false;
  EXPECT_TRUE(p->preflight(s).ok());
}

// A model endpoint needs its port forwarded and its key kept, which this
// provider does not do yet: refused before anything is made, saying so.
TEST_F(QemuProviderTest, AModelEndpointTierIsRefusedWithTheReason) {
  auto p = provider();
  auto s = spec("vm-endpoint");
  s.tier = "model-endpoint";
  s.endpoint_port = 8443;
  auto st = p->preflight(s);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, Errc::failed_precondition);
  EXPECT_NE(st.error().message.find("QEMU provider cannot expose yet"), std::string::npos)
      << st.error().message;
  EXPECT_NE(st.error().message.find("provider: kubevirt"), std::string::npos);
  EXPECT_FALSE(fs::exists(vm_dir("vm-endpoint")));
  std::vector<tenants::VmObject> made;
  EXPECT_FALSE(p->put_api_key(s, "fmk-x", made).ok());
  EXPECT_TRUE(made.empty());
}

TEST_F(QemuProviderTest, NeverTwoTenantsOnOneCard) {
  TempDir hdir("gh");
  l4_host(hdir, {"0000:01:00.0"});
  auto p = provider();

  auto a = spec("vm-f");
  a.gpus = 1;
  ASSERT_TRUE(p->preflight(a).ok());
  EXPECT_EQ(a.gpu_resource, "nvidia.com/27b8");  // no pci.ids in this tree: the raw device ID
  // vm-f holds the card (its record, as provision writes it).
  hold_card("vm-f", "0000:01:00.0", 30500);

  auto b = spec("vm-g");
  b.gpus = 1;
  auto st = p->preflight(b);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("in use by vm-f (0000:01:00.0)"), std::string::npos)
      << st.error().message;
  EXPECT_NE(st.error().message.find("factory host bind 0000:41:00.0"), std::string::npos);
  // Its SSH port is its own too.
  auto c = spec("vm-h");
  c.ssh_node_port = 30500;
  auto port = p->preflight(c);
  ASSERT_FALSE(port.ok());
  EXPECT_NE(port.error().message.find("tenant vm-f's"), std::string::npos);
  // vm-f's own re-run keeps its card.
  auto again = spec("vm-f");
  again.gpus = 1;
  EXPECT_TRUE(p->preflight(again).ok());
  // The monitor would start vm-f; take it away before it tries a card that is not there.
  ASSERT_TRUE(p->destroy("vm-f", "").ok());
}

// `factory tenant restart` on this provider: QEMU stopped and started again
// over the same disk and seed; a restart resumed after a coordinator was
// killed half-way (its journal names the instance it replaces) never
// restarts the VM twice.
TEST_F(QemuProviderTest, ARestartStartsQemuAgainOnceEvenWhenResumed) {
  auto p = provider();
  auto s = spec("vm-r");
  std::vector<tenants::VmObject> created;
  ASSERT_TRUE(p->provision(s, "#cloud-config\n", created).ok());
  auto before = p->observe_qemu("vm-r");
  ASSERT_TRUE(before.ok());
  ASSERT_GT(before->qemu.pid, 0);
  EXPECT_EQ(before->vm.instance, "pid:" + std::to_string(before->qemu.pid));
  // When it started, by the kernel's account (what GPU usage counts from):
  // a moment ago, on the host's clock.
  auto since = parse_rfc3339(before->vm.running_since);
  ASSERT_TRUE(since.ok()) << before->vm.running_since;
  EXPECT_LE(std::chrono::abs(Clock::now() - *since), std::chrono::seconds(30));
  const std::string disk_id = factory::testing::slurp(vm_dir("vm-r") + "/meta-data");

  tenants::RestartRequest dry;
  dry.from_instance = before->vm.instance;
  dry.dry_run = true;
  auto d = p->restart(s, dry);
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_FALSE(d->restarted);
  EXPECT_EQ(d->note, "stop and start QEMU of tenant vm-r on the same cards (none)");
  EXPECT_EQ(p->observe_qemu("vm-r")->qemu.pid, before->qemu.pid) << "a dry run touches nothing";

  tenants::RestartRequest req;
  req.from_instance = before->vm.instance;
  auto r = p->restart(s, req);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->restarted);
  auto after = p->observe_qemu("vm-r");
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->vm.status, "Running");
  EXPECT_NE(after->qemu.pid, before->qemu.pid);
  EXPECT_EQ(qemu_processes_for(vm_dir("vm-r") + "/qemu.pid"), 1);
  EXPECT_EQ(factory::testing::slurp(vm_dir("vm-r") + "/meta-data"), disk_id)
      << "the same guest: its instance-id is kept";
  EXPECT_TRUE(fs::exists(vm_dir("vm-r") + "/disk.qcow2"));

  // The same journal again (the coordinator died before it recorded the
  // end): the instance it named is gone, so nothing is done twice.
  auto again = p->restart(s, req);
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_FALSE(again->restarted);
  EXPECT_NE(again->note.find("restarted already"), std::string::npos) << again->note;
  EXPECT_EQ(p->observe_qemu("vm-r")->qemu.pid, after->qemu.pid);

  // A tenant with no VM here is told how to get one.
  auto none = p->restart(spec("vm-none"), req);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find("has no VM on this host"), std::string::npos);
  ASSERT_TRUE(p->destroy("vm-r", "").ok());
}

// The cards a restart takes: those the VM holds while they are good; a card
// with a fault recorded (avoid_gpus) or quarantined is left for a free one,
// and with none free the VM stays where it is, told why. Dry runs: the
// cards in this captured tree are not on this machine for QEMU to open.
TEST_F(QemuProviderTest, ARestartLeavesAFaultedOrQuarantinedCardForAFreeOne) {
  TempDir hdir("gr");
  l4_host(hdir, {"0000:01:00.0", "0000:41:00.0"});
  auto p = provider();
  hold_card("vm-f", "0000:01:00.0", 30500);
  auto s = spec("vm-f");
  s.gpus = 1;
  tenants::RestartRequest req;
  req.dry_run = true;

  // Nothing wrong with its card: it keeps it.
  auto same = p->restart(s, req);
  ASSERT_TRUE(same.ok()) << same.error().message;
  EXPECT_EQ(same->gpus_after, std::vector<std::string>{"0000:01:00.0"});
  EXPECT_NE(same->note.find("on the same cards (0000:01:00.0)"), std::string::npos) << same->note;

  // A fault recorded on it: the free card.
  req.avoid_gpus = {"0000:01:00.0"};
  auto moved = p->restart(s, req);
  ASSERT_TRUE(moved.ok()) << moved.error().message;
  EXPECT_EQ(moved->gpus_before, std::vector<std::string>{"0000:01:00.0"});
  EXPECT_EQ(moved->gpus_after, std::vector<std::string>{"0000:41:00.0"});
  EXPECT_NE(moved->note.find("moving from 0000:01:00.0 to 0000:41:00.0"), std::string::npos)
      << moved->note;

  // Quarantined by the admin, no fault passed along: the free card too.
  req.avoid_gpus.clear();
  std::vector<host::CardRecord> cards(1);
  cards[0].address = "0000:01:00.0";
  cards[0].quarantined = true;
  cards[0].reason = "Xid 79";
  cards[0].quarantined_at = "2026-12-03T18:00:00Z";
  ASSERT_TRUE(host::write_cards(host::HostRoot(opts_.host_root), cards).ok());
  auto off = p->restart(s, req);
  ASSERT_TRUE(off.ok()) << off.error().message;
  EXPECT_EQ(off->gpus_after, std::vector<std::string>{"0000:41:00.0"});

  // The other card taken by another tenant: no move, and why.
  hold_card("vm-g", "0000:41:00.0", 30501);
  auto stuck = p->restart(s, req);
  ASSERT_FALSE(stuck.ok());
  EXPECT_NE(stuck.error().message.find("no healthy card for tenant vm-f to move to"),
            std::string::npos)
      << stuck.error().message;
  EXPECT_NE(stuck.error().message.find("in use by vm-g (0000:41:00.0)"), std::string::npos)
      << stuck.error().message;
  // Dry runs changed nothing.
  auto rec = nlohmann::json::parse(factory::testing::slurp(vm_dir("vm-f") + "/vm.json"));
  EXPECT_EQ(rec["gpus"], nlohmann::json::array({"0000:01:00.0"}));
  ASSERT_TRUE(p->destroy("vm-f", "").ok());
  ASSERT_TRUE(p->destroy("vm-g", "").ok());
}

// A host drain on a QEMU host (issue 27): the VM is asked to shut down
// through the ACPI power button and, when nothing in it answers (this
// firmware idles with no OS), ended only once its grace has passed; the
// monitor leaves it off; a start brings the same disk back. The cordon
// refuses new VMs on the host until it is lifted. A guest OS that does shut
// down is tests/e2e's (the real guest).
TEST_F(QemuProviderTest, ADrainShutsTheVmDownAfterItsGraceKeepsItOffAndAStartBringsItBack) {
  opts_.shutdown_grace = std::chrono::milliseconds(1500);
  auto p = provider();
  auto s = spec("vm-d");
  std::vector<tenants::VmObject> created;
  ASSERT_TRUE(p->provision(s, "#cloud-config\n", created).ok());
  const int pid = p->observe_qemu("vm-d")->qemu.pid;
  ASSERT_GT(pid, 0);
  const std::string node = p->observe("vm-d", "")->node;

  auto mob = p->mobility(s);
  ASSERT_TRUE(mob.ok());
  EXPECT_FALSE(mob->can_move);
  EXPECT_NE(mob->why_not.find("no other node"), std::string::npos) << mob->why_not;

  ASSERT_TRUE(p->set_node_schedulable(node, false).ok());
  auto fresh = spec("vm-new");
  auto refused = p->preflight(fresh);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("undrain"), std::string::npos) << refused.error().message;
  EXPECT_FALSE(p->set_node_schedulable("some-other-node", false).ok());

  const auto t0 = std::chrono::steady_clock::now();
  auto stopped = p->stop(s);
  const auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_TRUE(stopped.ok()) << stopped.error().message;
  EXPECT_TRUE(stopped->stopped);
  EXPECT_NE(stopped->note.find("did not shut down within"), std::string::npos) << stopped->note;
  EXPECT_GE(took, std::chrono::milliseconds(1500)) << "ended before its grace";
  EXPECT_EQ(qemu_processes_for(vm_dir("vm-d") + "/qemu.pid"), 0);
  EXPECT_TRUE(p->observe("vm-d", "")->instance.empty());
  // The monitor does not start a drained VM again.
  p->check_vms();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  p->check_vms();
  EXPECT_EQ(qemu_processes_for(vm_dir("vm-d") + "/qemu.pid"), 0);
  auto again = p->stop(s);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->stopped) << "stopping a stopped VM is nothing";

  ASSERT_TRUE(p->start(s).ok());
  EXPECT_EQ(qemu_processes_for(vm_dir("vm-d") + "/qemu.pid"), 1);
  EXPECT_FALSE(p->observe("vm-d", "")->instance.empty());
  EXPECT_TRUE(fs::exists(vm_dir("vm-d") + "/disk.qcow2")) << "the same disk";
  ASSERT_TRUE(p->start(s).ok()) << "starting a running VM is nothing";
  EXPECT_EQ(qemu_processes_for(vm_dir("vm-d") + "/qemu.pid"), 1);

  ASSERT_TRUE(p->set_node_schedulable(node, true).ok());
  ASSERT_TRUE(p->destroy("vm-d", "").ok());
}
