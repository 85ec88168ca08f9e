#include "coordinator/host/gpu_operator.hpp"

#include <algorithm>
#include <filesystem>
#include <set>

#include "coordinator/host/host_state.hpp"
#include "coordinator/host/inventory.hpp"
#include "coordinator/host/sysfs.hpp"

namespace factory::host::gpu_operator {
namespace fs = std::filesystem;

namespace {

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

std::string str(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_string()) return "";
  return j[key].get<std::string>();
}

const json& at(const json& j, std::initializer_list<const char*> path) {
  static const json null_json;
  const json* p = &j;
  for (const char* k : path) {
    if (!p->is_object() || !p->contains(k)) return null_json;
    p = &(*p)[k];
  }
  return *p;
}

long long quantity(const json& v) {
  if (v.is_number_integer()) return v.get<long long>();
  if (!v.is_string()) return 0;
  try {
    size_t used = 0;
    const std::string& s = v.get_ref<const std::string&>();
    long long n = std::stoll(s, &used);
    return used == s.size() ? n : 0;
  } catch (const std::exception&) {
    return 0;
  }
}

std::string operand_of(const json& pod) {
  const json& labels = at(pod, {"metadata", "labels"});
  const std::string app = str(labels, "app"), name = str(labels, "name");
  if (app == "nvidia-sandbox-validator") return "sandbox-validator";
  if (name == "nvidia-vfio-manager" || app == "nvidia-vfio-manager") return "vfio-manager";
  if (app == "nvidia-sandbox-device-plugin-daemonset") return "sandbox-device-plugin";
  return "";
}

// A container that exited non-zero and is restarting (or waits to).
std::optional<FailingContainer> failing(const json& c) {
  FailingContainer f;
  f.container = str(c, "name");
  f.restarts = c.value("restartCount", 0);
  f.waiting_reason = str(at(c, {"state", "waiting"}), "reason");
  const json& term = at(c, {"state", "terminated"});
  const json& last = at(c, {"lastState", "terminated"});
  if (term.is_object() && term.value("exitCode", 0) != 0) f.last_exit = term.value("exitCode", 0);
  if (last.is_object() && f.last_exit == 0) f.last_exit = last.value("exitCode", 0);
  const bool backoff = f.waiting_reason == "CrashLoopBackOff";
  if (backoff || (f.last_exit != 0 && f.restarts > 0)) return f;
  return std::nullopt;
}

// The operator's own commands take one line each; a namespace it installed
// in is the one kubectl needs.
std::string logs_command(const OperandPod& p, const std::string& container) {
  return "kubectl -n " + p.ns + " logs " + p.name + " -c " + container + " --previous";
}

}  // namespace

// ---- this host ----

Diagnosis host_driver_loaded(const std::string& node, const std::vector<std::string>& gpus_on_it) {
  return {"host-driver-loaded",
          "the GPU Operator's vfio-manager skips node " + node +
              ": its host loads the NVIDIA driver" +
              (gpus_on_it.empty() ? std::string() : " (" + join(gpus_on_it, ", ") + " on nvidia)") +
              ", so k8s-driver-manager labels it " + std::string(kDriverDeployLabel) +
              "=pre-installed and exits without binding any GPU to vfio-pci",
          "remove the host's NVIDIA driver (apt-get purge 'nvidia-driver-*' or blacklist "
          "nvidia, nvidia_drm, nvidia_modeset, nvidia_uvm) and reboot, then run this again; or "
          "bind per card without the operator: factory host bind --pci ADDRESS"};
}

std::optional<std::string> host_node_name(const HostRoot& root) {
  for (const char* p : {"/proc/sys/kernel/hostname", "/etc/hostname"}) {
    auto v = read_attr(root, p);
    if (v && !v->empty()) return *v;
  }
  return std::nullopt;
}

