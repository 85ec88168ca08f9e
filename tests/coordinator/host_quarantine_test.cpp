// `factory host quarantine` / `release` / `gpus` on the runbook's host (two
// L4s, tests/coordinator/host_tree.hpp): the real binary, the kernel's side
// of the binding files played by KernelStandIn, driverctl by its stand-in,
// and KubeVirt's device plugin by the Kubernetes double (tests/fakes:
// allocatable down by one while a card is off vfio-pci, as the plugins'
// /dev/vfio watch makes it). The QEMU provider's placement reads the same
// tree: a quarantined card is never picked.
#include <gtest/gtest.h>

#include "common/yaml_json.hpp"
#include "coordinator/host/quarantine.hpp"
#include "coordinator/qemu/gpus.hpp"
#include "tests/coordinator/host_tree.hpp"
#include "tests/fakes/fake_kube.hpp"
#include "tests/support/test_support.hpp"

namespace factory {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using namespace factory::testing::hosttree;
using factory::testing::eventually;
using factory::testing::FakeKube;
using factory::testing::TempDir;
using nlohmann::json;

const std::string kCard1 = "0000:01:00.0";
const std::string kCard2 = "0000:41:00.0";
const std::string kResource = "nvidia.com/AD104GL_L4";

class HostQuarantine : public ::testing::Test {
 protected:
  void SetUp() override {
    build_l4_runbook(tree_);
    tree_.add_driver("vfio-pci");
    for (const char* m : {"vfio", "vfio_iommu_type1", "vfio_pci"})
      write_text(tree_ / ("/sys/module/" + std::string(m) + "/initstate"), "live\n");
    write_text(tree_ / "/etc/modules-load.d/vfio.conf", "vfio\nvfio_iommu_type1\nvfio_pci\n");
    kernel_ = std::make_unique<KernelStandIn>(tree_);
    auto b = host({"bind", "--pci", kCard1 + " " + kCard2});
    ASSERT_EQ(b.exit_code, 0) << b.output;
  }
  // No coordinator: its config names a file that is not there.
  CommandResult host(const std::vector<std::string>& args) {
    return factory_host(tree_, args,
                        {{"FACTORY_CONFIG", (dir_.path() / "no-coordinator.yaml").string()}});
  }
  std::string allocatable(const FakeKube& kube) {
    return kube.get("/api/v1/nodes/utho")["status"]["allocatable"].value(kResource, "");
  }
  std::vector<qemu::HostCard> pickable() {
    auto cards = qemu::host_cards(host::HostRoot(tree_.root()));
    EXPECT_TRUE(cards) << cards.error().message;
    std::vector<qemu::HostCard> out;
    for (const auto& c : *cards)
      if (c.passthrough) out.push_back(c);
    return out;
  }

