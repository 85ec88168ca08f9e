#include "agent/diagnose/k8s.hpp"

#include <algorithm>
#include <charconv>
#include <regex>
#include <sstream>

#include "common/atomic_file.hpp"
#include "common/cidr.hpp"
#include "common/subprocess.hpp"

namespace factory::agent {

using nlohmann::json;

namespace {

std::string str_at(const json& j, const char* key) {
  if (j.is_object() && j.contains(key) && j[key].is_string()) return j[key].get<std::string>();
  return "";
}

const json& obj_at(const json& j, const char* key) {
  static const json empty = json::object();
  if (j.is_object() && j.contains(key) && j[key].is_object()) return j[key];
  return empty;
}

const json& arr_at(const json& j, const char* key) {
  static const json empty = json::array();
  if (j.is_object() && j.contains(key) && j[key].is_array()) return j[key];
  return empty;
}

std::map<std::string, std::string> string_map(const json& j) {
  std::map<std::string, std::string> m;
  if (!j.is_object()) return m;
  for (auto& [k, v] : j.items()) {
    if (v.is_string())
      m[k] = v.get<std::string>();
    else if (v.is_number_integer())
      m[k] = std::to_string(v.get<long long>());
  }
  return m;
}

// A limit's value ("1", 1, "1024") as a count; 0 when it is not one.
long long limit_count(const json& v) {
  if (v.is_number_integer()) return v.get<long long>();
  if (v.is_string()) return parse_quantity_count(v.get<std::string>()).value_or(0);
  return 0;
}

std::vector<json> items_of(const json& doc) {
  std::vector<json> out;
  if (!doc.is_object()) return out;
  if (doc.contains("items") && doc["items"].is_array()) {
    for (const auto& i : doc["items"])
      if (i.is_object()) out.push_back(i);
  } else if (doc.contains("metadata")) {
    out.push_back(doc);
  }
  return out;
}

bool is_loopback(const std::string& addr) {
  auto a = Ipv4Cidr::parse_address(addr);
  if (a) return (*a >> 24) == 127;
  return addr == "::1";
}

bool contains_address(const std::string& cidr, const std::string& addr) {
  auto c = Ipv4Cidr::parse(cidr);
  auto a = Ipv4Cidr::parse_address(addr);
  return c && a && c->contains(*a);
}

}  // namespace

// --- parsing -----------------------------------------------------------------

bool KubeNode::has_label(const std::string& key, const std::string& value) const {
  auto it = labels.find(key);
  return it != labels.end() && it->second == value;
}

json KubeNode::to_json() const {
  return {{"name", name},
          {"ready", ready},
          {"ready_reason", ready_reason},
          {"ready_message", ready_message},
          {"labels", labels},
          {"allocatable", allocatable},
          {"capacity", capacity},
          {"kubelet_version", kubelet_version}};
}

json KubePod::to_json() const {
  json j = {{"namespace", ns},  {"name", name},         {"phase", phase},
            {"status", status}, {"restarts", restarts}, {"node", node}};
  if (!message.empty()) j["message"] = message;
  return j;
}

std::optional<long long> parse_quantity_count(const std::string& q) {
  if (q.empty()) return std::nullopt;
  long long n = 0;
  auto [p, ec] = std::from_chars(q.data(), q.data() + q.size(), n);
  if (ec != std::errc()) return std::nullopt;
  std::string suffix(p, q.data() + q.size());
  static const std::map<std::string, long long> mult = {
      {"", 1},           {"k", 1000},       {"M", 1000000},   {"G", 1000000000},
      {"Ki", 1LL << 10}, {"Mi", 1LL << 20}, {"Gi", 1LL << 30}};
  auto it = mult.find(suffix);
  if (it == mult.end()) return std::nullopt;
  return n * it->second;
}

std::vector<KubeNode> parse_node_list(const json& doc) {
  std::vector<KubeNode> nodes;
  for (const auto& item : items_of(doc)) {
    KubeNode n;
    const json& meta = obj_at(item, "metadata");
    const json& status = obj_at(item, "status");
    n.name = str_at(meta, "name");
    n.labels = string_map(obj_at(meta, "labels"));
    n.allocatable = string_map(obj_at(status, "allocatable"));
    n.capacity = string_map(obj_at(status, "capacity"));
    n.kubelet_version = str_at(obj_at(status, "nodeInfo"), "kubeletVersion");
    for (const auto& c : arr_at(status, "conditions")) {
      if (str_at(c, "type") != "Ready") continue;
      n.ready = str_at(c, "status") == "True";
      n.ready_reason = str_at(c, "reason");
      n.ready_message = str_at(c, "message");
    }
    nodes.push_back(std::move(n));
  }
  return nodes;
}

std::vector<KubePod> parse_pod_list(const json& doc) {
  std::vector<KubePod> pods;
  for (const auto& item : items_of(doc)) {
    KubePod p;
    const json& meta = obj_at(item, "metadata");
    const json& spec = obj_at(item, "spec");
    const json& status = obj_at(item, "status");
    p.ns = str_at(meta, "namespace");
    p.name = str_at(meta, "name");
    p.labels = string_map(obj_at(meta, "labels"));
    p.node = str_at(spec, "nodeName");
    p.phase = str_at(status, "phase");
    for (const auto& c : arr_at(spec, "containers"))
      for (auto& [k, v] : obj_at(obj_at(c, "resources"), "limits").items())
        p.limits[k] += limit_count(v);

    // kubectl's STATUS column: an init container still at work, else the
    // first waiting container's reason, else the phase.
    p.status = p.phase;
    const json& inits = arr_at(status, "initContainerStatuses");
    int init_done = 0;
    bool in_init = false;
    for (const auto& cs : inits) {
      const json& st = obj_at(cs, "state");
      if (st.contains("terminated") && str_at(obj_at(st, "terminated"), "reason") == "Completed")
        ++init_done;
      else
        in_init = true;
    }
    if (in_init)
      p.status = "Init:" + std::to_string(init_done) + "/" + std::to_string(inits.size());
    bool all_ready = !arr_at(status, "containerStatuses").empty();
    for (const auto& cs : arr_at(status, "containerStatuses")) {
      if (cs.contains("restartCount") && cs["restartCount"].is_number_integer())
        p.restarts += cs["restartCount"].get<int>();
      if (!(cs.contains("ready") && cs["ready"].is_boolean() && cs["ready"].get<bool>()))
        all_ready = false;
      const json& waiting = obj_at(obj_at(cs, "state"), "waiting");
      if (!in_init && !waiting.empty() && p.status == p.phase) {
        p.status = str_at(waiting, "reason").empty() ? "Waiting" : str_at(waiting, "reason");
        p.message = str_at(waiting, "message");
      }
    }
    if (p.phase == "Succeeded") p.status = "Completed";
    p.ready = all_ready;
    for (const auto& c : arr_at(status, "conditions"))
      if (str_at(c, "type") == "PodScheduled" && str_at(c, "status") == "False" &&
          p.message.empty())
        p.message = str_at(c, "message");
    pods.push_back(std::move(p));
  }
  return pods;
}

bool is_hami_pod(const KubePod& p) {
  auto it = p.labels.find("app.kubernetes.io/name");
  if (it != p.labels.end() && it->second == "hami") return true;
  return p.name.rfind("hami-", 0) == 0;
}

bool is_hami_device_plugin(const KubePod& p) {
  auto it = p.labels.find("app.kubernetes.io/component");
  if (it != p.labels.end()) return it->second == "hami-device-plugin";
  return p.name.rfind("hami-device-plugin", 0) == 0;
}

bool is_nvidia_device_plugin(const KubePod& p) {
  auto it = p.labels.find("app");
  if (it != p.labels.end() && it->second == "nvidia-device-plugin-daemonset") return true;
  return p.name.rfind("nvidia-device-plugin-daemonset", 0) == 0;
}

// --- DNS -----------------------------------------------------------------------

std::vector<std::string> parse_resolv_conf(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string word, addr;
    ls >> word >> addr;
    if (word == "nameserver" && !addr.empty() && !is_loopback(addr)) out.push_back(addr);
  }
  return out;
}

