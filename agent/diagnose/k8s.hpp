#pragma once
// The named failures the agent knows in the guest cluster (gpu-k8s tier):
// RKE2's ranges clashing with the host cluster's DNS (the runbook's "node
// stays NotReady and DNS times out"), HAMi's device plugin not running
// because no node is labelled gpu=on, a Helm release that did not deploy.
// Pure functions of what was observed (agent/guest/cluster.hpp and dns.hpp
// read it), tested on constructed and captured input.
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "agent/diagnose/diagnosis.hpp"
#include "agent/guest/cluster.hpp"
#include "common/error.hpp"

namespace factory::agent {

// --- rules -------------------------------------------------------------------

struct ClusterRanges {
  std::string cluster_cidr;  // pods
  std::string service_cidr;  // services
  std::string cluster_dns;   // the DNS service's address, inside service_cidr
};

// The ranges must parse, not overlap each other, and hold cluster_dns in
// service_cidr: the rke2 step's rule (contract/step_params.hpp). Errors say which.
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
