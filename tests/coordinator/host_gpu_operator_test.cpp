// `factory host bind --via gpu-operator` and the allowlist after it, end to
// end: the real binary against the Kubernetes double playing the GPU
// Operator (tests/fakes/gpu_operator.py: the ClusterPolicy, the node
// labelling, vfio-manager binding the GPUs of the host tree, the sandbox
// validator, the kubevirt-gpu-device-plugin advertising them), on the
// runbook's host (two L4s, tests/coordinator/host_tree.hpp).
#include <gtest/gtest.h>

#include "common/yaml_json.hpp"
#include "tests/coordinator/host_tree.hpp"
#include "tests/fakes/fake_kube.hpp"
#include "tests/support/test_support.hpp"

namespace factory {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using factory::testing::FakeKube;
using factory::testing::TempDir;
using factory::testing::hosttree::HostTree;
using nlohmann::json;

const std::string kCard1 = "0000:01:00.0";
const std::string kCard2 = "0000:41:00.0";
const std::string kNodePath = "/api/v1/nodes/utho";
const std::string kLabel = "nvidia.com/gpu.workload.config";

class GpuOperatorBindTest : public ::testing::Test {
 protected:
  TempDir dir_{"gpuop-bind"};
  HostTree tree_{dir_};
  void SetUp() override { factory::testing::hosttree::build_l4_runbook(tree_); }

  // The runbook host before any NVIDIA driver: what the operator's
  // vfio-manager accepts (it refuses a host that loads the driver).
  void without_nvidia_driver() {
    for (const auto& a : {kCard1, kCard2}) tree_.unlink_driver(a);
    fs::remove_all(tree_ / "/sys/module/nvidia");
    fs::remove_all(tree_ / "/proc/driver/nvidia");
  }

  std::vector<std::string> operator_args(std::vector<std::string> more = {}) {
    std::vector<std::string> a{"--host-root", tree_.root().string(), "--gpu-operator",
                               "sandbox",     "--operator-delay",    "0.2"};
    a.insert(a.end(), more.begin(), more.end());
    return a;
  }

  CommandResult bind(const FakeKube& kube, std::vector<std::string> args) {
    std::vector<std::string> argv{factory::testing::factory_bin(),
                                  "host",
                                  "--host-root",
                                  tree_.root().string(),
                                  "bind",
                                  "--via",
                                  "gpu-operator",
                                  "--node",
                                  "utho",
                                  "--kubeconfig",
                                  kube.kubeconfig(),
                                  "--poll-ms",
                                  "100",
                                  "--wait-timeout",
                                  "30s"};
    argv.insert(argv.end(), args.begin(), args.end());
    return factory::testing::run(argv, 60s);
  }

  CommandResult allowlist(const FakeKube& kube, std::vector<std::string> args = {},
                          const std::string& wait = "10s") {
    std::vector<std::string> argv{factory::testing::factory_bin(),
                                  "kubevirt",
                                  "allowlist",
                                  "--kubeconfig",
                                  kube.kubeconfig(),
                                  "--host-root",
                                  tree_.root().string(),
                                  "--wait-timeout",
                                  wait};
    argv.insert(argv.end(), args.begin(), args.end());
    return factory::testing::run(argv, 60s);
  }

