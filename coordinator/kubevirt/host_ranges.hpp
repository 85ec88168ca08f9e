#pragma once
// What the host cluster's network already uses, read from its API for a
// guest cluster to pick its ranges around (contract/cluster_ranges.hpp): the
// nodes' pod ranges and addresses, the `kubernetes` Service's ClusterIP, the
// cluster DNS Service's, and the ServiceCIDR objects where the API has them.
// The Kubernetes client only fetches the objects; what they mean for a
// tenant's ranges is said here.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "contract/cluster_ranges.hpp"
#include "coordinator/kube/client.hpp"

namespace factory::kubevirt {

// The label every distribution's cluster DNS Service carries: kubeadm's and
// k3s's kube-system/kube-dns, RKE2's kube-system/rke2-coredns-rke2-coredns.
inline constexpr const char* kClusterDnsSelector = "k8s-app=kube-dns";

// Pure: the facts in these lists (a NodeList, the `kubernetes` Service or
// null when there is none, the kube-system Services labelled kube-dns, a
// ServiceCIDRList or null when the API does not serve the kind), each named
// by where it was seen. IPv6 entries are kept (a dual-stack host).
std::vector<ranges::Fact> host_range_facts(const nlohmann::json& nodes,
                                           const nlohmann::json& kubernetes_service,
                                           const nlohmann::json& dns_services,
                                           const nlohmann::json& service_cidrs);

// Reads the lists above through `client`. The ServiceCIDR kind not served
// (before Kubernetes 1.33) is not an error; any other failure is, so a host
// range is never silently left out.
Result<std::vector<ranges::Fact>> read_host_ranges(kube::KubeClient& client);

}  // namespace factory::kubevirt