Result<HostHandover> read_host(const HostRoot& root, const PciIds* ids) {
  PciBus bus(root);
  auto inv = take_inventory(bus, ids);
  if (!inv) return inv.error();
  HostHandover out;
  const auto persistenced = persistenced_process(root);
  std::vector<std::string> on_nvidia;
  for (const auto& g : inv->nvidia) {
    if (!g.fn.is_display()) continue;
    NodeGpu gpu;
    gpu.address = g.fn.address;
    gpu.id = g.fn.vendor_id() + ":" + g.fn.device_id();
    gpu.name = g.name.value_or("");
    gpu.driver = g.fn.driver;
    gpu.resource = g.resource;
    out.gpus.push_back(gpu);
    const std::string addr = g.fn.address.str();
    if (g.fn.driver == "nvidia") on_nvidia.push_back(addr);
    if (!g.fn.iommu_group) {
      out.in_use.push_back(addr +
                           " has no IOMMU group: the IOMMU is off, so no GPU can be passed "
                           "through here (see factory host check)");
      continue;
    }
    // vfio-manage binds the GPUs and nothing else: every other function of
    // the group must already be free, or KubeVirt fails the VM ("group not viable").
    std::set<PciAddress> card;
    for (const auto& f : inv->nvidia)
      if (f.fn.address.same_slot(g.fn.address)) card.insert(f.fn.address);
    GroupAnalysis ga = analyze_group(*inv, bus, *g.fn.iommu_group, card);
    if (!ga.blockers().empty()) out.in_use.push_back(addr + ": " + ga.blocker_text());
    if (g.fn.driver == "nvidia") {
      if (auto minor = nvidia_device_minor(root, g.fn.address)) {
        std::vector<std::string> users;
        for (const auto& p : nvidia_device_holders(root, *minor))
          users.push_back(p.comm + " (pid " + std::to_string(p.pid) + ")");
        if (!users.empty())
          out.in_use.push_back(addr + " is in use by the host: " + join(users, ", ") +
                               (users.size() == 1 ? " holds" : " hold") + " /dev/nvidia" +
                               std::to_string(*minor) + " open");
      } else if (persistenced) {
        out.in_use.push_back(addr + " is in use by the host: nvidia-persistenced (pid " +
                             std::to_string(persistenced->pid) + ") holds it");
      }
    }
  }
  std::error_code ec;
  if (!on_nvidia.empty() && fs::exists(root("/sys/module/nvidia"), ec))
    out.host_driver = host_driver_loaded(host_node_name(root).value_or("this host"), on_nvidia);
  return out;
}

// ---- the cluster ----

SandboxPolicy read_policy(const json& list) {
  SandboxPolicy p;
  const json& items = at(list, {"items"});
  if (!items.is_array() || items.empty()) return p;
  p.found = true;
  p.count = items.size();
  const json& cp = items[0];
  p.name = str(at(cp, {"metadata"}), "name");
  const json& sw = at(cp, {"spec", "sandboxWorkloads"});
  p.sandbox_enabled = sw.is_object() && sw.value("enabled", false);
  p.mode = str(sw, "mode").empty() ? "kubevirt" : str(sw, "mode");
  const json& vm = at(cp, {"spec", "vfioManager", "enabled"});
  p.vfio_manager_enabled = !vm.is_boolean() || vm.get<bool>();
  const json& dp = at(cp, {"spec", "sandboxDevicePlugin", "enabled"});
  p.device_plugin_enabled = !dp.is_boolean() || dp.get<bool>();
  return p;
}

