#pragma once
// The guest's own cluster (gpu-k8s tier) as the agent reads it: kubectl as
// the steps and the health probe run it in the guest (RKE2's own kubectl,
// <root>/var/lib/rancher/rke2/bin, not on PATH: the runbook exports it; else
// one from PATH; always with the guest cluster's kubeconfig under the guest
// root), and its nodes and pods as kubectl shows them. Errors say which of
// "not installed", "no kubeconfig" and "the API does not answer" it was, so a
// step can tell "not done yet" from broken. The parsers are pure (tested on
// constructed and captured input).
#include <chrono>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "agent/guest/env.hpp"
#include "common/subprocess.hpp"

namespace factory::agent {

inline constexpr const char* kRke2Kubeconfig = "/etc/rancher/rke2/rke2.yaml";
inline constexpr const char* kRke2BinDir = "/var/lib/rancher/rke2/bin";

// A node as `kubectl get nodes -o json` shows it.
struct KubeNode {
  std::string name;
  bool ready = false;
  std::string ready_reason;   // the Ready condition's reason, e.g. KubeletNotReady
  std::string ready_message;  // and its message
  std::map<std::string, std::string> labels;
  std::map<std::string, std::string> allocatable;  // quantities as the API writes them
  std::map<std::string, std::string> capacity;
  std::string kubelet_version;

  bool has_label(const std::string& key, const std::string& value) const;
  nlohmann::json to_json() const;
};

// A pod as `kubectl get pods -o json` shows it.
struct KubePod {
  std::string ns;
  std::string name;
  std::string phase;   // Pending, Running, Succeeded, Failed
  std::string status;  // kubectl's STATUS column: Running, Pending, Init:0/1, CrashLoopBackOff, ...
  std::string message;  // why it waits / is unschedulable, when the API says
  std::string node;
  bool ready = false;
  int restarts = 0;
  std::map<std::string, std::string> labels;
  // Resource limits summed over the containers, e.g. nvidia.com/gpu: 1,
  // nvidia.com/gpumem: 1024 (HAMi's per-pod memory limit, in MiB).
  std::map<std::string, long long> limits;

  bool running() const { return phase == "Running" && status == "Running"; }
  nlohmann::json to_json() const;
};

// Accept a List (kubectl get ... -o json) or a single object. Items that are
// not objects are skipped; a document that is neither is an empty list.
std::vector<KubeNode> parse_node_list(const nlohmann::json& doc);
std::vector<KubePod> parse_pod_list(const nlohmann::json& doc);

// An extended resource's quantity ("10", "1k") as a count; nullopt when it is
// not a whole number (e.g. "1500m").
std::optional<long long> parse_quantity_count(const std::string& quantity);

// HAMi's pods (app.kubernetes.io/name=hami, or named hami-*), its device
// plugin's pods (component hami-device-plugin), and the GPU Operator's own
// device plugin (nvidia-device-plugin-daemonset).
bool is_hami_pod(const KubePod& p);
bool is_hami_device_plugin(const KubePod& p);
bool is_nvidia_device_plugin(const KubePod& p);

class Kubectl {
 public:
  // kubeconfig and bin_dir are guest paths (root-prefixed here). Errors:
  // not_found when no kubectl exists (the cluster is not installed yet).
  static Result<Kubectl> find(const GuestEnv& env, const std::string& kubeconfig = kRke2Kubeconfig,
                              const std::string& bin_dir = kRke2BinDir);

  // `kubectl --kubeconfig K args...`. Errors when it could not start, or
  // not_found when the kubeconfig does not exist (nothing is run then).
  Result<CommandResult> run(std::vector<std::string> args, std::chrono::milliseconds timeout) const;

  // Runs args with `-o json` and parses the output. Errors: not_found (no
  // kubeconfig file), unavailable (the API refused or timed out),
  // failed_precondition (kubectl failed otherwise), protocol (not JSON).
  Result<nlohmann::json> get_json(std::vector<std::string> args,
                                  std::chrono::milliseconds timeout) const;

  Result<std::vector<KubeNode>> nodes(std::chrono::milliseconds timeout) const;
  // Every namespace when ns is empty.
  Result<std::vector<KubePod>> pods(std::chrono::milliseconds timeout,
                                    const std::string& ns = "") const;

  const std::string& binary() const { return binary_; }
  const std::filesystem::path& kubeconfig() const { return kubeconfig_; }

 private:
  std::string binary_;
  std::filesystem::path kubeconfig_;
};

// Turns a failed kubectl/helm run into an Error with the right code (see
// get_json) and its last line.
Error classify_kube_failure(const std::string& tool, const CommandResult& r);

// The service range the running guest cluster was created with: the
// --service-cluster-ip-range argument in RKE2's kube-apiserver static pod
// manifest (<root>/var/lib/rancher/rke2/agent/pod-manifests/kube-apiserver.yaml).
std::optional<std::string> rke2_running_service_cidr(const GuestEnv& env);

}  // namespace factory::agent