std::vector<std::string> parse_resolvectl_status(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  static const std::regex re(R"(^\s*(?:Current DNS Server|DNS Servers):\s*(.*)$)");
  while (std::getline(in, line)) {
    std::smatch m;
    if (!std::regex_match(line, m, re)) continue;
    std::istringstream ws(m[1].str());
    std::string addr;
    while (ws >> addr) {
      // resolvectl may print "10.43.0.10#dns.example" (DNS over TLS names).
      addr = addr.substr(0, addr.find('#'));
      if (!is_loopback(addr) && std::find(out.begin(), out.end(), addr) == out.end())
        out.push_back(addr);
    }
  }
  return out;
}

std::vector<std::string> guest_dns_servers(const GuestEnv& env) {
  std::vector<std::string> found;
  for (const char* f : {"/run/systemd/resolve/resolv.conf", "/etc/resolv.conf"}) {
    auto text = read_file(env.path(f));
    if (!text) continue;
    found = parse_resolv_conf(*text);
    if (!found.empty()) break;
  }
  if (found.empty()) {
    CommandSpec spec;
    spec.argv = {"resolvectl", "status"};
    spec.timeout = std::chrono::seconds(10);
    auto r = run_command(spec);
    if (r && r->ok()) found = parse_resolvectl_status(r->output);
  }
  std::vector<std::string> unique;
  for (auto& s : found)
    if (std::find(unique.begin(), unique.end(), s) == unique.end()) unique.push_back(s);
  return unique;
}

std::optional<std::string> rke2_running_service_cidr(const GuestEnv& env) {
  auto text = read_file(env.path("/var/lib/rancher/rke2/agent/pod-manifests/kube-apiserver.yaml"));
  if (!text) return std::nullopt;
  static const std::regex re(R"(--service-cluster-ip-range=([0-9./]+))");
  std::smatch m;
  if (std::regex_search(*text, m, re)) return m[1].str();
  return std::nullopt;
}

// --- rules -----------------------------------------------------------------------

Status validate_ranges(const ClusterRanges& r) {
  auto pods = Ipv4Cidr::parse(r.cluster_cidr);
  if (!pods) return Error(Errc::invalid_argument, "cluster-cidr: " + pods.error().message);
  auto svcs = Ipv4Cidr::parse(r.service_cidr);
  if (!svcs) return Error(Errc::invalid_argument, "service-cidr: " + svcs.error().message);
  auto dns = Ipv4Cidr::parse_address(r.cluster_dns);
  if (!dns) return Error(Errc::invalid_argument, "cluster-dns: " + dns.error().message);
  if (pods->overlaps(*svcs))
    return Error(Errc::invalid_argument,
                 "cluster-cidr " + r.cluster_cidr + " overlaps service-cidr " + r.service_cidr);
  if (!svcs->contains(*dns))
    return Error(Errc::invalid_argument,
                 "cluster-dns " + r.cluster_dns + " is not inside service-cidr " + r.service_cidr);
  return ok_status();
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