std::optional<Diagnosis> policy_problem(const SandboxPolicy& p, const std::string& node,
                                        bool labelled) {
  const std::string patch =
      "kubectl patch clusterpolicy " + (p.name.empty() ? "cluster-policy" : p.name) +
      " --type merge -p '{\"spec\":{\"sandboxWorkloads\":{\"enabled\":true}}}'";
  if (!p.found)
    return Diagnosis{"no-cluster-policy",
                     "the host cluster has no ClusterPolicy (nvidia.com/v1): the GPU Operator is "
                     "not installed, or not through its ClusterPolicy",
                     "install it with sandbox workloads (helm install gpu-operator "
                     "nvidia/gpu-operator -n gpu-operator --create-namespace --set "
                     "sandboxWorkloads.enabled=true), or bind with driverctl: factory host bind "
                     "--pci ADDRESS"};
  if (p.count > 1)
    return Diagnosis{"several-cluster-policies",
                     "the host cluster has " + std::to_string(p.count) +
                         " ClusterPolicies and the GPU Operator honours only one",
                     "delete the others (kubectl get clusterpolicies)"};
  if (!p.sandbox_enabled) {
    if (labelled)
      return Diagnosis{
          "sandbox-workloads-off",
          "node " + node + " is labelled " + std::string(kWorkloadLabel) + "=" +
              std::string(kVmPassthrough) + " but ClusterPolicy " + p.name +
              " has sandboxWorkloads.enabled off, so the operator ignores the label and keeps "
              "the node's GPUs on containers",
          "enable sandbox workloads: " + patch};
    return Diagnosis{"sandbox-workloads-off",
                     "ClusterPolicy " + p.name +
                         " has sandboxWorkloads.enabled off: the operator would ignore the "
                         "node's " +
                         std::string(kWorkloadLabel) + " label",
                     "enable sandbox workloads first: " + patch};
  }
  if (p.mode != "kubevirt")
    return Diagnosis{"sandbox-mode-not-kubevirt",
                     "ClusterPolicy " + p.name + " runs sandbox workloads in mode " + p.mode +
                         ", which deploys the Kata device plugin, not KubeVirt's",
                     "set spec.sandboxWorkloads.mode to kubevirt"};
  if (!p.vfio_manager_enabled || !p.device_plugin_enabled)
    return Diagnosis{
        "sandbox-operand-off",
        "ClusterPolicy " + p.name + " has " +
            (!p.vfio_manager_enabled ? "vfioManager" : "sandboxDevicePlugin") +
            ".enabled false, so no one would " +
            (!p.vfio_manager_enabled ? "bind the GPUs to vfio-pci" : "advertise the GPUs"),
        "set it to true in the ClusterPolicy"};
  return std::nullopt;
}

json label_patch() {
  return {{"metadata", {{"labels", {{std::string(kWorkloadLabel), std::string(kVmPassthrough)}}}}}};
}

bool is_labelled(const json& node) {
  return str(at(node, {"metadata", "labels"}), std::string(kWorkloadLabel).c_str()) ==
         kVmPassthrough;
}

std::vector<OperandPod> read_operand_pods(const json& list) {
  std::vector<OperandPod> out;
  const json& items = at(list, {"items"});
  if (!items.is_array()) return out;
  for (const auto& pod : items) {
    OperandPod p;
    p.operand = operand_of(pod);
    if (p.operand.empty()) continue;
    p.ns = str(at(pod, {"metadata"}), "namespace");
    p.name = str(at(pod, {"metadata"}), "name");
    p.phase = str(at(pod, {"status"}), "phase");
    for (const auto& c : at(pod, {"status", "conditions"}).is_array()
                             ? at(pod, {"status", "conditions"})
                             : json::array())
      if (str(c, "type") == "Ready") p.ready = str(c, "status") == "True";
    const json& inits = at(pod, {"status", "initContainerStatuses"});
    const json& mains = at(pod, {"status", "containerStatuses"});
    size_t done = 0, total = inits.is_array() ? inits.size() : 0;
    bool init_failing = false;
    if (inits.is_array())
      for (const auto& c : inits) {
        if (auto f = failing(c); f && !p.failing) {
          p.failing = f;
          init_failing = true;
        }
        const json& t = at(c, {"state", "terminated"});
        if (t.is_object() && t.value("exitCode", 1) == 0) ++done;
      }
    if (!p.failing && mains.is_array())
      for (const auto& c : mains)
        if (auto f = failing(c); f && !p.failing) p.failing = f;
    if (init_failing)
      p.state = "Init:" + (p.failing->waiting_reason.empty() ? std::string("Error")
                                                             : p.failing->waiting_reason);
    else if (done < total)
      p.state = "Init:" + std::to_string(done) + "/" + std::to_string(total);
    else if (p.failing)
      p.state = p.failing->waiting_reason.empty() ? "Error" : p.failing->waiting_reason;
    else
      p.state = p.phase.empty() ? "Pending" : p.phase;
    out.push_back(std::move(p));
  }
  return out;
}

std::map<std::string, long long> advertised(const json& node) {
  std::map<std::string, long long> out;
  const json& alloc = at(node, {"status", "allocatable"});
  if (!alloc.is_object()) return out;
  for (const auto& [k, v] : alloc.items()) {
    if (k.rfind("nvidia.com/", 0) != 0 || k == "nvidia.com/gpu" ||
        k.rfind("nvidia.com/mig-", 0) == 0)
      continue;
    if (long long n = quantity(v); n > 0) out[k] = n;
  }
  return out;
}

