// `factory kubevirt allowlist` end to end: the real binary against the fake
// API server (tests/fakes/kube_apiserver.py, which plays kube-apiserver and
// KubeVirt's device plugins: the node advertises, per allowlisted model, the
// cards on vfio-pci in the host tree it is given), with the runbook's host
// (two L4s, tests/coordinator/host_tree.hpp) as the inventory.
#include <gtest/gtest.h>

#include "coordinator/kubevirt/allowlist.hpp"
#include "tests/coordinator/host_tree.hpp"
#include "tests/fakes/fake_kube.hpp"
#include "tests/support/test_support.hpp"

namespace factory::kube {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using namespace factory::kubevirt;
using factory::testing::FakeKube;
using factory::testing::TempDir;
using factory::testing::hosttree::HostTree;

const std::string kCard1 = "0000:01:00.0";
const std::string kCard2 = "0000:41:00.0";

// The runbook's host after step 2 (cards on vfio-pci), or partway through.
void move_to_vfio(HostTree& t, const std::string& addr) {
  t.unlink_driver(addr);
  t.add_driver("vfio-pci");
  t.link_driver(addr, "vfio-pci");
}

CommandResult allowlist(const FakeKube& kube, std::vector<std::string> args) {
  std::vector<std::string> argv{factory::testing::factory_bin(), "kubevirt", "allowlist",
                                "--kubeconfig", kube.kubeconfig()};
  argv.insert(argv.end(), args.begin(), args.end());
  return factory::testing::run(argv, 60s);
}

json kubevirt_cr(const FakeKube& kube) {
  return kube.get("/apis/kubevirt.io/v1/namespaces/kubevirt/kubevirts/kubevirt");
}

class AllowlistTest : public ::testing::Test {
 protected:
  TempDir dir_{"allowlist"};
  HostTree tree_{dir_};
  void SetUp() override { factory::testing::hosttree::build_l4_runbook(tree_); }
};

TEST_F(AllowlistTest, TwoL4sOnVfioPciAreAdvertisedAsTwo) {
  move_to_vfio(tree_, kCard1);
  move_to_vfio(tree_, kCard2);
  FakeKube kube({"--host-root", tree_.root().string()});
  ASSERT_TRUE(kube.ok()) << kube.log();

  auto r = allowlist(kube, {"--host-root", tree_.root().string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(
      r.output.find("KubeVirt kubevirt/kubevirt: allowlisted 10DE:27B8 as nvidia.com/AD104GL_L4\n"),
      std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("utho  nvidia.com/AD104GL_L4: 2\n"), std::string::npos) << r.output;

  json cr = kubevirt_cr(kube);
  EXPECT_EQ(
      cr["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"],
      json::parse(R"([{"pciVendorSelector":"10DE:27B8","resourceName":"nvidia.com/AD104GL_L4"}])"));
  // The rest of the CR is as the runbook left it.
  EXPECT_EQ(cr["spec"]["configuration"]["imagePullPolicy"], "IfNotPresent");
  EXPECT_EQ(cr["spec"]["imagePullPolicy"], "IfNotPresent");

  // Running it again changes nothing and says so.
  std::string rv = cr["metadata"]["resourceVersion"];
  auto again = allowlist(kube, {"--host-root", tree_.root().string()});
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("10DE:27B8 as nvidia.com/AD104GL_L4 already allowlisted"),
            std::string::npos)
      << again.output;
  EXPECT_NE(again.output.find("utho  nvidia.com/AD104GL_L4: 2\n"), std::string::npos);
  EXPECT_EQ(kubevirt_cr(kube)["metadata"]["resourceVersion"], rv);
}

TEST_F(AllowlistTest, LeavesEntriesItDidNotMakeAlone) {
  // Someone else's allowlist: an H200 left to NVIDIA's own device plugin, and
  // a mediated device profile.
  fs::path seed = dir_ / "cr.yaml";
  factory::testing::hosttree::write_text(seed, R"(apiVersion: kubevirt.io/v1
kind: KubeVirt
metadata:
  name: kubevirt
  namespace: kubevirt
spec:
  imagePullPolicy: IfNotPresent
  configuration:
    imagePullPolicy: IfNotPresent
    permittedHostDevices:
      pciHostDevices:
        - pciVendorSelector: "10DE:2335"
          resourceName: nvidia.com/GH100_H200_SXM_141GB
          externalResourceProvider: true
      mediatedDevices:
        - mdevNameSelector: GRID T4-1Q
          resourceName: nvidia.com/GRID_T4-1Q
)");
  FakeKube kube({"--seed", seed.string(), "--vfio-cards", "10DE:27B8=2"});
  ASSERT_TRUE(kube.ok()) << kube.log();

  auto r = allowlist(kube, {"--pci-id", "10de:27b8", "--resource-name", "nvidia.com/AD104GL_L4"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("utho  nvidia.com/AD104GL_L4: 2\n"), std::string::npos) << r.output;

  json phd = kubevirt_cr(kube)["spec"]["configuration"]["permittedHostDevices"];
  EXPECT_EQ(phd["pciHostDevices"], json::parse(R"([
    {"pciVendorSelector":"10DE:2335","resourceName":"nvidia.com/GH100_H200_SXM_141GB","externalResourceProvider":true},
    {"pciVendorSelector":"10DE:27B8","resourceName":"nvidia.com/AD104GL_L4"}])"));
  EXPECT_EQ(
      phd["mediatedDevices"],
      json::parse(R"([{"mdevNameSelector":"GRID T4-1Q","resourceName":"nvidia.com/GRID_T4-1Q"}])"));
  // The foreign H200 entry is not advertised by KubeVirt itself (external provider).
  json node = kube.get("/api/v1/nodes/utho");
  EXPECT_FALSE(node["status"]["allocatable"].contains("nvidia.com/GH100_H200_SXM_141GB"));
}

TEST_F(AllowlistTest, ACardStillOnTheHostDriverIsNamedAsTheReason) {
  move_to_vfio(tree_, kCard1);  // the second L4 stays on nvidia
  FakeKube kube({"--host-root", tree_.root().string()});
  ASSERT_TRUE(kube.ok()) << kube.log();
  auto t0 = std::chrono::steady_clock::now();
  auto r = allowlist(kube, {"--host-root", tree_.root().string(), "--wait-timeout", "30s"});
  EXPECT_NE(r.exit_code, 0) << r.output;
  // It stops waiting once what can appear has appeared.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s);
  EXPECT_NE(r.output.find("utho  nvidia.com/AD104GL_L4: 1\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("factory: nvidia.com/AD104GL_L4: 1 advertised, 2 on this host: not on "
                          "vfio-pci: 0000:41:00.0 (nvidia) (factory host bind --pci 0000:41:00.0)"),
            std::string::npos)
      << r.output;
}

TEST_F(AllowlistTest, DryRunChangesNothingButTheServerChecksIt) {
  move_to_vfio(tree_, kCard1);
  move_to_vfio(tree_, kCard2);
  FakeKube kube({"--host-root", tree_.root().string()});
  ASSERT_TRUE(kube.ok()) << kube.log();
  auto r = allowlist(kube, {"--host-root", tree_.root().string(), "--dry-run"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("would allowlist 10DE:27B8 as nvidia.com/AD104GL_L4"), std::string::npos)
      << r.output;
  EXPECT_FALSE(kubevirt_cr(kube)["spec"]["configuration"].contains("permittedHostDevices"));
  json seen = kube.control("/_fake/requests", {}, "GET");
  bool dry_patch = false;
  for (const auto& q : seen["requests"])
    if (q["method"] == "PATCH" &&
        q["path"].get<std::string>().find("dryRun=All") != std::string::npos)
      dry_patch = true;
  EXPECT_TRUE(dry_patch);
}

TEST_F(AllowlistTest, JsonOutput) {
  move_to_vfio(tree_, kCard1);
  move_to_vfio(tree_, kCard2);
  FakeKube kube({"--host-root", tree_.root().string()});
  ASSERT_TRUE(kube.ok()) << kube.log();
  auto r = allowlist(kube, {"--host-root", tree_.root().string(), "-o", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto doc = json::parse(r.output, nullptr, false);
  ASSERT_FALSE(doc.is_discarded()) << r.output;
  EXPECT_EQ(doc["nodes"],
            json::parse(R"([{"node":"utho","resource":"nvidia.com/AD104GL_L4","allocatable":2}])"));
  EXPECT_EQ(doc["advertised"], true);
  EXPECT_EQ(doc["models"][0]["name"], "AD104GL [L4]");
  EXPECT_EQ(doc["models"][0]["onVfioPci"], json::parse(R"(["0000:01:00.0","0000:41:00.0"])"));
}

TEST_F(AllowlistTest, PciIdAloneIsNamedFromPciIds) {
  FakeKube kube({"--vfio-cards", "10DE:27B8=2"});
  ASSERT_TRUE(kube.ok()) << kube.log();
  auto r = allowlist(kube, {"--pci-id", "10de:27b8", "--host-root", tree_.root().string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("utho  nvidia.com/AD104GL_L4: 2\n"), std::string::npos) << r.output;
}

TEST(AllowlistErrors, ForbiddenPatchIsOneLine) {
  FakeKube kube(
      {"--forbid", "patch:kubevirts.kubevirt.io:kubevirt", "--vfio-cards", "10DE:27B8=2"});
  ASSERT_TRUE(kube.ok()) << kube.log();
  auto r = allowlist(kube, {"--pci-id", "10de:27b8", "--resource-name", "nvidia.com/AD104GL_L4"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.output,
            "factory: forbidden: the coordinator's account cannot patch kubevirts.kubevirt.io in "
            "namespace kubevirt: grant it with RBAC (see deploy/)\n");
}

TEST(AllowlistErrors, NoKubeVirtCr) {
  FakeKube kube({"--no-kubevirt-cr"});
  ASSERT_TRUE(kube.ok()) << kube.log();
  auto r = allowlist(kube, {"--pci-id", "10de:27b8", "--resource-name", "nvidia.com/AD104GL_L4"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(
      r.output,
      "factory: no KubeVirt CR in namespace kubevirt: install KubeVirt first (runbook step 3), "
      "or pass --namespace\n");
}

TEST(AllowlistErrors, SameCardUnderAnotherNameIsRefused) {
  TempDir dir("allowlist-conflict");
  fs::path seed = dir / "cr.yaml";
  factory::testing::hosttree::write_text(seed, R"(apiVersion: kubevirt.io/v1
kind: KubeVirt
metadata: {name: kubevirt, namespace: kubevirt}
spec:
  configuration:
    permittedHostDevices:
      pciHostDevices:
        - {pciVendorSelector: "10de:27b8", resourceName: example.com/l4}
)");
  FakeKube kube({"--seed", seed.string()});
  ASSERT_TRUE(kube.ok()) << kube.log();
  auto r = allowlist(kube, {"--pci-id", "10de:27b8", "--resource-name", "nvidia.com/AD104GL_L4"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("the KubeVirt CR already allowlists 10DE:27B8 as example.com/l4, not "
                          "nvidia.com/AD104GL_L4"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(
      kubevirt_cr(kube)["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"].size(),
      1u);
}

TEST(AllowlistErrors, BadFlagsAreOneLine) {
  FakeKube kube;
  ASSERT_TRUE(kube.ok()) << kube.log();
  auto id = allowlist(kube, {"--pci-id", "10de-27b8", "--resource-name", "nvidia.com/x"});
  EXPECT_EQ(id.exit_code, 2);
  EXPECT_EQ(id.output,
            "factory: --pci-id '10de-27b8' is not VENDOR:DEVICE in hex, e.g. 10de:27b8 (lspci -nn "
            "shows it)\n");
  auto name = allowlist(kube, {"--pci-id", "10de:27b8", "--resource-name", "AD104GL L4"});
  EXPECT_EQ(name.exit_code, 2);
  EXPECT_NE(name.output.find("is not a Kubernetes resource name"), std::string::npos)
      << name.output;
  auto alone = allowlist(kube, {"--resource-name", "nvidia.com/x"});
  EXPECT_EQ(alone.output, "factory: --resource-name needs --pci-id (the card it names)\n");
}

// The pieces, without the binary.

TEST(AllowlistMerge, KeepsForeignEntriesAndOrder) {
  json current =
      json::parse(R"([{"pciVendorSelector":"10DE:2335","resourceName":"nvidia.com/H200"}])");
  auto m = model_from_flags("10de:27b8", "nvidia.com/AD104GL_L4");
  ASSERT_TRUE(m.ok());
  auto merged = merge_allowlist(current, {*m, *m});
  ASSERT_TRUE(merged.ok()) << merged.error().message;
  EXPECT_EQ(merged->entries.size(), 2u);
  EXPECT_EQ(merged->entries[0], current[0]);
  EXPECT_EQ(merged->entries[1]["pciVendorSelector"], "10DE:27B8");
  EXPECT_FALSE(merged->entries[1].contains("externalResourceProvider"));
  EXPECT_EQ(merged->added, std::vector<std::string>{"10DE:27B8 as nvidia.com/AD104GL_L4"});

  auto again = merge_allowlist(merged->entries, {*m});
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->changed());
  EXPECT_EQ(again->entries, merged->entries);
  // A lower-case selector someone else wrote still counts as the same card.
  auto lower = merge_allowlist(
      json::parse(R"([{"pciVendorSelector":"10de:27b8","resourceName":"nvidia.com/AD104GL_L4"}])"),
      {*m});
  ASSERT_TRUE(lower.ok());
  EXPECT_FALSE(lower->changed());
  EXPECT_TRUE(merge_allowlist(nullptr, {*m}).ok());
}

TEST(AllowlistWait, ReportsACrThatDoesNotListTheModel) {
  FakeKube kube({"--vfio-cards", "10DE:27B8=2"});
  ASSERT_TRUE(kube.ok()) << kube.log();
  auto a = load_kubeconfig(kube.kubeconfig());
  ASSERT_TRUE(a.ok());
  KubeClient client(*a);
  auto m = model_from_flags("10de:27b8", "nvidia.com/AD104GL_L4");
  auto report = wait_for_advertised(client, "kubevirt", {*m}, 1500ms);
  ASSERT_TRUE(report.ok()) << report.error().message;
  EXPECT_FALSE(report->satisfied);
  EXPECT_TRUE(report->nodes.empty());
  ASSERT_EQ(report->problems.size(), 1u);
  EXPECT_EQ(report->problems[0],
            "nvidia.com/AD104GL_L4: 0 advertised: the KubeVirt CR does not list 10DE:27B8 as "
            "nvidia.com/AD104GL_L4 (not applied, or reverted since)");
}

}  // namespace
}  // namespace factory::kube
