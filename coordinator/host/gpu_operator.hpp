#pragma once
// Binding delegated to the NVIDIA GPU Operator already on the host cluster,
// instead of driverctl: with the ClusterPolicy's sandboxWorkloads.enabled, a
// node labelled nvidia.com/gpu.workload.config=vm-passthrough gets the
// operator's vfio-manager (which binds EVERY NVIDIA GPU of the node to
// vfio-pci: the operator works per node, not per card), its sandbox
// validator (which passes once they all are) and kubevirt-gpu-device-plugin
// (which then advertises them, so KubeVirt's allowlist entry needs
// externalResourceProvider: true).
//
// This is the product knowledge of that mode and nothing that talks to a
// cluster (the host module knows no Kubernetes client): what this host must
// look like first, and pure rules over the objects the caller read (the
// ClusterPolicy, the Node, the operand pods and their logs) that say where
// the hand-over stands and, for each known failure, why and what to do.
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"
#include "coordinator/host/host_root.hpp"
#include "coordinator/host/pci.hpp"
#include "coordinator/host/pci_ids.hpp"
#include "coordinator/host/resource_name.hpp"

namespace factory::host::gpu_operator {

using nlohmann::json;

// controllers/state_manager.go in github.com/NVIDIA/gpu-operator.
inline constexpr std::string_view kWorkloadLabel = "nvidia.com/gpu.workload.config";
inline constexpr std::string_view kVmPassthrough = "vm-passthrough";
// k8s-driver-manager sets it to "pre-installed" when the host has a driver.
inline constexpr std::string_view kDriverDeployLabel = "nvidia.com/gpu.deploy.driver";
// The operand pods, by their DaemonSets' pod labels (assets/state-*/0500_daemonset.yaml).
inline constexpr std::string_view kValidatorSelector = "app=nvidia-sandbox-validator";
inline constexpr std::string_view kVfioManagerSelector = "name=nvidia-vfio-manager";
inline constexpr std::string_view kDevicePluginSelector =
    "app=nvidia-sandbox-device-plugin-daemonset";

// A named known failure: one line of why, one of what to do.
struct Diagnosis {
  std::string name;    // "host-driver-loaded", "sandbox-validator-crashloop", ...
  std::string reason;  // why, with the names of what it saw
  std::string fix;     // what to do
  std::string line() const { return reason + ": " + fix; }
};

// ---- this host, before it is handed over ----

struct NodeGpu {
  PciAddress address;
  std::string id;      // "10de:27b8"
  std::string name;    // "AD104GL [L4]", empty when pci.ids lacks it
  std::string driver;  // as found
  ResourceName resource;
};

struct HostHandover {
  std::vector<NodeGpu> gpus;             // every NVIDIA GPU (display function) here
  std::vector<std::string> in_use;       // one line per GPU the host uses: a refusal
  std::optional<Diagnosis> host_driver;  // the host loads the NVIDIA driver
};
// Reads the host: every NVIDIA GPU (vfio-manage binds them all), what holds
// each (a process with its /dev/nvidiaN open, nvidia-persistenced included;
// another function of its IOMMU group on a host driver; no IOMMU group), and
// whether the NVIDIA driver is loaded with a GPU on it, which makes the
// operator's k8s-driver-manager refuse the node. ids may be null.
Result<HostHandover> read_host(const HostRoot& root, const PciIds* ids);

// The host loads the NVIDIA driver: vfio-manager skips the node.
Diagnosis host_driver_loaded(const std::string& node, const std::vector<std::string>& gpus_on_it);

// The node's name from the host (/proc/sys/kernel/hostname, /etc/hostname).
std::optional<std::string> host_node_name(const HostRoot& root);

// ---- the cluster, as the caller read it ----

struct SandboxPolicy {
  bool found = false;
  size_t count = 0;  // ClusterPolicies in the cluster (the operator honours one)
  std::string name;  // "cluster-policy"
  bool sandbox_enabled = false;
  std::string mode;  // "kubevirt" (the CRD's default) or "kata"
  bool vfio_manager_enabled = true;
  bool device_plugin_enabled = true;
};
// From a ClusterPolicyList.
SandboxPolicy read_policy(const json& list);
// Why the node cannot be handed over with this policy; nullopt when it can.
// `labelled`: the node already carries the vm-passthrough label.
std::optional<Diagnosis> policy_problem(const SandboxPolicy& p, const std::string& node,
                                        bool labelled);

// The merge patch that hands the node over (what --dry-run shows).
json label_patch();
bool is_labelled(const json& node);

// One container of an operand pod that is failing.
struct FailingContainer {
  std::string container;
  int restarts = 0;
  std::string waiting_reason;  // "CrashLoopBackOff"
  int last_exit = 0;
};

struct OperandPod {
  std::string ns, name;
  std::string operand;  // "vfio-manager", "sandbox-validator", "sandbox-device-plugin"
  std::string phase;
  bool ready = false;
  std::optional<FailingContainer> failing;
  std::string state;  // "Running", "Init:1/4", "Init:CrashLoopBackOff", as kubectl shows it
};
// From a PodList of the node's pods: the operands among them.
std::vector<OperandPod> read_operand_pods(const json& list);

// The NVIDIA resources a Node advertises (allocatable nvidia.com/*, without
// the container plugin's nvidia.com/gpu and MIG slices), with counts > 0.
std::map<std::string, long long> advertised(const json& node);

// Logs of failing containers, "pod/container" -> the last lines.
using Logs = std::map<std::string, std::string>;

// Where the hand-over stands and what is wrong, from one reading.
struct Observation {
  SandboxPolicy policy;
  json node;
  std::vector<OperandPod> pods;
  Logs logs;
};
// The known failure this reading shows, the most fundamental first: the
// label with sandboxWorkloads off, vfio-manager skipping a node whose host
// loads the NVIDIA driver, the sandbox validator crash-looping. nullopt: none
// (it may just not be done yet).
std::optional<Diagnosis> diagnose(const Observation& o, const std::string& node);

// The cards' names on the node differ from the ones expected: the operator's
// device plugin names a card from the pci.ids in its image, which may not be
// the host's. `expected` is the resource this host's pci.ids gives (by the
// plugin's rule), `selector` the card ("10DE:2335"); `advertised` what the
// node has. nullopt when the expected name is advertised or no other is.
std::optional<Diagnosis> resource_name_mismatch(const std::string& node,
                                                const std::string& selector,
                                                const std::string& expected,
                                                const std::map<std::string, long long>& advertised,
                                                const std::string& listed_in = "");

// The last meaningful line of a component's log: logrus' msg="..." when it
// has one (nvidia-validator, k8s-driver-manager), else the line.
std::string last_log_message(const std::string& log);

}  // namespace factory::host::gpu_operator