  TempDir dir_{"host-quarantine"};
  HostTree tree_{dir_};
  std::unique_ptr<KernelStandIn> kernel_;
};

TEST_F(HostQuarantine, TakesTheCardOutOfThePoolAndReleaseReturnsIt) {
  FakeKube kube({"--host-root", tree_.root().string(), "--device-plugin-delay", "0.1"});
  ASSERT_TRUE(kube.ok()) << kube.log();
  auto allow = factory::testing::run(
      {factory::testing::factory_bin(), "kubevirt", "allowlist", "--kubeconfig", kube.kubeconfig(),
       "--host-root", tree_.root().string(), "--wait-timeout", "20s"},
      60s);
  ASSERT_EQ(allow.exit_code, 0) << allow.output;
  ASSERT_TRUE(eventually([&] { return allocatable(kube) == "2"; }, 20s)) << allocatable(kube);
  ASSERT_EQ(pickable().size(), 2u);

  // --dry-run: the record and the unbind it would make, nothing changed.
  Snapshot before = snapshot(tree_.root());
  fs::remove(tree_.log());
  auto dry = host({"quarantine", "--pci", kCard2, "--reason", "Xid 79 on tenant-1", "--dry-run"});
  ASSERT_EQ(dry.exit_code, 0) << dry.output;
  EXPECT_NE(dry.output.find("would record 0000:41:00.0 as quarantined (Xid 79 on tenant-1)"),
            std::string::npos)
      << dry.output;
  EXPECT_NE(
      dry.output.find("  echo 0000:41:00.0 > /sys/bus/pci/devices/0000:41:00.0/driver/unbind"),
      std::string::npos)
      << dry.output;
  EXPECT_EQ(snapshot_diff(before, snapshot(tree_.root())), std::vector<std::string>{});
  EXPECT_EQ(tree_.log_lines(), std::vector<std::string>{});

  // As root: recorded, off vfio-pci, so the device plugin offers one card
  // and the QEMU provider would pick only the other.
  auto q = host({"quarantine", "--pci", kCard2, "--reason", "Xid 79 on tenant-1"});
  ASSERT_EQ(q.exit_code, 0) << q.output;
  EXPECT_NE(q.output.find("0000:41:00.0 quarantined: on nvidia"), std::string::npos) << q.output;
  EXPECT_EQ(tree_.driver(kCard2), "nvidia");
  EXPECT_FALSE(fs::exists(tree_ / "/etc/driverctl.d/pci-0000:41:00.0"));
  EXPECT_EQ(fs::status(tree_ / "/var/lib/factory/gpu-cards.json").permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_TRUE(eventually([&] { return allocatable(kube) == "1"; }, 20s)) << allocatable(kube);
  auto cards = pickable();
  ASSERT_EQ(cards.size(), 1u);
  EXPECT_EQ(cards[0].address, kCard1);
  auto all = qemu::host_cards(host::HostRoot(tree_.root()));
  auto pick = qemu::pick_gpus(*all, kResource, 2, "tenant-2", {});
  ASSERT_FALSE(pick);
  EXPECT_NE(pick.error().message.find("0000:41:00.0 is quarantined since"), std::string::npos)
      << pick.error().message;

  // Idempotent: a second quarantine changes nothing.
  before = snapshot(tree_.root());
  auto again = host({"quarantine", "--pci", kCard2, "--reason", "again"});
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("0000:41:00.0: already quarantined since"), std::string::npos);
  EXPECT_NE(again.output.find("(Xid 79 on tenant-1); nothing changed"), std::string::npos)
      << again.output;
  EXPECT_EQ(snapshot_diff(before, snapshot(tree_.root())), std::vector<std::string>{});

  // What the node shows without a coordinator.
  auto gpus = host({"gpus", "-o", "json"});
  ASSERT_EQ(gpus.exit_code, 0) << gpus.output;
  auto doc = json::parse(gpus.output.substr(gpus.output.find('{')), nullptr, false);
  ASSERT_TRUE(doc.is_object()) << gpus.output;
  ASSERT_EQ(doc["gpus"].size(), 2u) << doc.dump(2);
  EXPECT_EQ(doc["gpus"][0]["pci_address"], kCard1);
  EXPECT_EQ(doc["gpus"][0]["state"], "free");
  EXPECT_EQ(doc["gpus"][0]["model"], "AD104GL [L4]");
  EXPECT_EQ(doc["gpus"][1]["state"], "quarantined");
  EXPECT_EQ(doc["gpus"][1]["reason"], "Xid 79 on tenant-1");
  EXPECT_TRUE(doc.contains("coordinator_error"));

  // Release: back on vfio-pci, offered again, picked again.
  auto rdry = host({"release", "--pci", kCard2, "--dry-run"});
  ASSERT_EQ(rdry.exit_code, 0) << rdry.output;
  EXPECT_NE(rdry.output.find("dry run: nothing was changed"), std::string::npos);
  EXPECT_EQ(tree_.driver(kCard2), "nvidia");
  auto r = host({"release", "--pci", kCard2});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("0000:41:00.0 released: on vfio-pci"), std::string::npos) << r.output;
  EXPECT_EQ(tree_.driver(kCard2), "vfio-pci");
  EXPECT_TRUE(eventually([&] { return allocatable(kube) == "2"; }, 20s)) << allocatable(kube);
  EXPECT_EQ(pickable().size(), 2u);
  auto rec = host::read_cards(host::HostRoot(tree_.root()));
  ASSERT_TRUE(rec);
  const host::CardRecord* c2 = host::find_card(*rec, kCard2);
  ASSERT_NE(c2, nullptr);
  EXPECT_FALSE(c2->quarantined);
  EXPECT_FALSE(c2->released_at.empty());
  auto r2 = host({"release", "--pci", kCard2});
  ASSERT_EQ(r2.exit_code, 0) << r2.output;
  EXPECT_NE(r2.output.find("not quarantined, and on vfio-pci for tenants; nothing changed"),
            std::string::npos)
      << r2.output;
}

TEST_F(HostQuarantine, RefusesWithOneLineAndChangesNothing) {
  Snapshot before = snapshot(tree_.root());
  fs::remove(tree_.log());
  struct Case {
    std::vector<std::string> args;
    std::string starts;
  };
  for (const auto& c : std::vector<Case>{
           {{"quarantine", "--pci", kCard2, "--reason", ""}, "factory: --reason is empty"},
           {{"quarantine", "--pci", kCard2, "--reason", "bad\x1b[2J"},
            "factory: --reason holds a control character"},
           {{"quarantine", "--pci", "0000:99:00.0", "--reason", "x"}, "factory: quarantine: "},
           {{"quarantine", "--pci", kCard1 + " " + kCard2, "--reason", "x"},
            "factory: --pci takes one card at a time here"},
           {{"--euid", "1000", "quarantine", "--pci", kCard2, "--reason", "x"}, "factory: "},
       }) {
    auto r = host(c.args);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_EQ(lines(r.output).size(), 1u) << r.output;
    EXPECT_EQ(r.output.rfind(c.starts, 0), 0u) << r.output;
  }
  EXPECT_EQ(snapshot_diff(before, snapshot(tree_.root())), std::vector<std::string>{});
  EXPECT_EQ(tree_.log_lines(), std::vector<std::string>{});
}

}  // namespace
}  // namespace factory
