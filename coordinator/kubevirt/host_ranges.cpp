#include "coordinator/kubevirt/host_ranges.hpp"

#include <algorithm>

namespace factory::kubevirt {

using nlohmann::json;

namespace {

void add(std::vector<ranges::Fact>& out, const json& v, const std::string& source) {
  if (!v.is_string() || v.get<std::string>().empty() || v.get<std::string>() == "None") return;
  ranges::Fact f{v.get<std::string>(), source};
  if (std::find(out.begin(), out.end(), f) == out.end()) out.push_back(std::move(f));
}

std::string ref(const json& obj) {
  const json& md = obj.value("metadata", json::object());
  std::string ns = md.value("namespace", "");
  return (ns.empty() ? "" : ns + "/") + md.value("name", "?");
}

// A Service's ClusterIPs (clusterIPs holds both families when dual-stack;
// clusterIP alone on older objects). "None" is a headless Service.
void add_cluster_ips(std::vector<ranges::Fact>& out, const json& svc, const std::string& what) {
  if (!svc.is_object()) return;
  const json& spec = svc.value("spec", json::object());
  std::string source = "host " + what + " " + ref(svc) + " ClusterIP";
  if (spec.contains("clusterIPs") && spec["clusterIPs"].is_array() && !spec["clusterIPs"].empty())
    for (const auto& ip : spec["clusterIPs"]) add(out, ip, source);
  else
    add(out, spec.value("clusterIP", json()), source);
}

}  // namespace

std::vector<ranges::Fact> host_range_facts(const json& nodes, const json& kubernetes_service,
                                           const json& dns_services, const json& service_cidrs) {
  std::vector<ranges::Fact> out;
  for (const auto& n : nodes.value("items", json::array())) {
    std::string name = n.value("/metadata/name"_json_pointer, std::string("?"));
    const json& spec = n.value("spec", json::object());
    if (spec.contains("podCIDRs") && spec["podCIDRs"].is_array() && !spec["podCIDRs"].empty())
      for (const auto& c : spec["podCIDRs"]) add(out, c, "host node " + name + " spec.podCIDRs");
    else
      add(out, spec.value("podCIDR", json()), "host node " + name + " spec.podCIDR");
    for (const auto& a : n.value("/status/addresses"_json_pointer, json::array())) {
      std::string type = a.value("type", "");
      if (type == "InternalIP" || type == "ExternalIP")
        add(out, a.value("address", json()), "host node " + name + " " + type);
    }
  }
  add_cluster_ips(out, kubernetes_service, "Service");
  for (const auto& s : dns_services.value("items", json::array()))
    add_cluster_ips(out, s, "DNS Service");
  if (service_cidrs.is_object())
    for (const auto& c : service_cidrs.value("items", json::array()))
      for (const auto& r : c.value("/spec/cidrs"_json_pointer, json::array()))
        add(out, r, "host ServiceCIDR " + ref(c));
  return out;
}

Result<std::vector<ranges::Fact>> read_host_ranges(kube::KubeClient& client) {
  auto ctx = [](const char* what) { return std::string("reading the host cluster's ") + what; };
  auto nodes = client.list(kube::kNode, "");
  if (!nodes) return nodes.error().with_context(ctx("node pod ranges"));
  json kubernetes;
  if (auto k = client.get(kube::kService, "default", "kubernetes"); k)
    kubernetes = *k;
  else if (k.error().code != Errc::not_found)
    return k.error().with_context(ctx("kubernetes Service"));
  kube::ListOptions dns_opts;
  dns_opts.label_selector = kClusterDnsSelector;
  auto dns = client.list(kube::kService, "kube-system", dns_opts);
  if (!dns) return dns.error().with_context(ctx("DNS Service"));
  json cidrs;
  if (auto c = client.list(kube::kServiceCIDR, ""); c)
    cidrs = *c;
  else if (c.error().code != Errc::not_found)
    return c.error().with_context(ctx("ServiceCIDRs"));
  auto facts = host_range_facts(*nodes, kubernetes, *dns, cidrs);
  // What we read must parse: a range we cannot read is one we cannot avoid.
  if (auto parsed = ranges::parse_facts(facts); !parsed) return parsed.error();
  return facts;
}

}  // namespace factory::kubevirt
