// The host cluster's ranges as the coordinator reads them from API lists
// shaped as the API server sends them (coordinator/kubevirt/host_ranges.hpp):
// RKE2, kubeadm and a dual-stack cluster with ServiceCIDR objects.
#include "coordinator/kubevirt/host_ranges.hpp"

#include <gtest/gtest.h>

using factory::kubevirt::host_range_facts;
using factory::ranges::Fact;
using nlohmann::json;

namespace {

json node(const std::string& name, json spec, json addresses) {
  return {{"apiVersion", "v1"},
          {"kind", "Node"},
          {"metadata", {{"name", name}}},
          {"spec", spec},
          {"status", {{"addresses", addresses}}}};
}

json service(const std::string& ns, const std::string& name, json spec) {
  return {{"apiVersion", "v1"},
          {"kind", "Service"},
          {"metadata", {{"name", name}, {"namespace", ns}}},
          {"spec", spec}};
}

json list(const char* kind, json items) {
  return {{"apiVersion", "v1"}, {"kind", kind}, {"items", items}};
}

}  // namespace

TEST(HostRanges, TheRunbookHostsRke2Cluster) {
  json nodes =
      list("NodeList", {node("utho", {{"podCIDR", "10.42.0.0/24"}, {"podCIDRs", {"10.42.0.0/24"}}},
                             {{{"type", "InternalIP"}, {"address", "192.168.1.20"}},
                              {{"type", "Hostname"}, {"address", "utho"}}})});
  json k =
      service("default", "kubernetes", {{"clusterIP", "10.43.0.1"}, {"clusterIPs", {"10.43.0.1"}}});
  json dns =
      list("ServiceList",
           {service("kube-system", "rke2-coredns-rke2-coredns", {{"clusterIP", "10.43.0.10"}})});
  auto facts = host_range_facts(nodes, k, dns, json());
  EXPECT_EQ(
      facts,
      (std::vector<Fact>{
          {"10.42.0.0/24", "host node utho spec.podCIDRs"},
          {"192.168.1.20", "host node utho InternalIP"},
          {"10.43.0.1", "host Service default/kubernetes ClusterIP"},
          {"10.43.0.10", "host DNS Service kube-system/rke2-coredns-rke2-coredns ClusterIP"}}));
}

TEST(HostRanges, KubeadmWithOldNodesAndAHeadlessServiceLeftOut) {
  // A node written before podCIDRs existed has podCIDR only.
  json nodes = list("NodeList", {node("cp-1", {{"podCIDR", "10.244.0.0/24"}}, json::array()),
                                 node("worker-1", {{"podCIDRs", {"10.244.1.0/24"}}},
                                      {{{"type", "ExternalIP"}, {"address", "203.0.113.7"}}})});
  json dns = list("ServiceList", {service("kube-system", "kube-dns", {{"clusterIP", "10.96.0.10"}}),
                                  service("kube-system", "headless", {{"clusterIP", "None"}})});
  auto facts = host_range_facts(nodes, json(), dns, json());
  EXPECT_EQ(facts,
            (std::vector<Fact>{{"10.244.0.0/24", "host node cp-1 spec.podCIDR"},
                               {"10.244.1.0/24", "host node worker-1 spec.podCIDRs"},
                               {"203.0.113.7", "host node worker-1 ExternalIP"},
                               {"10.96.0.10", "host DNS Service kube-system/kube-dns ClusterIP"}}));
}

TEST(HostRanges, DualStackWithServiceCidrObjects) {
  json nodes =
      list("NodeList",
           {node("n1", {{"podCIDRs", {"10.244.0.0/24", "fd00:10:244::/64"}}}, json::array())});
  json k = service("default", "kubernetes",
                   {{"clusterIP", "10.96.0.1"}, {"clusterIPs", {"10.96.0.1", "fd00:10:96::1"}}});
  json cidrs = {{"apiVersion", "networking.k8s.io/v1"},
                {"kind", "ServiceCIDRList"},
                {"items",
                 {{{"metadata", {{"name", "kubernetes"}}},
                   {"spec", {{"cidrs", {"10.96.0.0/12", "fd00:10:96::/112"}}}}},
                  {{"metadata", {{"name", "extra"}}}, {"spec", {{"cidrs", {"10.100.0.0/16"}}}}}}}};
  auto facts = host_range_facts(nodes, k, list("ServiceList", json::array()), cidrs);
  EXPECT_EQ(facts,
            (std::vector<Fact>{{"10.244.0.0/24", "host node n1 spec.podCIDRs"},
                               {"fd00:10:244::/64", "host node n1 spec.podCIDRs"},
                               {"10.96.0.1", "host Service default/kubernetes ClusterIP"},
                               {"fd00:10:96::1", "host Service default/kubernetes ClusterIP"},
                               {"10.96.0.0/12", "host ServiceCIDR kubernetes"},
                               {"fd00:10:96::/112", "host ServiceCIDR kubernetes"},
                               {"10.100.0.0/16", "host ServiceCIDR extra"}}));
}
