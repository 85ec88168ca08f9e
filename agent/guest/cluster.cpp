#include "agent/guest/cluster.hpp"

#include <unistd.h>

#include <charconv>
#include <regex>

#include "common/atomic_file.hpp"

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

}  // namespace

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

Result<Kubectl> Kubectl::find(const GuestEnv& env, const std::string& kubeconfig,
                              const std::string& bin_dir) {
  Kubectl k;
  k.kubeconfig_ = env.path(kubeconfig);
  // RKE2's own first: it matches the cluster's version (kubectl supports
  // one minor version of skew), whatever else the guest has on PATH.
  auto own = env.path(bin_dir) / "kubectl";
  if (::access(own.c_str(), X_OK) == 0)
    k.binary_ = own.string();
  else
    k.binary_ = which("kubectl");
  if (k.binary_.empty())
    return Error(Errc::not_found, "kubectl is neither on PATH nor in " +
                                      env.path(bin_dir).string() +
                                      " (RKE2 puts it there when rke2-server starts)");
  return k;
}

Result<CommandResult> Kubectl::run(std::vector<std::string> args,
                                   std::chrono::milliseconds timeout) const {
  std::error_code ec;
  if (!std::filesystem::exists(kubeconfig_, ec))
    return Error(Errc::not_found, "the guest cluster's kubeconfig " + kubeconfig_.string() +
                                      " does not exist (RKE2 writes it when rke2-server starts)");
  CommandSpec spec;
  spec.argv = {binary_, "--kubeconfig", kubeconfig_.string()};
  for (auto& a : args) spec.argv.push_back(std::move(a));
  spec.timeout = timeout;
  return run_command(spec);
}

Error classify_kube_failure(const std::string& tool, const CommandResult& r) {
  std::string last = r.tail(1);
  while (!last.empty() && (last.back() == '\n' || last.back() == ' ')) last.pop_back();
  std::string msg = tool + " " + r.describe() + (last.empty() ? "" : ": " + last);
  if (r.timed_out) return Error(Errc::unavailable, msg);
  if (r.exit_code == 127) return Error(Errc::not_found, msg);  // the shell's "command not found"
  const std::string& o = r.output;
  if (o.find("no such file or directory") != std::string::npos &&
      (o.find("stat ") != std::string::npos || o.find("kubeconfig") != std::string::npos))
    return Error(Errc::not_found, msg);
  if (o.find("connection refused") != std::string::npos ||
      o.find("was refused") != std::string::npos ||
      o.find("cluster unreachable") != std::string::npos ||
      o.find("Unable to connect to the server") != std::string::npos ||
      o.find("i/o timeout") != std::string::npos)
    return Error(Errc::unavailable, msg);
  return Error(Errc::failed_precondition, msg);
}

Result<json> Kubectl::get_json(std::vector<std::string> args,
                               std::chrono::milliseconds timeout) const {
  args.push_back("-o");
  args.push_back("json");
  auto r = run(args, timeout);
  if (!r) return r.error();
  if (!r->ok()) return classify_kube_failure("kubectl", *r);
  // kubectl may print warnings on stderr before the document (the output is
  // interleaved): parse from the first '{'.
  auto start = r->output.find('{');
  if (start == std::string::npos)
    return Error(Errc::protocol, "kubectl printed no JSON: " + r->tail(2));
  auto j = json::parse(r->output.substr(start), nullptr, false);
  if (j.is_discarded()) return Error(Errc::protocol, "kubectl printed JSON that does not parse");
  return j;
}

Result<std::vector<KubeNode>> Kubectl::nodes(std::chrono::milliseconds timeout) const {
  auto j = get_json({"get", "nodes"}, timeout);
  if (!j) return j.error();
  return parse_node_list(*j);
}

Result<std::vector<KubePod>> Kubectl::pods(std::chrono::milliseconds timeout,
                                           const std::string& ns) const {
  std::vector<std::string> args = {"get", "pods"};
  if (ns.empty())
    args.push_back("-A");
  else
    args.insert(args.end(), {"-n", ns});
  auto j = get_json(args, timeout);
  if (!j) return j.error();
  return parse_pod_list(*j);
}

std::optional<std::string> rke2_running_service_cidr(const GuestEnv& env) {
  auto text = read_file(env.path("/var/lib/rancher/rke2/agent/pod-manifests/kube-apiserver.yaml"));
  if (!text) return std::nullopt;
  static const std::regex re(R"(--service-cluster-ip-range=([0-9./]+))");
  std::smatch m;
  if (std::regex_search(*text, m, re)) return m[1].str();
  return std::nullopt;
}

}  // namespace factory::agent
