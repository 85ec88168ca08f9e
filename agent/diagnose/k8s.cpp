#include "agent/diagnose/k8s.hpp"

#include "common/cidr.hpp"
#include "contract/step_params.hpp"

namespace factory::agent {

using nlohmann::json;

namespace {

bool contains_address(const std::string& cidr, const std::string& addr) {
  auto c = Ipv4Cidr::parse(cidr);
  auto a = Ipv4Cidr::parse_address(addr);
  return c && a && c->contains(*a);
}

}  // namespace

// --- rules -----------------------------------------------------------------------

Status validate_ranges(const ClusterRanges& r) {
  return catalog::check_cluster_ranges(r.cluster_cidr, r.service_cidr, r.cluster_dns, "config");
}

std::string assumed_host_service_range(const std::string& dns_server) {
  auto a = Ipv4Cidr::parse_address(dns_server);
  if (!a) return dns_server;
  if ((*a & 0xFFFF) == 10) {
    Ipv4Cidr c{*a & 0xFFFF0000u, 16};
    return c.str();
  }
  return Ipv4Cidr{*a, 32}.str();
}

std::optional<Diagnosis> diagnose_cidr_plan(const ClusterRanges& planned,
                                            const std::vector<std::string>& dns_servers) {
  for (const auto& dns : dns_servers) {
    auto host = Ipv4Cidr::parse(assumed_host_service_range(dns));
    if (!host) continue;
    const std::pair<std::string, std::string> ranges[] = {{"service-cidr", planned.service_cidr},
                                                          {"cluster-cidr", planned.cluster_cidr}};
    for (const auto& [key, value] : ranges) {
      auto r = Ipv4Cidr::parse(value);
      if (r && r->overlaps(*host)) return diagnoses::guest_cidr_clash(key, value, dns, host->str());
    }
  }
  return std::nullopt;
}

Diagnosis diagnose_node_not_ready(const NodeNotReadyObservations& o) {
  std::string service_cidr = o.running_service_cidr.value_or(o.planned.service_cidr);
  for (const auto& dns : o.dns_servers)
    if (contains_address(service_cidr, dns))
      return diagnoses::guest_dns_clash(
          service_cidr, dns, o.planned,
          o.running_service_cidr && *o.running_service_cidr != o.planned.service_cidr);
  if (!o.node) return diagnoses::rke2_api_unreachable(o.service, o.api_error);
  json failing = json::array();
  for (const auto& p : o.system_pods)
    if (!p.running() && p.status != "Completed") failing.push_back(p.to_json());
  return diagnoses::rke2_node_not_ready(o.node->name, o.node->ready_reason, o.node->ready_message,
                                        failing);
}

Diagnosis diagnose_allocatable(const AllocatableObservations& o) {
  json nodes = json::array();
  bool any_labelled = false;
  for (const auto& n : o.nodes) {
    nodes.push_back(
        {{"name", n.name},
         {"ready", n.ready},
         {"gpu_label", n.labels.count("gpu") ? json(n.labels.at("gpu")) : json(nullptr)},
         {"allocatable",
          n.allocatable.count(o.resource) ? json(n.allocatable.at(o.resource)) : json(nullptr)}});
    any_labelled |= n.has_label("gpu", "on");
  }
  bool hami = false;
  std::vector<const KubePod*> hami_plugins, nvidia_plugins;
  json pending = json::array();
  for (const auto& p : o.pods) {
    if (is_hami_pod(p)) hami = true;
    if (is_hami_device_plugin(p)) hami_plugins.push_back(&p);
    if (is_nvidia_device_plugin(p)) nvidia_plugins.push_back(&p);
    bool wants = p.limits.count(o.resource) && p.limits.at(o.resource) > 0;
    if (p.phase == "Pending" && (is_hami_pod(p) || wants)) pending.push_back(p.to_json());
  }
  auto pods_json = [](const std::vector<const KubePod*>& ps) {
    json a = json::array();
    for (auto* p : ps) a.push_back(p->to_json());
    return a;
  };
  if (hami && !any_labelled) return diagnoses::hami_pods_pending(nodes, pending);
  if (!hami_plugins.empty() && !nvidia_plugins.empty()) {
    auto both = hami_plugins;
    both.insert(both.end(), nvidia_plugins.begin(), nvidia_plugins.end());
    return diagnoses::two_device_plugins(o.resource, pods_json(both));
  }
  if (hami_plugins.empty() && nvidia_plugins.empty())
    return diagnoses::device_plugin_not_running(
        o.resource,
        hami ? "HAMi is installed but has no device plugin pod on any node"
             : "no device plugin pod runs in any namespace (is the HAMi release installed?)",
        json::array());
  std::vector<const KubePod*> stuck;
  for (auto* p : hami_plugins.empty() ? nvidia_plugins : hami_plugins)
    if (!p->running() || !p->ready) stuck.push_back(p);
  if (!stuck.empty()) {
    const KubePod& p = *stuck.front();
    std::string detail = p.ns + "/" + p.name + " is " + p.status;
    if (p.status.rfind("Init:", 0) == 0)
      detail +=
          ": its toolkit-validation init container waits for the GPU Operator's container "
          "toolkit (/run/nvidia/validations/toolkit-ready)";
    else if (!p.message.empty())
      detail += ": " + p.message;
    return diagnoses::device_plugin_not_running(o.resource, detail, pods_json(stuck));
  }
  return diagnoses::allocatable_short(o.resource, o.found, o.count, nodes);
}

// --- the diagnoses ---------------------------------------------------------------

namespace diagnoses {

Diagnosis guest_cidr_clash(const std::string& key, const std::string& planned,
                           const std::string& dns_server, const std::string& host_range) {
  return {"guest_cidr_clash",
          "the planned " + key + " " + planned + " overlaps the host cluster's service range (" +
              host_range + ", around " + dns_server +
              ", the DNS server the guest got from DHCP): the guest's kube-proxy would capture the "
              "host's DNS and the guest's node would stay NotReady",
          "give the tier ranges that do not overlap " + host_range +
              " (catalog settings cluster_cidr / service_cidr / cluster_dns, e.g. 10.52.0.0/16, "
              "10.53.0.0/16, 10.53.0.10) and `factory tenant retry`; nothing was installed",
          {{"key", key},
           {"planned", planned},
           {"dns_server", dns_server},
           {"host_service_range_assumed", host_range}}};
}

Diagnosis guest_dns_clash(const std::string& service_cidr, const std::string& dns_server,
                          const ClusterRanges& planned, bool created_with_other_ranges) {
  std::string summary = "the guest cluster's service range " + service_cidr + " holds " +
                        dns_server +
                        ", the DNS server the guest got from DHCP (the host cluster's): the "
                        "guest's kube-proxy captures it, DNS lookups are refused and the node "
                        "stays NotReady";
  if (created_with_other_ranges)
    summary += "; the cluster was created with " + service_cidr + ", not the planned " +
               planned.service_cidr + " (a cluster's ranges are fixed at its first start)";
  return {"guest_dns_clash",
          summary,
          "in the guest run /usr/local/bin/rke2-killall.sh and /usr/local/bin/rke2-uninstall.sh "
          "(this deletes the guest cluster), then `factory tenant retry`: the plan writes "
          "/etc/rancher/rke2/config.yaml with cluster-cidr " +
              planned.cluster_cidr + ", service-cidr " + planned.service_cidr +
              " and cluster-dns " + planned.cluster_dns + " before installing RKE2 again",
          {{"service_cidr", service_cidr},
           {"dns_server", dns_server},
           {"planned",
            {{"cluster-cidr", planned.cluster_cidr},
             {"service-cidr", planned.service_cidr},
             {"cluster-dns", planned.cluster_dns}}}}};
}

Diagnosis rke2_api_unreachable(const std::string& service, const std::string& error) {
  return {"rke2_api_unreachable",
          "the guest cluster's API never answered after " + service + " started (" + error + ")",
          "in the guest read `systemctl status " + service + "` and `journalctl -u " + service +
              "`, fix what it reports, then `factory tenant retry`",
          {{"service", service}, {"error", error}}};
}

Diagnosis rke2_node_not_ready(const std::string& node, const std::string& reason,
                              const std::string& message, const json& failing_pods) {
  std::string why =
      reason.empty() ? "" : " (" + reason + (message.empty() ? "" : ": " + message) + ")";
  return {
      "rke2_node_not_ready",
      "the guest cluster's node " + node + " did not become Ready" + why,
      "in the guest run `kubectl get pods -n kube-system` and `kubectl describe node " + node +
          "` (KUBECONFIG=/etc/rancher/rke2/rke2.yaml, PATH=/var/lib/rancher/rke2/bin:$PATH), "
          "fix what they report, then `factory tenant retry`",
      {{"node", node}, {"reason", reason}, {"message", message}, {"failing_pods", failing_pods}}};
}

Diagnosis helm_release_failed(const std::string& release, const std::string& ns,
                              const std::string& status, const std::string& error,
                              const json& pods_not_ready) {
  std::string summary = "the Helm release " + release + " in namespace " + ns + " did not deploy";
  if (!status.empty()) summary += " (status " + status + ")";
  if (!error.empty()) summary += ": " + error;
  return {"helm_release_failed",
          summary,
          "in the guest run `kubectl -n " + ns + " get pods` and `kubectl -n " + ns +
              " describe pod` on the pods that are not ready, fix what they report, then "
              "`factory tenant retry` (the release is upgraded in place)",
          {{"release", release},
           {"namespace", ns},
           {"status", status},
           {"error", error},
           {"pods_not_ready", pods_not_ready}}};
}

Diagnosis helm_operation_in_progress(const std::string& release, const std::string& ns,
                                     const std::string& status) {
  return {"helm_operation_in_progress",
          "the Helm release " + release + " in namespace " + ns + " is " + status +
              ": another helm operation on it has not finished",
          "wait for it to finish, or if no helm process runs in the guest any more: `helm -n " +
              ns + " rollback " + release + "` (pending-upgrade) or `helm -n " + ns +
              " uninstall " + release + "` (pending-install), then `factory tenant retry`",
          {{"release", release}, {"namespace", ns}, {"status", status}}};
}

Diagnosis hami_pods_pending(const json& nodes, const json& pending_pods) {
  return {"hami_pods_pending",
          "HAMi's device plugin has no pod on any node: HAMi only schedules onto nodes labelled "
          "gpu=on and no node has that label, so nothing advertises the GPU slices and pods "
          "asking for them stay Pending",
          "kubectl label node --all gpu=on",
          {{"nodes", nodes}, {"pending_pods", pending_pods}}};
}

Diagnosis device_plugin_not_running(const std::string& resource, const std::string& detail,
                                    const json& pods) {
  return {"device_plugin_not_running",
          "no device plugin advertises " + resource + ": " + detail,
          "in the guest run `kubectl -n hami-system describe pod -l "
          "app.kubernetes.io/component=hami-device-plugin` and `kubectl -n gpu-operator get "
          "pods`; the HAMi plugin needs the GPU Operator's driver and toolkit running",
          {{"resource", resource}, {"detail", detail}, {"pods", pods}}};
}

Diagnosis two_device_plugins(const std::string& resource, const json& pods) {
  return {"two_device_plugins",
          "two device plugins advertise " + resource +
              ": the GPU Operator's own and HAMi's, and they fight over the card",
          "turn the GPU Operator's device plugin off (its values: devicePlugin.enabled: false) "
          "and `factory tenant retry`",
          {{"resource", resource}, {"pods", pods}}};
}

Diagnosis allocatable_short(const std::string& resource, long long found, long long count,
                            const json& nodes) {
  return {"allocatable_short",
          "the guest cluster advertises " + std::to_string(found) + " " + resource +
              ", the plan expects " + std::to_string(count),
          "check HAMi's devicePlugin.deviceSplitCount against the tier's split_count and that "
          "the guest sees every card (`chroot /run/nvidia/driver nvidia-smi -L`)",
          {{"resource", resource}, {"found", found}, {"expected", count}, {"nodes", nodes}}};
}

}  // namespace diagnoses
}  // namespace factory::agent
