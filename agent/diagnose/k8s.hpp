#pragma once
// The guest cluster (gpu-k8s tier) as the agent observes it, and the named
// failures it knows there: RKE2's ranges clashing with the host cluster's DNS
// (the runbook's "node stays NotReady and DNS times out"), HAMi's device
// plugin not running because no node is labelled gpu=on, a Helm release that
// did not deploy. Parsers and rules are pure (tested on constructed and
// captured input); guest_dns_servers() and rke2_running_service_cidr() read
// the guest through GuestEnv.
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "agent/diagnose/diagnosis.hpp"
#include "agent/plan/step.hpp"

namespace factory::agent {

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

// --- the guest's DNS ---------------------------------------------------------

// `nameserver` addresses in resolv.conf text, loopback ones (systemd-resolved's
// 127.0.0.53 stub) left out.
std::vector<std::string> parse_resolv_conf(const std::string& text);
// "Current DNS Server:" and "DNS Servers:" addresses in `resolvectl status`.
std::vector<std::string> parse_resolvectl_status(const std::string& text);
// The DNS servers the guest got from DHCP: systemd-resolved's upstream list
// (<root>/run/systemd/resolve/resolv.conf), else <root>/etc/resolv.conf, else
// `resolvectl status`. Duplicates removed, order kept.
std::vector<std::string> guest_dns_servers(const GuestEnv& env);

// The service range the running guest cluster was created with: the
// --service-cluster-ip-range argument in RKE2's kube-apiserver static pod
// manifest (<root>/var/lib/rancher/rke2/agent/pod-manifests/kube-apiserver.yaml).
std::optional<std::string> rke2_running_service_cidr(const GuestEnv& env);

// --- rules -------------------------------------------------------------------

struct ClusterRanges {
  std::string cluster_cidr;  // pods
  std::string service_cidr;  // services
  std::string cluster_dns;   // the DNS service's address, inside service_cidr
};

// The ranges must parse, not overlap each other, and hold cluster_dns in
// service_cidr. Errors say which.
Status validate_ranges(const ClusterRanges& r);

// What the guest can see of the host cluster's service range: only its DNS
// server. A server at x.y.0.10 is taken as the .10 of a /16 (the RKE2/k3s
// default layout: 10.43.0.10 in 10.43.0.0/16), anything else as itself.
std::string assumed_host_service_range(const std::string& dns_server);

// Refuses planned ranges that overlap the host cluster's service range as
// the guest sees it (its DNS servers): the guest's kube-proxy would capture
// the host's DNS address. nullopt when they do not.
std::optional<Diagnosis> diagnose_cidr_plan(const ClusterRanges& planned,
                                            const std::vector<std::string>& dns_servers);

// Why the guest's node is not Ready.
struct NodeNotReadyObservations {
  std::optional<KubeNode> node;                     // absent when the API gave no node
  std::string api_error;                            // set when the API did not answer
  std::vector<std::string> dns_servers;             // the guest's (from DHCP)
  std::optional<std::string> running_service_cidr;  // the cluster's, when known
  ClusterRanges planned;
  std::vector<KubePod> system_pods;  // kube-system
  std::string service;               // rke2-server
};
// guest_dns_clash when a DNS server lies in the cluster's service range (the
// running one, else the planned one); rke2_api_unreachable when the API never
// answered; else rke2_node_not_ready.
Diagnosis diagnose_node_not_ready(const NodeNotReadyObservations& o);

// Why fewer than `count` of `resource` are allocatable.
struct AllocatableObservations {
  std::string resource;  // nvidia.com/gpu
  long long count = 0;
  long long found = 0;
  std::vector<KubeNode> nodes;
  std::vector<KubePod> pods;  // every namespace
};
// In order: hami_pods_pending (HAMi installed, no node labelled gpu=on),
// two_device_plugins (the GPU Operator's device plugin runs beside HAMi's),
// device_plugin_not_running (no HAMi device plugin pod running, or none at
// all), allocatable_short (it runs and advertises too few).
Diagnosis diagnose_allocatable(const AllocatableObservations& o);

namespace diagnoses {

Diagnosis guest_cidr_clash(const std::string& key, const std::string& planned,
                           const std::string& dns_server, const std::string& host_range);
Diagnosis guest_dns_clash(const std::string& service_cidr, const std::string& dns_server,
                          const ClusterRanges& planned, bool created_with_other_ranges);
Diagnosis rke2_api_unreachable(const std::string& service, const std::string& error);
Diagnosis rke2_node_not_ready(const std::string& node, const std::string& reason,
                              const std::string& message, const nlohmann::json& failing_pods);
Diagnosis helm_release_failed(const std::string& release, const std::string& ns,
                              const std::string& status, const std::string& error,
                              const nlohmann::json& pods_not_ready);
Diagnosis helm_operation_in_progress(const std::string& release, const std::string& ns,
                                     const std::string& status);
Diagnosis hami_pods_pending(const nlohmann::json& nodes, const nlohmann::json& pending_pods);
Diagnosis device_plugin_not_running(const std::string& resource, const std::string& detail,
                                    const nlohmann::json& pods);
Diagnosis two_device_plugins(const std::string& resource, const nlohmann::json& pods);
Diagnosis allocatable_short(const std::string& resource, long long found, long long count,
                            const nlohmann::json& nodes);

}  // namespace diagnoses
}  // namespace factory::agent
