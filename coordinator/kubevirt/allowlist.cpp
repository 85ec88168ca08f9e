#include "coordinator/kubevirt/allowlist.hpp"

#include <algorithm>
#include <map>
#include <regex>

#include "coordinator/host/gpu_operator.hpp"

namespace factory::kubevirt {

using nlohmann::json;

namespace {

std::string upper(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string describe(const std::string& selector, const std::string& resource) {
  return selector + " as " + resource;
}

// The CR's list, tolerating a CR that has none of the path yet.
json current_entries(const json& cr) {
  const json* p = &cr;
  for (const char* k : {"spec", "configuration", "permittedHostDevices", "pciHostDevices"}) {
    if (!p->is_object() || !p->contains(k)) return json::array();
    p = &(*p)[k];
  }
  return p->is_array() ? *p : json::array();
}

long long quantity(const json& v) {
  if (v.is_number_integer()) return v.get<long long>();
  if (!v.is_string()) return 0;
  const std::string& s = v.get_ref<const std::string&>();
  try {
    size_t used = 0;
    long long n = std::stoll(s, &used);
    if (used == s.size()) return n;
    if (s.substr(used) == "k") return n * 1000;  // "1k": how devices.kubevirt.io/kvm reads
  } catch (const std::exception&) {
  }
  return 0;
}

// How many cards of the model the wait can expect to see advertised, and how
// many there are in all.
size_t can_appear(const GpuModel& m) {
  return m.from_inventory ? m.on_vfio.size() : 1;
}
size_t wanted(const GpuModel& m) {
  return m.from_inventory ? m.on_vfio.size() + m.not_on_vfio.size() : 1;
}

}  // namespace

Result<std::vector<GpuModel>> models_from_inventory(const host::HostInventory& inv) {
  std::map<std::string, GpuModel> by_id;
  for (const auto& g : inv.nvidia) {
    // The card's other functions (HD audio, USB-C) go along with it but are
    // not what a VM asks for: only display functions are allowlisted.
    if (!g.fn.is_display()) continue;
    std::string sel = upper(g.fn.vendor_id() + ":" + g.fn.device_id());
    auto& m = by_id[sel];
    m.pci_vendor_selector = sel;
    m.resource_name = g.resource.name;
    m.note = g.resource.note;
    m.from_inventory = true;
    if (g.name) m.name = *g.name;
    if (g.fn.driver == "vfio-pci")
      m.on_vfio.push_back(g.fn.address.str());
    else
      m.not_on_vfio.push_back(g.fn.address.str() + " (" +
                              (g.fn.driver.empty() ? "no driver" : g.fn.driver) + ")");
  }
  if (by_id.empty())
    return Error(Errc::failed_precondition,
                 "no NVIDIA GPU in this host's PCI inventory: run this on the GPU node, or pass "
                 "--pci-id 10de:27b8 --resource-name nvidia.com/AD104GL_L4");
  std::vector<GpuModel> out;
  for (auto& [_, m] : by_id) out.push_back(std::move(m));
  return out;
}

Result<GpuModel> model_from_flags(const std::string& pci_id, const std::string& resource_name) {
  static const std::regex id_re("^[0-9a-fA-F]{4}:[0-9a-fA-F]{4}$");
  // An extended resource name: a DNS subdomain, "/", a qualified name.
  static const std::regex res_re(
      "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/"
      "[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$");
  if (!std::regex_match(pci_id, id_re))
    return Error(Errc::invalid_argument, "--pci-id '" + pci_id +
                                             "' is not VENDOR:DEVICE in hex, e.g. 10de:27b8 "
                                             "(lspci -nn shows it)");
  if (!std::regex_match(resource_name, res_re) || resource_name.size() > 253 + 1 + 63)
    return Error(Errc::invalid_argument,
                 "--resource-name '" + resource_name +
                     "' is not a Kubernetes resource name like nvidia.com/AD104GL_L4");
  GpuModel m;
  m.pci_vendor_selector = upper(pci_id);
  m.resource_name = resource_name;
  return m;
}

Result<AllowlistMerge> merge_allowlist(const json& current, const std::vector<GpuModel>& models) {
  AllowlistMerge out;
  out.entries = current.is_array() ? current : json::array();
  for (const auto& m : models) {
    bool listed = false;
    for (auto& e : out.entries) {
      if (!e.is_object()) continue;
      std::string sel = upper(e.value("pciVendorSelector", ""));
      std::string res = e.value("resourceName", "");
      if (sel != m.pci_vendor_selector) continue;
      if (res != m.resource_name)
        return Error(Errc::failed_precondition,
                     "the KubeVirt CR already allowlists " + sel + " as " + res + ", not " +
                         m.resource_name +
                         ": KubeVirt would advertise the same cards under two names; remove that "
                         "entry, or pass --resource-name " +
                         res);
      listed = true;
      if (m.external && !e.value("externalResourceProvider", false)) {
        e["externalResourceProvider"] = true;
        out.updated.push_back(describe(sel, res));
        continue;
      }
      if (!m.external && e.value("externalResourceProvider", false))
        out.warnings.push_back(describe(sel, res) +
                               " is left to an external device plugin (externalResourceProvider: "
                               "true): KubeVirt will not advertise it itself");
    }
    std::string d = describe(m.pci_vendor_selector, m.resource_name);
    if (listed) {
      if (std::find(out.present.begin(), out.present.end(), d) == out.present.end() &&
          std::find(out.updated.begin(), out.updated.end(), d) == out.updated.end())
        out.present.push_back(d);
      continue;
    }
    // Without externalResourceProvider, KubeVirt's own device plugin
    // advertises exactly the functions bound to vfio-pci; with it, KubeVirt
    // only permits what another plugin (the GPU Operator's) advertises.
    json entry = {{"pciVendorSelector", m.pci_vendor_selector}, {"resourceName", m.resource_name}};
    if (m.external) entry["externalResourceProvider"] = true;
    out.entries.push_back(entry);
    out.added.push_back(d);
  }
  return out;
}

Result<AllowlistResult> ensure_allowlisted(kube::KubeClient& client, const std::string& ns,
                                           const std::vector<GpuModel>& models, bool dry_run) {
  for (int attempt = 0;; ++attempt) {
    auto crs = client.list(kube::kKubeVirt, ns);
    if (!crs) return crs.error();
    const json& items = (*crs)["items"];
    if (items.empty())
      return Error(Errc::failed_precondition,
                   "no KubeVirt CR in namespace " + ns +
                       ": install KubeVirt first (runbook step 3), or pass --namespace");
    if (items.size() > 1)
      return Error(Errc::failed_precondition,
                   "namespace " + ns + " has " + std::to_string(items.size()) +
                       " KubeVirt CRs; KubeVirt honours only one: remove the others");
    const json& cr = items[0];
    AllowlistResult res;
    res.cr_namespace = ns;
    res.cr_name = cr["metadata"].value("name", "");
    res.dry_run = dry_run;
    auto merged = merge_allowlist(current_entries(cr), models);
    if (!merged) return merged.error();
    res.merge = std::move(*merged);
    if (!res.merge.changed()) return res;
    json patch = {
        {"metadata", {{"resourceVersion", cr["metadata"].value("resourceVersion", "")}}},
        {"spec",
         {{"configuration", {{"permittedHostDevices", {{"pciHostDevices", res.merge.entries}}}}}}}};
    auto written =
        client.merge_patch(kube::kKubeVirt, ns, res.cr_name, patch, {.dry_run = dry_run});
    if (written) return res;
    // Someone changed the CR between our read and write: read it again.
    if (written.error().code == Errc::conflict && attempt < 5) continue;
    return written.error();
  }
}

Result<AdvertiseReport> wait_for_advertised(kube::KubeClient& client,
                                            const std::string& cr_namespace,
                                            const std::vector<GpuModel>& models,
                                            std::chrono::milliseconds timeout) {
  std::map<std::string, json> allocatable;  // node -> status.allocatable
  auto best = [&](const std::string& resource) {
    long long n = 0;
    for (const auto& [_, a] : allocatable)
      if (a.contains(resource)) n = std::max(n, quantity(a[resource]));
    return n;
  };
  auto settled = [&] {
    for (const auto& m : models)
      if (best(m.resource_name) < static_cast<long long>(can_appear(m))) return false;
    return true;
  };
  auto on_event = [&](const kube::WatchEvent& e) {
    std::string node = e.object["metadata"].value("name", "");
    if (e.type == "DELETED")
      allocatable.erase(node);
    else
      allocatable[node] =
          e.object.value("status", json::object()).value("allocatable", json::object());
    return !settled();
  };
  auto st = client.watch(kube::kNode, "", {.timeout = timeout}, on_event);
  if (!st && st.error().code != Errc::timeout) return st.error();

  AdvertiseReport report;
  report.satisfied = true;
  for (const auto& [node, a] : allocatable)
    for (const auto& m : models)
      if (a.contains(m.resource_name) && quantity(a[m.resource_name]) > 0) {
        bool dup = false;
        for (const auto& r : report.nodes) dup |= r.node == node && r.resource == m.resource_name;
        if (!dup) report.nodes.push_back({node, m.resource_name, quantity(a[m.resource_name])});
      }

  // Why a model is short: the CR (re-read: someone may have reverted it),
  // the cards' drivers on this host, or KubeVirt not having caught up.
  json cr_entries = json::array();
  if (auto crs = client.list(kube::kKubeVirt, cr_namespace); crs && !(*crs)["items"].empty())
    cr_entries = current_entries((*crs)["items"][0]);
  for (const auto& m : models) {
    long long have = best(m.resource_name);
    if (have >= static_cast<long long>(wanted(m))) continue;
    report.satisfied = false;
    std::string head = m.resource_name + ": " + std::to_string(have) + " advertised";
    if (m.from_inventory) head += ", " + std::to_string(wanted(m)) + " on this host";
    bool in_cr = false, external = false;
    for (const auto& e : cr_entries)
      if (upper(e.value("pciVendorSelector", "")) == m.pci_vendor_selector &&
          e.value("resourceName", "") == m.resource_name) {
        in_cr = true;
        external = e.value("externalResourceProvider", false);
      }
    if (!in_cr) {
      report.problems.push_back(head + ": the KubeVirt CR does not list " +
                                describe(m.pci_vendor_selector, m.resource_name) +
                                " (not applied, or reverted since)");
      continue;
    }
    if (external) {
      // The GPU Operator's plugin names cards from its own pci.ids: the name
      // a node advertises may not be the one the CR lists.
      bool mismatch = false;
      for (const auto& [node, a] : allocatable) {
        json n = {{"status", {{"allocatable", a}}}};
        if (auto d = host::gpu_operator::resource_name_mismatch(
                node, m.pci_vendor_selector, m.resource_name, host::gpu_operator::advertised(n),
                "the KubeVirt CR")) {
          report.problems.push_back(head + ": " + d->line());
          mismatch = true;
          break;
        }
      }
      if (mismatch) continue;
      report.problems.push_back(head +
                                ": the CR leaves it to an external device plugin "
                                "(externalResourceProvider: true) and no node advertises it: is "
                                "the GPU Operator's sandbox device plugin running on the node "
                                "(factory host bind --via gpu-operator waits for it)?");
      continue;
    }
    if (!m.not_on_vfio.empty()) {
      std::string cards, addrs;
      for (const auto& c : m.not_on_vfio) {
        cards += (cards.empty() ? "" : ", ") + c;
        addrs += (addrs.empty() ? "" : " ") + c.substr(0, c.find(' '));
      }
      report.problems.push_back(head + ": not on vfio-pci: " + cards +
                                " (factory host bind --pci " + addrs + ")");
      if (have >= static_cast<long long>(m.on_vfio.size())) continue;
    }
    if (m.from_inventory)
      report.problems.push_back(head +
                                ": the cards on vfio-pci are not advertised yet: is "
                                "virt-handler running on the node (kubectl -n kubevirt get "
                                "pods)?");
    else
      report.problems.push_back(head + ": no node advertises it: is every " +
                                m.pci_vendor_selector +
                                " card on vfio-pci on the GPU node (factory host check), and is "
                                "virt-handler running there?");
  }
  return report;
}

}  // namespace factory::kubevirt