  static json labels(const FakeKube& kube) {
    return kube.get(kNodePath)["metadata"].value("labels", json::object());
  }
};

TEST_F(GpuOperatorBindTest, DryRunYamlShowsTheNodeLabelAndChangesNothing) {
  without_nvidia_driver();
  FakeKube kube(operator_args());
  auto r = bind(kube, {"--dry-run", "-o", "yaml"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The plain sentence goes to stderr, the document alone to stdout: split them.
  const std::string sentence =
      "this mode takes every GPU of node utho: the GPU Operator's vfio-manager binds all 2 NVIDIA "
      "GPUs to vfio-pci, per node, not per card: 0000:01:00.0 (10de:27b8 AD104GL [L4]), "
      "0000:41:00.0 (10de:27b8 AD104GL [L4])\n";
  auto at = r.output.find(sentence);
  ASSERT_NE(at, std::string::npos) << r.output;
  std::string yaml = r.output;
  yaml.erase(at, sentence.size());
  auto doc = parse_yaml(yaml, "output");
  ASSERT_TRUE(doc) << doc.error().message << "\n" << r.output;
  EXPECT_EQ((*doc)["change"], json::parse(R"({"apiVersion":"v1","kind":"Node","metadata":{
      "name":"utho","labels":{"nvidia.com/gpu.workload.config":"vm-passthrough"}}})"));
  EXPECT_EQ((*doc)["dryRun"], true);
  EXPECT_EQ((*doc)["takesEveryGpu"], true);
  EXPECT_EQ((*doc)["clusterPolicy"]["name"], "cluster-policy");
  EXPECT_EQ((*doc)["clusterPolicy"]["sandboxWorkloads"]["enabled"], true);
  ASSERT_EQ((*doc)["gpus"].size(), 2u);
  EXPECT_EQ((*doc)["gpus"][1]["address"], kCard2);
  EXPECT_EQ((*doc)["gpus"][1]["resourceName"], "nvidia.com/AD104GL_L4");

  // The server checked the patch and stored nothing; the operator did nothing.
  EXPECT_FALSE(labels(kube).contains(kLabel)) << labels(kube).dump();
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(tree_.driver(kCard1), "");
  bool dry = false;
  json seen = kube.control("/_fake/requests", {}, "GET");
  for (const auto& q : seen["requests"])
    dry |= q["method"] == "PATCH" &&
           q["path"].get<std::string>().find("/api/v1/nodes/utho?") == 0 &&
           q["path"].get<std::string>().find("dryRun=All") != std::string::npos;
  EXPECT_TRUE(dry) << seen.dump();
}

TEST_F(GpuOperatorBindTest, BindLabelsTheNodeWaitsAndAllowlistMarksTheEntryExternal) {
  without_nvidia_driver();
  FakeKube kube(operator_args());
  auto r = bind(kube, {});
  ASSERT_EQ(r.exit_code, 0) << r.output << kube.log();
  EXPECT_NE(r.output.find("this mode takes every GPU of node utho"), std::string::npos);
  EXPECT_NE(r.output.find("labelled node utho nvidia.com/gpu.workload.config=vm-passthrough\n"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("waiting: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("utho  nvidia.com/AD104GL_L4: 2 (advertised by the GPU Operator's "
                          "device plugin)\n"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(labels(kube).value(kLabel, ""), "vm-passthrough");
  // The operator's vfio-manager bound both cards in the host's sysfs.
  EXPECT_EQ(tree_.driver(kCard1), "vfio-pci");
  EXPECT_EQ(tree_.driver(kCard2), "vfio-pci");

  // Running it again changes nothing and finds the node handed over.
  auto again = bind(kube, {});
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("node utho is already labelled"), std::string::npos);

  // The allowlist sees the label: the entry is left to the operator's plugin.
  auto a = allowlist(kube);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_NE(a.output.find("allowlisted 10DE:27B8 as nvidia.com/AD104GL_L4 "
                          "(externalResourceProvider: true)\n"),
            std::string::npos)
      << a.output;
  EXPECT_NE(a.output.find("utho  nvidia.com/AD104GL_L4: 2\n"), std::string::npos) << a.output;
  json cr = kube.get("/apis/kubevirt.io/v1/namespaces/kubevirt/kubevirts/kubevirt");
  EXPECT_EQ(cr["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"],
            json::parse(R"([{"pciVendorSelector":"10DE:27B8","resourceName":"nvidia.com/AD104GL_L4",
                             "externalResourceProvider":true}])"));
}

TEST_F(GpuOperatorBindTest, AnEntryVirtHandlerAdvertisedIsHandedToTheOperatorsPlugin) {
  without_nvidia_driver();
  FakeKube kube(operator_args());
  auto before = allowlist(kube, {"--via", "driverctl"}, "1s");
  ASSERT_NE(before.output.find("allowlisted 10DE:27B8 as nvidia.com/AD104GL_L4\n"),
            std::string::npos)
      << before.output;
  ASSERT_EQ(bind(kube, {}).exit_code, 0);
  auto a = allowlist(kube);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_NE(a.output.find("marked 10DE:27B8 as nvidia.com/AD104GL_L4 (externalResourceProvider: "
                          "true)\n"),
            std::string::npos)
      << a.output;
  json cr = kube.get("/apis/kubevirt.io/v1/namespaces/kubevirt/kubevirts/kubevirt");
  EXPECT_EQ(cr["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"][0]
              ["externalResourceProvider"],
            true);
}

TEST_F(GpuOperatorBindTest, HostThatLoadsTheNvidiaDriverIsRefusedBeforeTheLabel) {
  FakeKube kube(operator_args());  // the runbook host as it is: both L4s on nvidia
  auto r = bind(kube, {});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("factory: the GPU Operator's vfio-manager skips node utho: its host "
                          "loads the NVIDIA driver (0000:01:00.0, 0000:41:00.0 on nvidia)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("factory host bind --pci ADDRESS"), std::string::npos);
  EXPECT_FALSE(labels(kube).contains(kLabel));
}

TEST_F(GpuOperatorBindTest, AGpuInUseByTheHostIsRefused) {
  tree_.add_process(4242, "ollama", {"/dev/nvidiactl", "/dev/nvidia0"});
  FakeKube kube(operator_args());
  auto r = bind(kube, {"--dry-run"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("factory: 0000:01:00.0 is in use by the host: ollama (pid 4242) holds "
                          "/dev/nvidia0 open: bind --via gpu-operator refuses"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(labels(kube).contains(kLabel));
}

TEST_F(GpuOperatorBindTest, VfioManagerSkippingTheNodeIsDiagnosed) {
  // This host's check passed, but the node's host loads the driver as the
  // operator sees it (loaded after the check, say): k8s-driver-manager refuses.
  without_nvidia_driver();
  FakeKube kube(operator_args({"--host-nvidia-driver"}));
  auto r = bind(kube, {});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("labelled node utho"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("factory: the GPU Operator's vfio-manager skips node utho: its host "
                          "loads the NVIDIA driver, so k8s-driver-manager labels it "
                          "nvidia.com/gpu.deploy.driver=pre-installed and exits without binding "
                          "any GPU to vfio-pci (nvidia-vfio-manager-"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(tree_.driver(kCard1), "");
}

TEST_F(GpuOperatorBindTest, ValidatorCrashLoopIsDiagnosed) {
  without_nvidia_driver();
  FakeKube kube(operator_args({"--vfio-bind-fails", kCard2}));
  auto r = bind(kube, {});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("factory: the GPU Operator's sandbox validator on utho is crash-looping "
                          "in vfio-pci-validation (nvidia-sandbox-validator-"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("device not bound to 'vfio-pci'; device: 0000:41:00.0 driver: ''"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("--previous"), std::string::npos) << r.output;
}

TEST_F(GpuOperatorBindTest, SandboxWorkloadsOffIsRefusedAndTheLabelAloneDiagnosed) {
  without_nvidia_driver();
  FakeKube kube({"--host-root", tree_.root().string(), "--gpu-operator", "container"});
  auto r = bind(kube, {});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("factory: ClusterPolicy cluster-policy has sandboxWorkloads.enabled "
                          "off"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(labels(kube).contains(kLabel));

  // Someone labelled the node by hand: the operator ignores it, and says nothing.
  kube.merge_patch(kNodePath, {{"metadata", {{"labels", {{kLabel, "vm-passthrough"}}}}}});
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(labels(kube).value("nvidia.com/gpu.deploy.device-plugin", ""), "true")
      << labels(kube).dump();
  auto again = bind(kube, {});
  EXPECT_EQ(again.exit_code, 1) << again.output;
  EXPECT_NE(again.output.find("factory: node utho is labelled "
                              "nvidia.com/gpu.workload.config=vm-passthrough but ClusterPolicy "
                              "cluster-policy has sandboxWorkloads.enabled off, so the operator "
                              "ignores the label"),
            std::string::npos)
      << again.output;
  EXPECT_NE(again.output.find("kubectl patch clusterpolicy cluster-policy --type merge"),
            std::string::npos);
}

TEST_F(GpuOperatorBindTest, ResourceNameMismatchIsDiagnosedByBindAndAllowlist) {
  without_nvidia_driver();
  // The plugin's image has a pci.ids that lacks the L4: it advertises the raw ID.
  const fs::path old_ids = dir_ / "plugin-pci.ids";
  factory::testing::hosttree::write_text(old_ids,
                                         "10de  NVIDIA Corporation\n\t1eb8  TU104GL [Tesla T4]\n");
  FakeKube kube(operator_args({"--plugin-pci-ids", old_ids.string()}));
  auto r = bind(kube, {});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("factory: this host's pci.ids names 10DE:27B8 nvidia.com/AD104GL_L4, "
                          "but node utho advertises nvidia.com/27b8 (2)"),
            std::string::npos)
      << r.output;
  auto a = allowlist(kube, {}, "2s");
  EXPECT_EQ(a.exit_code, 1) << a.output;
  EXPECT_NE(a.output.find("the KubeVirt CR lists 10DE:27B8 as nvidia.com/AD104GL_L4, but node "
                          "utho advertises nvidia.com/27b8 (2)"),
            std::string::npos)
      << a.output;
  EXPECT_NE(a.output.find("--resource-name nvidia.com/27b8"), std::string::npos) << a.output;
}

}  // namespace
}  // namespace factory
