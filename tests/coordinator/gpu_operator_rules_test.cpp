// The GPU Operator hand-over's rules (coordinator/host/gpu_operator.hpp), on
// host trees and on objects shaped as the operator and kubelet write them
// (the pod statuses and log lines of tests/fakes/gpu_operator.py, which
// quotes the real components). Links only the host module.
#include <gtest/gtest.h>

#include "coordinator/host/gpu_operator.hpp"
#include "tests/coordinator/host_tree.hpp"
#include "tests/support/test_support.hpp"

namespace factory::host::gpu_operator {
namespace {

using factory::testing::TempDir;
using factory::testing::hosttree::HostTree;
namespace fs = std::filesystem;

// The runbook's host before any NVIDIA driver was installed: the L4s on no
// driver, no nvidia module.
void without_nvidia_driver(HostTree& t) {
  for (const char* a : {"0000:01:00.0", "0000:41:00.0"}) t.unlink_driver(a);
  fs::remove_all(t / "/sys/module/nvidia");
  fs::remove_all(t / "/proc/driver/nvidia");
}

PciIds ids() {
  auto p = PciIds::load(
      factory::testing::hosttree::host_fixtures() / "pci.ids-debian12-2023.04.10-nvidia",
      "pci.ids");
  if (!p) factory::testing::setup_failed(p.error().message);
  return *p;
}

TEST(GpuOperatorHost, FreshHostHandsOverBothL4s) {
  TempDir dir("gpuop-rules");
  HostTree t(dir);
  factory::testing::hosttree::build_l4_runbook(t);
  without_nvidia_driver(t);
  auto i = ids();
  auto h = read_host(HostRoot(t.root()), &i);
  ASSERT_TRUE(h) << h.error().message;
  ASSERT_EQ(h->gpus.size(), 2u);
  EXPECT_EQ(h->gpus[0].address.str(), "0000:01:00.0");
  EXPECT_EQ(h->gpus[0].id, "10de:27b8");
  EXPECT_EQ(h->gpus[0].name, "AD104GL [L4]");
  EXPECT_EQ(h->gpus[1].resource.name, "nvidia.com/AD104GL_L4");
  EXPECT_TRUE(h->in_use.empty());
  EXPECT_FALSE(h->host_driver);
}

TEST(GpuOperatorHost, HostThatLoadsTheNvidiaDriverIsNamed) {
  TempDir dir("gpuop-rules");
  HostTree t(dir);
  factory::testing::hosttree::build_l4_runbook(t);  // both L4s on nvidia, module loaded
  auto i = ids();
  auto h = read_host(HostRoot(t.root()), &i);
  ASSERT_TRUE(h) << h.error().message;
  EXPECT_TRUE(h->in_use.empty());
  ASSERT_TRUE(h->host_driver);
  EXPECT_EQ(h->host_driver->name, "host-driver-loaded");
  EXPECT_NE(h->host_driver->reason.find("0000:01:00.0, 0000:41:00.0 on nvidia"), std::string::npos)
      << h->host_driver->reason;
  EXPECT_NE(h->host_driver->fix.find("factory host bind --pci"), std::string::npos);
}

TEST(GpuOperatorHost, AGpuAProcessHoldsIsInUse) {
  TempDir dir("gpuop-rules");
  HostTree t(dir);
  factory::testing::hosttree::build_l4_runbook(t);
  t.add_process(4242, "ollama", {"/dev/nvidiactl", "/dev/nvidia1"});
  auto h = read_host(HostRoot(t.root()), nullptr);
  ASSERT_TRUE(h) << h.error().message;
  ASSERT_EQ(h->in_use.size(), 1u);
  EXPECT_EQ(h->in_use[0],
            "0000:41:00.0 is in use by the host: ollama (pid 4242) holds /dev/nvidia1 open");
}

TEST(GpuOperatorHost, NodeNameFromTheHost) {
  TempDir dir("gpuop-rules");
  HostTree t(dir);
  EXPECT_FALSE(host_node_name(HostRoot(t.root())));
  factory::testing::hosttree::write_text(t / "/proc/sys/kernel/hostname", "utho\n");
  EXPECT_EQ(host_node_name(HostRoot(t.root())).value_or(""), "utho");
}

json policy_list(bool sandbox) {
  return {{"items",
           {{{"metadata", {{"name", "cluster-policy"}}},
             {"spec",
              {{"sandboxWorkloads",
                {{"enabled", sandbox}, {"defaultWorkload", "container"}, {"mode", "kubevirt"}}},
               {"vfioManager", {{"enabled", true}}}}}}}}};
}

json node(bool labelled, bool preinstalled = false) {
  json labels = {{"kubernetes.io/hostname", "utho"}, {"nvidia.com/gpu.present", "true"}};
  if (labelled) labels["nvidia.com/gpu.workload.config"] = "vm-passthrough";
  if (preinstalled) labels["nvidia.com/gpu.deploy.driver"] = "pre-installed";
  return {{"metadata", {{"name", "utho"}, {"labels", labels}}},
          {"status",
           {{"allocatable",
             {{"cpu", "64"}, {"nvidia.com/gpu", "0"}, {"nvidia.com/GH100_H200_SXM_141GB", "1"}}}}}};
}

json crashing(const std::string& name, int restarts) {
  return {{"name", name},
          {"restartCount", restarts},
          {"state", {{"waiting", {{"reason", "CrashLoopBackOff"}}}}},
          {"lastState", {{"terminated", {{"exitCode", 1}, {"reason", "Error"}}}}}};
}

json done(const std::string& name) {
  return {{"name", name}, {"restartCount", 0}, {"state", {{"terminated", {{"exitCode", 0}}}}}};
}

json pod(const std::string& name, json labels, json inits, json mains, bool ready) {
  return {{"metadata", {{"name", name}, {"namespace", "gpu-operator"}, {"labels", labels}}},
          {"status",
           {{"phase", ready ? "Running" : "Pending"},
            {"conditions", {{{"type", "Ready"}, {"status", ready ? "True" : "False"}}}},
            {"initContainerStatuses", inits},
            {"containerStatuses", mains}}}};
}

TEST(GpuOperatorCluster, PolicyMustRunSandboxWorkloads) {
  EXPECT_FALSE(policy_problem(read_policy(policy_list(true)), "utho", false));
  auto off = policy_problem(read_policy(policy_list(false)), "utho", false);
  ASSERT_TRUE(off);
  EXPECT_EQ(off->name, "sandbox-workloads-off");
  EXPECT_NE(off->fix.find("kubectl patch clusterpolicy cluster-policy --type merge -p "
                          "'{\"spec\":{\"sandboxWorkloads\":{\"enabled\":true}}}'"),
            std::string::npos);
  auto none = policy_problem(read_policy(json{{"items", json::array()}}), "utho", false);
  ASSERT_TRUE(none);
  EXPECT_EQ(none->name, "no-cluster-policy");
}

TEST(GpuOperatorCluster, LabelWithSandboxOffIsTheDiagnosis) {
  Observation o{read_policy(policy_list(false)), node(true), {}, {}};
  auto d = diagnose(o, "utho");
  ASSERT_TRUE(d);
  EXPECT_EQ(d->name, "sandbox-workloads-off");
  EXPECT_EQ(d->reason,
            "node utho is labelled nvidia.com/gpu.workload.config=vm-passthrough but "
            "ClusterPolicy cluster-policy has sandboxWorkloads.enabled off, so the operator "
            "ignores the label and keeps the node's GPUs on containers");
}

TEST(GpuOperatorCluster, DriverManagerRefusingThePreinstalledDriverIsNamed) {
  json pods = {{"items",
                {pod("nvidia-vfio-manager-8xk2p", {{"name", "nvidia-vfio-manager"}},
                     {crashing("k8s-driver-manager", 2)},
                     {{{"name", "nvidia-vfio-manager"},
                       {"state", {{"waiting", {{"reason", "PodInitializing"}}}}}}},
                     false),
                 pod("nvidia-sandbox-validator-q7wzd", {{"app", "nvidia-sandbox-validator"}},
                     {done("cc-manager-validation"), crashing("vfio-pci-validation", 4)},
                     json::array(), false)}}};
  Observation o{read_policy(policy_list(true)), node(true), read_operand_pods(pods), {}};
  ASSERT_EQ(o.pods.size(), 2u);
  EXPECT_EQ(o.pods[0].state, "Init:CrashLoopBackOff");
  o.logs["nvidia-vfio-manager-8xk2p/k8s-driver-manager"] =
      "time=\"x\" level=info msg=\"NVIDIA GPU driver is already pre-installed on the node, "
      "disabling the containerized driver\"\n"
      "time=\"x\" level=fatal msg=\"failed to uninstall driver: driver is pre-installed on "
      "host\"\n";
  auto d = diagnose(o, "utho");
  ASSERT_TRUE(d);
  // The validator crash-loops too, but because of this: the cause is named.
  EXPECT_EQ(d->name, "host-driver-loaded");
  EXPECT_NE(d->reason.find("vfio-manager skips node utho: its host loads the NVIDIA driver"),
            std::string::npos)
      << d->reason;
  EXPECT_NE(d->reason.find("(nvidia-vfio-manager-8xk2p: Init:CrashLoopBackOff, 2 restarts)"),
            std::string::npos)
      << d->reason;

  // The node label alone says it too (the log may be gone).
  o.logs.clear();
  o.node = node(true, true);
  ASSERT_TRUE(diagnose(o, "utho"));
  EXPECT_EQ(diagnose(o, "utho")->name, "host-driver-loaded");
}

TEST(GpuOperatorCluster, ValidatorCrashLoopSaysWhichDeviceAndWhatToRead) {
  json pods = {
      {"items",
       {pod("nvidia-vfio-manager-8xk2p", {{"name", "nvidia-vfio-manager"}},
            {done("k8s-driver-manager")},
            {{{"name", "nvidia-vfio-manager"}, {"state", {{"running", json::object()}}}}}, true),
        pod("nvidia-sandbox-validator-q7wzd", {{"app", "nvidia-sandbox-validator"}},
            {done("cc-manager-validation"), crashing("vfio-pci-validation", 3)}, json::array(),
            false)}}};
  Observation o{read_policy(policy_list(true)), node(true), read_operand_pods(pods), {}};
  o.logs["nvidia-sandbox-validator-q7wzd/vfio-pci-validation"] =
      "time=\"x\" level=fatal msg=\"error validating vfio-pci driver installation: device not "
      "bound to 'vfio-pci'; device: 0000:41:00.0 driver: 'nvidia'\"\n";
  auto d = diagnose(o, "utho");
  ASSERT_TRUE(d);
  EXPECT_EQ(d->name, "sandbox-validator-crashloop");
  EXPECT_EQ(d->reason,
            "the GPU Operator's sandbox validator on utho is crash-looping in "
            "vfio-pci-validation (nvidia-sandbox-validator-q7wzd, 3 restarts, last exit 1): "
            "error validating vfio-pci driver installation: device not bound to 'vfio-pci'; "
            "device: 0000:41:00.0 driver: 'nvidia'");
  EXPECT_NE(d->fix.find("kubectl -n gpu-operator logs nvidia-sandbox-validator-q7wzd -c "
                        "vfio-pci-validation --previous"),
            std::string::npos)
      << d->fix;
}

TEST(GpuOperatorCluster, AllReadyIsNoDiagnosis) {
  json pods = {
      {"items",
       {pod("nvidia-sandbox-validator-q7wzd", {{"app", "nvidia-sandbox-validator"}},
            {done("cc-manager-validation"), done("vfio-pci-validation")},
            {{{"name", "nvidia-sandbox-validator"}, {"state", {{"running", json::object()}}}}},
            true)}}};
  Observation o{read_policy(policy_list(true)), node(true), read_operand_pods(pods), {}};
  EXPECT_FALSE(diagnose(o, "utho"));
  EXPECT_EQ(o.pods[0].state, "Running");
  EXPECT_TRUE(o.pods[0].ready);
}

TEST(GpuOperatorCluster, AdvertisedLeavesOutTheContainerPluginAndZeros) {
  auto a = advertised(node(true));
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a.at("nvidia.com/GH100_H200_SXM_141GB"), 1);
}

TEST(GpuOperatorCluster, ResourceNameMismatch) {
  auto a = advertised(node(true));
  EXPECT_FALSE(resource_name_mismatch("utho", "10DE:2335", "nvidia.com/GH100_H200_SXM_141GB", a));
  auto d = resource_name_mismatch("utho", "10DE:2335", "nvidia.com/2335", a, "the KubeVirt CR");
  ASSERT_TRUE(d);
  EXPECT_EQ(d->name, "resource-name-mismatch");
  EXPECT_EQ(d->reason,
            "the KubeVirt CR lists 10DE:2335 as nvidia.com/2335, but node utho advertises "
            "nvidia.com/GH100_H200_SXM_141GB (1): the operator's kubevirt-gpu-device-plugin "
            "names cards from the pci.ids in its image, not the host's");
  EXPECT_NE(d->fix.find("factory kubevirt allowlist --pci-id 10DE:2335 --resource-name "
                        "nvidia.com/GH100_H200_SXM_141GB"),
            std::string::npos);
  EXPECT_FALSE(resource_name_mismatch("utho", "10DE:2335", "nvidia.com/2335", {}));
}

TEST(GpuOperatorCluster, LastLogMessage) {
  EXPECT_EQ(last_log_message("a\ntime=\"t\" level=fatal msg=\"it said \\\"no\\\"\" x=1\n\n"),
            "it said \"no\"");
  EXPECT_EQ(last_log_message("plain line\n"), "plain line");
  EXPECT_EQ(last_log_message(""), "");
}

TEST(GpuOperatorCluster, LabelPatch) {
  EXPECT_EQ(label_patch(),
            json::parse(
                R"({"metadata":{"labels":{"nvidia.com/gpu.workload.config":"vm-passthrough"}}})"));
  EXPECT_TRUE(is_labelled(node(true)));
  EXPECT_FALSE(is_labelled(node(false)));
}

}  // namespace
}  // namespace factory::host::gpu_operator