std::string last_log_message(const std::string& log) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < log.size()) {
    size_t end = log.find('\n', start);
    if (end == std::string::npos) end = log.size();
    std::string l = log.substr(start, end - start);
    if (!l.empty() && l.find_first_not_of(" \t\r") != std::string::npos) lines.push_back(l);
    start = end + 1;
  }
  if (lines.empty()) return "";
  const std::string& l = lines.back();
  auto m = l.find("msg=\"");
  if (m == std::string::npos) return l;
  std::string out;
  for (size_t i = m + 5; i < l.size(); ++i) {
    if (l[i] == '\\' && i + 1 < l.size()) {
      out += l[++i];
      continue;
    }
    if (l[i] == '"') break;
    out += l[i];
  }
  return out;
}

std::optional<Diagnosis> diagnose(const Observation& o, const std::string& node) {
  const bool labelled = is_labelled(o.node);
  if (labelled) {
    if (auto d = policy_problem(o.policy, node, true)) return d;
  }
  auto log_of = [&](const OperandPod& p) -> std::string {
    if (!p.failing) return "";
    auto it = o.logs.find(p.name + "/" + p.failing->container);
    return it == o.logs.end() ? "" : it->second;
  };
  const bool preinstalled_label = str(at(o.node, {"metadata", "labels"}),
                                      std::string(kDriverDeployLabel).c_str()) == "pre-installed";
  for (const auto& p : o.pods) {
    if (p.operand != "vfio-manager" || !p.failing) continue;
    const std::string log = log_of(p);
    if (p.failing->container == "k8s-driver-manager" &&
        (preinstalled_label || log.find("pre-installed") != std::string::npos)) {
      Diagnosis d = host_driver_loaded(node, {});
      d.reason += " (" + p.name + ": " + p.state + ", " + std::to_string(p.failing->restarts) +
                  " restarts)";
      return d;
    }
    std::string msg = last_log_message(log);
    return Diagnosis{"vfio-manager-failing",
                     "the GPU Operator's vfio-manager on " + node + " fails in " +
                         p.failing->container + " (" + p.name + ", " +
                         std::to_string(p.failing->restarts) + " restarts" +
                         (msg.empty() ? std::string() : ": " + msg) + ")",
                     "see " + logs_command(p, p.failing->container)};
  }
  for (const auto& p : o.pods) {
    if (p.operand != "sandbox-validator" || !p.failing) continue;
    std::string msg = last_log_message(log_of(p));
    return Diagnosis{
        "sandbox-validator-crashloop",
        "the GPU Operator's sandbox validator on " + node + " is crash-looping in " +
            p.failing->container + " (" + p.name + ", " + std::to_string(p.failing->restarts) +
            " restarts, last exit " + std::to_string(p.failing->last_exit) + ")" +
            (msg.empty() ? std::string() : ": " + msg),
        p.failing->container == "vfio-pci-validation"
            ? "a GPU is not on vfio-pci: see why vfio-manager could not bind it (kubectl -n " +
                  p.ns + " logs -l " + std::string(kVfioManagerSelector) +
                  "; factory host check), and " + logs_command(p, p.failing->container)
            : "see " + logs_command(p, p.failing->container)};
  }
  return std::nullopt;
}

std::optional<Diagnosis> resource_name_mismatch(const std::string& node,
                                                const std::string& selector,
                                                const std::string& expected,
                                                const std::map<std::string, long long>& adv,
                                                const std::string& listed_in) {
  if (adv.count(expected)) return std::nullopt;
  std::vector<std::string> others;
  for (const auto& [name, n] : adv) others.push_back(name + " (" + std::to_string(n) + ")");
  if (others.empty()) return std::nullopt;
  const std::string other = adv.begin()->first;
  return Diagnosis{
      "resource-name-mismatch",
      (listed_in.empty() ? "this host's pci.ids names " + selector + " " + expected
                         : listed_in + " lists " + selector + " as " + expected) +
          ", but node " + node + " advertises " + join(others, ", ") +
          ": the operator's kubevirt-gpu-device-plugin names cards from the pci.ids in its "
          "image, not the host's",
      "use the node's name: factory kubevirt allowlist --pci-id " + selector + " --resource-name " +
          other +
          (listed_in.empty() ? std::string() : " (after removing the entry for " + expected + ")")};
}

}  // namespace factory::host::gpu_operator
