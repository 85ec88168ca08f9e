#include "coordinator/kubevirt/kubevirt_provider.hpp"

#include <spdlog/spdlog.h>

#include <filesystem>

#include "common/pki.hpp"
#include "contract/mig_cards.hpp"
#include "coordinator/kubevirt/host_ranges.hpp"

namespace factory::kubevirt {

using nlohmann::json;
using tenants::kManagedByLabel;
using tenants::kManagedByValue;
using tenants::kTenantLabel;
using tenants::RestartOutcome;
using tenants::RestartRequest;
using tenants::VmObject;
using tenants::VmObservation;
using tenants::VmSpec;

namespace {

const kube::Kind& kind_of(const std::string& kind) {
  static const std::vector<const kube::Kind*> kinds = {&kube::kNamespace,
                                                       &kube::kSecret,
                                                       &kube::kService,
                                                       &kube::kVirtualMachine,
                                                       &kube::kVirtualMachineInstance,
                                                       &kube::kDataVolume,
                                                       &kube::kPersistentVolumeClaim};
  for (auto* k : kinds)
    if (k->kind == kind) return *k;
  return kube::kSecret;  // unreachable: callers pass the kinds above
}

// Whether an object carries Factory's labels for this tenant.
bool owned_by(const json& obj, const std::string& tenant) {
  const json labels =
      obj.contains("metadata") ? obj["metadata"].value("labels", json::object()) : json::object();
  return labels.value(kManagedByLabel, "") == kManagedByValue &&
         labels.value(kTenantLabel, "") == tenant;
}

long long parse_count(const json& q) {
  // Extended resources are whole numbers ("2"); anything else counts as none.
  if (q.is_number_integer()) return q.get<long long>();
  if (!q.is_string()) return 0;
  const std::string s = q.get<std::string>();
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) return 0;
  try {
    return std::stoll(s);
  } catch (...) {
    return 0;
  }
}

// GPUs a VM asks for, by resource: gpus[] and hostDevices[] of its template.
std::map<std::string, int> vm_gpu_requests(const json& vm) {
  std::map<std::string, int> out;
  const json devices = vm.value("/spec/template/spec/domain/devices"_json_pointer, json::object());
  for (const char* list : {"gpus", "hostDevices"}) {
    if (!devices.contains(list) || !devices[list].is_array()) continue;
    for (const auto& d : devices[list]) {
      std::string name = d.value("deviceName", "");
      if (!name.empty()) out[name]++;
    }
  }
  return out;
}

// A VM that holds (or will hold) its devices: not being deleted, and set to run.
bool vm_holds_devices(const json& vm) {
  const json md = vm.value("metadata", json::object());
  if (md.contains("deletionTimestamp") && !md["deletionTimestamp"].is_null()) return false;
  const json spec = vm.value("spec", json::object());
  std::string strategy = spec.value("runStrategy", "");
  if (strategy.empty()) strategy = spec.value("running", false) ? "Always" : "Halted";
  return strategy != "Halted";
}

std::string vm_user(const json& vm) {
  const json md = vm.value("metadata", json::object());
  const json labels = md.value("labels", json::object());
  if (labels.value(kManagedByLabel, "") == kManagedByValue && labels.contains(kTenantLabel))
    return labels.value(kTenantLabel, "");
  return md.value("namespace", "") + "/" + md.value("name", "");
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

}  // namespace

Error ssh_service_error(const Error& e, const VmSpec& spec) {
  if (e.message.find("provided port is already allocated") != std::string::npos)
    return Error(Errc::invalid_argument,
                 "node port " + std::to_string(spec.ssh_node_port) +
                     " is already allocated to another Service: pick another --ssh-node-port, "
                     "or leave it out and Kubernetes picks a free one");
  if (e.message.find("provided port is not in the valid range") != std::string::npos)
    return Error(Errc::invalid_argument,
                 "node port " + std::to_string(spec.ssh_node_port) +
                     " is outside the cluster's node port range: " + e.message);
  return e.with_context("Service " + spec.ns + "/" + ssh_service_name(spec.name));
}

std::vector<std::string> permitted_gpu_resources(const json& kubevirt_list) {
  std::vector<std::string> out;
  for (const auto& kv : kubevirt_list.value("items", json::array())) {
    const json list = kv.value(
        "/spec/configuration/permittedHostDevices/pciHostDevices"_json_pointer, json::array());
    if (!list.is_array()) continue;
    for (const auto& d : list) {
      if (d.value("externalResourceProvider", false)) continue;
      std::string name = d.value("resourceName", "");
      if (!name.empty() && std::find(out.begin(), out.end(), name) == out.end())
        out.push_back(name);
    }
  }
  return out;
}

Result<std::vector<std::string>> mig_capable_resources(const std::vector<std::string>& candidates,
                                                       const json& kubevirt_list,
                                                       const std::string& tier) {
  // The card a resource names is the allowlist entry's pciVendorSelector:
  // the host's PCI facts, as `factory kubevirt allowlist` wrote them.
  std::map<std::string, std::string> selector;
  for (const auto& kv : kubevirt_list.value("items", json::array())) {
    const json list = kv.value(
        "/spec/configuration/permittedHostDevices/pciHostDevices"_json_pointer, json::array());
    if (!list.is_array()) continue;
    for (const auto& d : list)
      if (d.is_object() && d.contains("resourceName") && d["resourceName"].is_string())
        selector.emplace(d["resourceName"].get<std::string>(), d.value("pciVendorSelector", ""));
  }
  std::vector<std::string> out, refused;
  for (const auto& r : candidates) {
    auto it = selector.find(r);
    if (it == selector.end()) {
      refused.push_back(r + " is not in the KubeVirt CR's allowlist, so its card is unknown");
      continue;
    }
    auto id = parse_pci_selector(it->second);
    if (id && mig_chip(id->vendor, id->device)) {
      out.push_back(r);
      continue;
    }
    refused.push_back(r + " (" + (it->second.empty() ? "no pciVendorSelector" : it->second) +
                      ") has no MIG");
  }
  if (out.empty())
    return Error(Errc::failed_precondition,
                 "tier " + tier + " needs a MIG-capable GPU (A30, A100, H100, H200, B200): " +
                     join(refused, "; ") +
                     "; allowlist a MIG-capable card or choose a tier without MIG");
  return out;
}

GpuCapacity gpu_capacity(const std::string& resource, const json& node_list, const json& vm_list,
                         const std::string& skip_ns, const std::string& skip_name) {
  GpuCapacity c;
  c.resource = resource;
  for (const auto& n : node_list.value("items", json::array())) {
    const json alloc = n.value("/status/allocatable"_json_pointer, json::object());
    if (alloc.contains(resource)) c.allocatable += parse_count(alloc[resource]);
  }
  for (const auto& vm : vm_list.value("items", json::array())) {
    const json md = vm.value("metadata", json::object());
    if (md.value("namespace", "") == skip_ns && md.value("name", "") == skip_name) continue;
    if (!vm_holds_devices(vm)) continue;
    auto req = vm_gpu_requests(vm);
    auto it = req.find(resource);
    if (it == req.end()) continue;
    c.in_use += it->second;
    c.users.push_back(vm_user(vm));
  }
  std::sort(c.users.begin(), c.users.end());
  return c;
}

std::string capacity_shortfall(const GpuCapacity& c, int wanted) {
  std::string head = c.free() <= 0 ? "no free " + c.resource
                                   : "only " + std::to_string(c.free()) + " free " + c.resource +
                                         " (want " + std::to_string(wanted) + ")";
  std::string out = head + ": " + std::to_string(c.allocatable) + " allocatable";
  if (c.in_use > 0) out += ", " + std::to_string(c.in_use) + " in use by " + join(c.users, ", ");
  if (c.allocatable == 0)
    out +=
        " (no node advertises it: are the cards on vfio-pci and allowlisted? see `factory "
        "kubevirt allowlist`)";
  return out;
}

KubeVirtProvider::KubeVirtProvider(kube::AccessOptions access,
                                   std::chrono::milliseconds request_timeout)
    : access_(std::move(access)), timeout_(request_timeout) {}

Result<kube::KubeClient> KubeVirtProvider::client() const {
  // kube::resolve_access speaks to a CLI user (--kubeconfig); here the file
  // comes from the coordinator's config, so say where to fix it.
  std::error_code ec;
  if (!access_.kubeconfig.empty() && !std::filesystem::exists(access_.kubeconfig, ec))
    return Error(Errc::failed_precondition,
                 "the coordinator's kube.kubeconfig " + access_.kubeconfig +
                     " does not exist: fix kube.kubeconfig in its config (\"\" = ~/.kube/config "
                     "or the pod's service account)");
  auto access = kube::resolve_access(access_);
  if (!access) return access.error().with_context("Kubernetes access (coordinator config kube:)");
  return kube::KubeClient(std::move(*access), timeout_);
}

Result<std::vector<ranges::Fact>> KubeVirtProvider::host_ranges() {
  auto c = client();
  if (!c) return c.error();
  auto facts = read_host_ranges(*c);
  if (!facts) return facts;
  // The VM's interface is bound with masquerade (objects.cpp): the guest
  // sits on this network inside its pod.
  facts->push_back({"10.0.2.0/24", "KubeVirt masquerade network (the VM's interface binding)"});
  return facts;
}

Status KubeVirtProvider::preflight(VmSpec& spec) {
  auto c = client();
  if (!c) return c.error();

  // Objects of the tenant's names that someone else made are never taken over.
  const std::pair<const kube::Kind*, std::string> mine[] = {
      {&kube::kSecret, cloud_init_secret_name(spec.name)},
      {&kube::kVirtualMachine, spec.name},
      {&kube::kService, ssh_service_name(spec.name)},
      {&kube::kService, endpoint_service_name(spec.name)},
      {&kube::kSecret, api_key_secret_name(spec.name)}};
  for (const auto& [kind, name] : mine) {
    auto obj = c->get(*kind, spec.ns, name);
    if (!obj) {
      if (obj.error().code == Errc::not_found &&
          obj.error().message.find("does not serve") == std::string::npos)
        continue;
      return obj.error();
    }
    if (!owned_by(*obj, spec.name))
      return Error(Errc::already_exists, kind->kind + " " + spec.ns + "/" + name +
                                             " exists and was not made by Factory for tenant " +
                                             spec.name +
                                             ": remove it, or choose another tenant name");
  }

  if (spec.ssh_node_port != 0) {
    auto services = c->list(kube::kService, "");
    if (!services) return services.error();
    for (const auto& s : services->value("items", json::array())) {
      const json md = s.value("metadata", json::object());
      if (md.value("namespace", "") == spec.ns &&
          md.value("name", "") == ssh_service_name(spec.name))
        continue;
      for (const auto& p : s.value("/spec/ports"_json_pointer, json::array()))
        if (p.value("nodePort", 0) == spec.ssh_node_port)
          return Error(Errc::invalid_argument,
                       "node port " + std::to_string(spec.ssh_node_port) + " is taken by Service " +
                           md.value("namespace", "") + "/" + md.value("name", "") +
                           ": pick another --ssh-node-port, or leave it out and Kubernetes picks "
                           "a free one");
    }
  }

  if (spec.gpus <= 0) return {};
  std::vector<std::string> candidates;
  if (!spec.gpu_resource.empty() && !spec.needs_mig) {
    candidates.push_back(spec.gpu_resource);
  } else {
    auto kvs = c->list(kube::kKubeVirt, "");
    if (!kvs) return kvs.error().with_context("reading the KubeVirt CR's GPU allowlist");
    if (!spec.gpu_resource.empty())
      candidates.push_back(spec.gpu_resource);
    else
      candidates = permitted_gpu_resources(*kvs);
    if (candidates.empty())
      return Error(Errc::failed_precondition,
                   "tier " + spec.tier +
                       " takes any allowlisted GPU, but the KubeVirt CR allowlists none "
                       "(permittedHostDevices.pciHostDevices): run `factory kubevirt allowlist` "
                       "on the GPU host");
    if (spec.needs_mig) {
      auto mig = mig_capable_resources(candidates, *kvs, spec.tier);
      if (!mig) return mig.error();
      candidates = std::move(*mig);
    }
  }
  auto nodes = c->list(kube::kNode, "");
  if (!nodes) return nodes.error();
  auto vms = c->list(kube::kVirtualMachine, "");
  if (!vms) return vms.error();
  std::vector<std::string> short_of;
  for (const auto& r : candidates) {
    auto cap = gpu_capacity(r, *nodes, *vms, spec.ns, spec.name);
    if (cap.free() >= spec.gpus) {
      spec.gpu_resource = r;
      return {};
    }
    short_of.push_back(capacity_shortfall(cap, spec.gpus));
  }
  return Error(Errc::failed_precondition, join(short_of, "; "));
}

Result<bool> KubeVirtProvider::has_user_data(const VmSpec& spec) {
  auto c = client();
  if (!c) return c.error();
  auto s = c->get(kube::kSecret, spec.ns, cloud_init_secret_name(spec.name));
  if (s) return owned_by(*s, spec.name);
  if (s.error().code == Errc::not_found) return false;
  return s.error();
}

Result<std::string> KubeVirtProvider::api_key(const VmSpec& spec) {
  auto c = client();
  if (!c) return c.error();
  auto s = c->get(kube::kSecret, spec.ns, api_key_secret_name(spec.name));
  if (!s) {
    if (s.error().code == Errc::not_found) return std::string();
    return s.error();
  }
  if (!owned_by(*s, spec.name))
    return Error(Errc::already_exists, "Secret " + spec.ns + "/" + api_key_secret_name(spec.name) +
                                           " was not made by Factory for tenant " + spec.name);
  // stringData is write-only: the API server keeps the key base64 in data.
  const std::string b64 =
      s->value("/data"_json_pointer, json::object()).value(kApiKeyKey, std::string());
  auto key = pki::base64_decode(b64);
  if (!key)
    return key.error().with_context("Secret " + spec.ns + "/" + api_key_secret_name(spec.name));
  return *key;
}

Status KubeVirtProvider::put_api_key(const VmSpec& spec, const std::string& key,
                                     std::vector<VmObject>& created) {
  auto c = client();
  if (!c) return c.error();
  const std::string name = api_key_secret_name(spec.name);
  auto before = c->get(kube::kSecret, spec.ns, name);
  if (!before && before.error().code != Errc::not_found) return before.error();
  // Applied, not patched: the Secret holds exactly the one key, so the old
  // one is gone from it the moment this returns.
  auto applied = c->apply(api_key_secret(spec, key));
  if (!applied) return applied.error().with_context("Secret " + spec.ns + "/" + name);
  if (!before) created.push_back({"Secret", spec.ns, name});
  return {};
}

Status KubeVirtProvider::provision(const VmSpec& spec, const std::string& userdata,
                                   std::vector<VmObject>& created) {
  auto c = client();
  if (!c) return c.error();

  // The namespace is shared by tenants: created when missing, never applied
  // (its labels and quotas are the platform team's), never deleted by us.
  auto ns = c->get(kube::kNamespace, "", spec.ns);
  if (!ns) {
    if (ns.error().code != Errc::not_found) return ns.error();
    auto made = c->create(namespace_object(spec.ns));
    if (made) {
      created.push_back({"Namespace", "", spec.ns});
    } else if (made.error().code != Errc::already_exists) {
      return made.error().with_context("Namespace " + spec.ns);
    }
  }

  // The Secret: created only when this call rendered the user-data; one
  // that exists is the user-data the VM may already have booted with.
  if (!userdata.empty()) {
    const std::string name = cloud_init_secret_name(spec.name);
    auto made = c->create(cloud_init_secret(spec, userdata));
    if (made) {
      created.push_back({"Secret", spec.ns, name});
    } else if (made.error().code == Errc::already_exists) {
      // Appeared meanwhile: put our user-data (with the token just issued) in it.
      auto applied = c->apply(cloud_init_secret(spec, userdata));
      if (!applied) return applied.error().with_context("Secret " + spec.ns + "/" + name);
    } else {
      return made.error().with_context("Secret " + spec.ns + "/" + name);
    }
  }

  // VirtualMachine and Service by server-side apply: a re-run converges them
  // to what the spec says, and creates them when missing.
  struct Step {
    const kube::Kind* kind;
    std::string name;
    json obj;
  };
  std::vector<Step> steps = {{&kube::kVirtualMachine, spec.name, virtual_machine(spec)}};
  if (spec.ssh_service)
    steps.push_back({&kube::kService, ssh_service_name(spec.name), ssh_service(spec)});
  if (spec.endpoint_port != 0)
    steps.push_back({&kube::kService, endpoint_service_name(spec.name), endpoint_service(spec)});
  for (const auto& s : steps) {
    auto before = c->get(*s.kind, spec.ns, s.name);
    if (!before && before.error().code != Errc::not_found) return before.error();
    auto applied = c->apply(s.obj);
    if (!applied) {
      if (s.kind == &kube::kService && s.name == ssh_service_name(spec.name))
        return ssh_service_error(applied.error(), spec);
      return applied.error().with_context(s.kind->kind + " " + spec.ns + "/" + s.name);
    }
    if (!before) created.push_back({s.kind->kind, spec.ns, s.name});
  }
  return {};
}

std::vector<std::pair<VmObject, Error>> KubeVirtProvider::remove(
    const std::vector<VmObject>& objects) {
  std::vector<std::pair<VmObject, Error>> failed;
  auto c = client();
  for (auto it = objects.rbegin(); it != objects.rend(); ++it) {
    if (!c) {
      failed.emplace_back(*it, c.error());
      continue;
    }
    auto st = kube::ignore_not_found(c->remove(kind_of(it->kind), it->ns, it->name));
    if (!st.ok()) failed.emplace_back(*it, st.error());
  }
  return failed;
}

Result<std::vector<VmObject>> KubeVirtProvider::destroy(const std::string& tenant,
                                                        const std::string& ns) {
  auto c = client();
  if (!c) return c.error();
  std::vector<VmObject> deleted;
  auto del = [&](const kube::Kind& kind, const std::string& ons,
                 const std::string& name) -> Status {
    auto st = c->remove(kind, ons, name);
    if (st.ok()) {
      deleted.push_back({kind.kind, ons, name});
      return {};
    }
    if (st.error().code == Errc::not_found) return {};
    return st.error().with_context("delete " + kind.kind + " " + ons + "/" + name);
  };
  // The known names first, the Service (the way in) before the VM, the
  // Secret (the token) last; deleting the VM lets Kubernetes collect its
  // VMI and DataVolume, which are named here too in case it does not.
  const std::pair<const kube::Kind*, std::string> known[] = {
      {&kube::kService, ssh_service_name(tenant)},
      {&kube::kService, endpoint_service_name(tenant)},
      {&kube::kVirtualMachine, tenant},
      {&kube::kVirtualMachineInstance, tenant},
      {&kube::kDataVolume, root_volume_name(tenant)},
      {&kube::kPersistentVolumeClaim, root_volume_name(tenant)},
      {&kube::kSecret, cloud_init_secret_name(tenant)},
      {&kube::kSecret, api_key_secret_name(tenant)}};
  for (const auto& [kind, name] : known) {
    // Only what Factory made: a same-named object of someone else stays.
    auto obj = c->get(*kind, ns, name);
    if (!obj) {
      if (obj.error().code == Errc::not_found) continue;
      return obj.error();
    }
    const json owners = obj->value("/metadata/ownerReferences"_json_pointer, json::array());
    bool owned_by_our_vm = false;
    for (const auto& o : owners)
      if (o.value("kind", "") == "VirtualMachine" && o.value("name", "") == tenant)
        owned_by_our_vm = true;
    if (!owned_by(*obj, tenant) && !owned_by_our_vm) continue;
    if (auto st = del(*kind, ns, name); !st.ok()) return st.error();
  }
  // Then anything else carrying the tenant's labels, in any namespace.
  for (const auto* kind : {&kube::kService, &kube::kVirtualMachine, &kube::kVirtualMachineInstance,
                           &kube::kDataVolume, &kube::kPersistentVolumeClaim, &kube::kSecret}) {
    auto list = c->list(*kind, "", {tenant_selector(tenant), ""});
    if (!list) {
      // A cluster without CDI has no DataVolumes to leave behind.
      if (list.error().code == Errc::not_found) continue;
      return list.error();
    }
    for (const auto& o : list->value("items", json::array())) {
      const json md = o.value("metadata", json::object());
      if (auto st = del(*kind, md.value("namespace", ""), md.value("name", "")); !st.ok())
        return st.error();
    }
  }
  return deleted;
}

Result<VmObservation> KubeVirtProvider::observe(const std::string& tenant, const std::string& ns) {
  auto c = client();
  if (!c) return c.error();
  VmObservation o;
  o.provider = "kubevirt";
  auto vm = c->get(kube::kVirtualMachine, ns, tenant);
  if (!vm) {
    if (vm.error().code != Errc::not_found) return vm.error();
    return o;
  }
  o.exists = true;
  o.status = vm->value("/status/printableStatus"_json_pointer, std::string());
  for (const auto& cond : vm->value("/status/conditions"_json_pointer, json::array()))
    if (cond.value("reason", "") == "Unschedulable") o.reason = cond.value("message", "");
  auto vmi = c->get(kube::kVirtualMachineInstance, ns, tenant);
  if (vmi) {
    o.phase = vmi->value("/status/phase"_json_pointer, std::string());
    o.instance = vmi->value("/metadata/uid"_json_pointer, std::string());
    o.node = vmi->value("/status/nodeName"_json_pointer, std::string());
    // virt-controller's record of when the VMI entered each phase; the
    // latest entry of a phase wins.
    for (const auto& t :
         vmi->value("/status/phaseTransitionTimestamps"_json_pointer, json::array())) {
      if (!t.is_object()) continue;
      auto text = [&t](const char* k) {
        auto it = t.find(k);
        return it != t.end() && it->is_string() ? it->get<std::string>() : std::string();
      };
      const std::string p = text("phase"), at = text("phaseTransitionTimestamp");
      if (p == "Running") o.running_since = at;
      if ((p == "Succeeded" || p == "Failed") && (o.phase == "Succeeded" || o.phase == "Failed"))
        o.stopped_at = at;
    }
    for (const auto& i : vmi->value("/status/interfaces"_json_pointer, json::array())) {
      o.ip = i.value("ipAddress", "");
      if (!o.ip.empty()) break;
    }
    for (const auto& cond : vmi->value("/status/conditions"_json_pointer, json::array()))
      if (cond.value("reason", "") == "Unschedulable" && o.reason.empty())
        o.reason = cond.value("message", "");
  } else if (vmi.error().code != Errc::not_found) {
    return vmi.error();
  }
  auto svc = c->get(kube::kService, ns, ssh_service_name(tenant));
  if (svc) {
    for (const auto& p : svc->value("/spec/ports"_json_pointer, json::array()))
      if (p.value("name", "") == "ssh" || o.ssh_node_port == 0)
        o.ssh_node_port = p.value("nodePort", 0);
  } else if (svc.error().code != Errc::not_found) {
    return svc.error();
  }
  auto ep = c->get(kube::kService, ns, endpoint_service_name(tenant));
  if (ep) {
    for (const auto& p : ep->value("/spec/ports"_json_pointer, json::array()))
      if (p.value("name", "") == "https") o.endpoint_node_port = p.value("nodePort", 0);
  } else if (ep.error().code != Errc::not_found) {
    return ep.error();
  }
  return o;
}

namespace {

// Where `live` does not hold what `want` says: every key of an object,
// every element of a list (same length), every scalar equal. The first
// difference as "path is X, not Y"; nullopt when `live` holds all of it.
std::optional<std::string> first_difference(const json& want, const json& live,
                                            const std::string& path) {
  if (want.is_object()) {
    if (!live.is_object()) return path + " is " + live.dump() + ", not an object";
    for (const auto& [k, v] : want.items()) {
      if (!live.contains(k)) return path + "." + k + " is absent";
      if (auto d = first_difference(v, live[k], path + "." + k)) return d;
    }
    return std::nullopt;
  }
  if (want.is_array()) {
    if (!live.is_array() || live.size() != want.size())
      return path + " is " + live.dump() + ", not " + want.dump();
    for (std::size_t i = 0; i < want.size(); ++i)
      if (auto d = first_difference(want[i], live[i], path + "[" + std::to_string(i) + "]"))
        return d;
    return std::nullopt;
  }
  if (want != live) return path + " is " + live.dump() + ", not " + want.dump();
  return std::nullopt;
}

}  // namespace

Result<std::vector<std::string>> KubeVirtProvider::drift(const VmSpec& spec) {
  auto c = client();
  if (!c) return c.error();
  struct Want {
    const kube::Kind* kind;
    std::string name;
    json obj;  // null: only that it exists
  };
  std::vector<Want> wants = {{&kube::kSecret, cloud_init_secret_name(spec.name), nullptr},
                             {&kube::kVirtualMachine, spec.name, virtual_machine(spec)}};
  if (spec.ssh_service)
    wants.push_back({&kube::kService, ssh_service_name(spec.name), ssh_service(spec)});
  if (spec.endpoint_port != 0) {
    wants.push_back({&kube::kService, endpoint_service_name(spec.name), endpoint_service(spec)});
    wants.push_back({&kube::kSecret, api_key_secret_name(spec.name), nullptr});
  }
  std::vector<std::string> out;
  for (const auto& w : wants) {
    const std::string ref = w.kind->kind + " " + spec.ns + "/" + w.name;
    auto live = c->get(*w.kind, spec.ns, w.name);
    if (!live) {
      if (live.error().code != Errc::not_found) return live.error().with_context(ref);
      out.push_back(ref + " is missing");
      continue;
    }
    if (w.obj.is_null()) continue;
    for (const char* part : {"spec", "metadata"}) {
      json want = w.obj.value(part, json::object());
      if (std::string(part) == "metadata")
        want = {{"labels", want.value("labels", json::object())}};
      if (auto d = first_difference(want, live->value(part, json::object()), part)) {
        out.push_back(ref + ": " + *d);
        break;
      }
    }
  }
  return out;
}

// The VMI goes and virt-controller makes a new one, as for `virtctl
// restart`: the new virt-launcher pod asks the device plugin for its cards
// again. Deleting the VMI (a verb the coordinator's ClusterRole has) rather
// than the restart subresource keeps the account's rights as they are; for
// runStrategy Always the two end alike.
Result<RestartOutcome> KubeVirtProvider::restart(const VmSpec& spec, const RestartRequest& req) {
  auto c = client();
  if (!c) return c.error();
  const std::string where = spec.ns + "/" + spec.name;
  auto vm = c->get(kube::kVirtualMachine, spec.ns, spec.name);
  if (!vm) {
    if (vm.error().code == Errc::not_found)
      return Error(Errc::failed_precondition,
                   "tenant " + spec.name + " has no VirtualMachine " + where +
                       ": run the same `factory tenant create` again to make it");
    return vm.error().with_context("VirtualMachine " + where);
  }
  const std::string strategy =
      vm->value("/spec/runStrategy"_json_pointer, vm->value("/spec/running"_json_pointer, false)
                                                      ? std::string("Always")
                                                      : std::string("Halted"));
  RestartOutcome out;
  auto vmi = c->get(kube::kVirtualMachineInstance, spec.ns, spec.name);
  if (!vmi && vmi.error().code != Errc::not_found)
    return vmi.error().with_context("VirtualMachineInstance " + where);
  const std::string now = vmi ? vmi->value("/metadata/uid"_json_pointer, std::string()) : "";
  if (!req.from_instance.empty() && now != req.from_instance) {
    out.note = now.empty() ? "its VirtualMachineInstance " + where +
                                 " is gone already: virt-controller starts a new one"
                           : "its VirtualMachineInstance " + where + " was replaced already (" +
                                 req.from_instance + " -> " + now + ")";
    return out;
  }
  if (strategy != "Always")
    return Error(Errc::failed_precondition,
                 "VirtualMachine " + where + " has runStrategy " + strategy +
                     ", not Always (someone changed it): a restart would leave it stopped; start "
                     "it with `virtctl start " +
                     spec.name + " -n " + spec.ns + "`");
  if (now.empty()) {
    out.note = "no VirtualMachineInstance " + where +
               " runs now: virt-controller is starting one already (runStrategy Always)";
    return out;
  }
  out.note = "delete VirtualMachineInstance " + where + " (uid " + now +
             "): virt-controller starts a new one and KubeVirt's device plugin allocates its "
             "GPUs again from the cards it still advertises (a quarantined card is not among "
             "them)";
  if (req.dry_run) return out;
  if (auto st =
          kube::ignore_not_found(c->remove(kube::kVirtualMachineInstance, spec.ns, spec.name));
      !st.ok())
    return st.error().with_context("deleting VirtualMachineInstance " + where);
  out.restarted = true;
  return out;
}

}  // namespace factory::kubevirt

// ---- host maintenance ----

namespace factory::kubevirt {

namespace {

// A merge patch that sets the VM's runStrategy (and drops `running`, the
// older field KubeVirt refuses beside it).
json run_strategy_patch(const char* strategy) {
  return {{"spec", {{"runStrategy", strategy}, {"running", nullptr}}}};
}

std::string vm_run_strategy(const json& vm) {
  std::string s = vm.value("/spec/runStrategy"_json_pointer, std::string());
  if (s.empty()) s = vm.value("/spec/running"_json_pointer, false) ? "Always" : "Halted";
  return s;
}

// Where a PersistentVolume's data lives when only one node can reach it: a
// `local` or `hostPath` volume, or node affinity on a host name.
std::string node_local_reason(const json& pv) {
  const json spec = pv.value("spec", json::object());
  if (spec.contains("local"))
    return "a local volume at " + spec["local"].value("path", std::string("?"));
  if (spec.contains("hostPath"))
    return "a hostPath volume at " + spec["hostPath"].value("path", std::string("?"));
  const json terms =
      pv.value("/spec/nodeAffinity/required/nodeSelectorTerms"_json_pointer, json::array());
  for (const auto& t : terms)
    for (const auto& e : t.value("matchExpressions", json::array()))
      if (e.value("key", "") == "kubernetes.io/hostname")
        return "node affinity to " + e.value("values", json::array()).dump();
  return "";
}

}  // namespace

Status KubeVirtProvider::set_node_schedulable(const std::string& node, bool schedulable) {
  auto c = client();
  if (!c) return c.error();
  // As `kubectl cordon` / `uncordon` set it; the node lifecycle controller
  // adds and removes the unschedulable taint itself.
  json patch = {{"spec", {{"unschedulable", schedulable ? json(nullptr) : json(true)}}}};
  auto r = c->merge_patch(kube::kNode, "", node, patch);
  if (!r) {
    if (r.error().code == Errc::not_found)
      return Error(Errc::not_found,
                   "the host cluster has no node " + node + ": `kubectl get nodes` lists them");
    return r.error().with_context(schedulable ? "uncordoning node " + node
                                              : "cordoning node " + node);
  }
  return {};
}

Result<tenants::Mobility> KubeVirtProvider::mobility(const VmSpec& spec) {
  auto c = client();
  if (!c) return c.error();
  tenants::Mobility m;
  // The root disk: a claim bound to a volume only its node reaches cannot
  // follow the VM.
  const std::string claim = root_volume_name(spec.name);
  auto pvc = c->get(kube::kPersistentVolumeClaim, spec.ns, claim);
  if (!pvc) {
    m.why_not = pvc.error().code == Errc::not_found
                    ? "its disk's claim " + spec.ns + "/" + claim +
                          " is not found: where its data lives cannot be told"
                    : "its disk's claim " + spec.ns + "/" + claim +
                          " could not be read: " + pvc.error().message;
    return m;
  }
  const std::string volume = pvc->value("/spec/volumeName"_json_pointer, std::string());
  if (volume.empty()) {
    m.why_not = "its disk's claim " + spec.ns + "/" + claim + " is not bound to a volume yet";
    return m;
  }
  auto pv = c->get(kube::kPersistentVolume, "", volume);
  if (!pv) {
    m.why_not = "its disk's volume " + volume + " could not be read: " + pv.error().message;
    return m;
  }
  if (std::string local = node_local_reason(*pv); !local.empty()) {
    m.why_not =
        "its disk is on node-local storage (PersistentVolume " + volume + ": " + local + ")";
    return m;
  }
  // A free card of its resource on another node that takes new VMs.
  auto vmi = c->get(kube::kVirtualMachineInstance, spec.ns, spec.name);
  const std::string here =
      vmi ? vmi->value("/status/nodeName"_json_pointer, std::string()) : std::string();
  auto nodes = c->list(kube::kNode, "");
  if (!nodes) return nodes.error().with_context("listing nodes");
  auto vmis = c->list(kube::kVirtualMachineInstance, "");
  if (!vmis) return vmis.error().with_context("listing VirtualMachineInstances");
  std::map<std::string, int> used;  // node -> cards of the resource its VMIs hold
  for (const auto& i : vmis->value("items", json::array())) {
    const std::string n = i.value("/status/nodeName"_json_pointer, std::string());
    if (n.empty()) continue;
    auto req = vm_gpu_requests({{"spec", {{"template", {{"spec", i.value("spec", json())}}}}}});
    used[n] += req[spec.gpu_resource];
  }
  for (const auto& n : nodes->value("items", json::array())) {
    const std::string name = n.value("/metadata/name"_json_pointer, std::string());
    if (name == here || n.value("/spec/unschedulable"_json_pointer, false)) continue;
    const json alloc = n.value("/status/allocatable"_json_pointer, json::object());
    const long free =
        (alloc.contains(spec.gpu_resource) ? parse_count(alloc[spec.gpu_resource]) : 0) -
        used[name];
    if (free >= spec.gpus) {
      m.can_move = true;
      return m;
    }
  }
  m.why_not = "no other node that takes new VMs has " + std::to_string(spec.gpus) + " free " +
              spec.gpu_resource;
  return m;
}

Result<tenants::StopOutcome> KubeVirtProvider::stop(const VmSpec& spec) {
  auto c = client();
  if (!c) return c.error();
  const std::string where = spec.ns + "/" + spec.name;
  auto vm = c->get(kube::kVirtualMachine, spec.ns, spec.name);
  if (!vm) return vm.error().with_context("VirtualMachine " + where);
  tenants::StopOutcome out;
  if (vm_run_strategy(*vm) == "Halted") {
    out.note = "VirtualMachine " + where + " has runStrategy Halted already";
    return out;
  }
  // runStrategy Halted, as `virtctl stop` asks it: virt-controller shuts
  // the guest down through ACPI and waits its terminationGracePeriodSeconds
  // before the launcher pod is killed.
  if (auto r =
          c->merge_patch(kube::kVirtualMachine, spec.ns, spec.name, run_strategy_patch("Halted"));
      !r)
    return r.error().with_context("stopping VirtualMachine " + where);
  out.stopped = true;
  out.note = "VirtualMachine " + where +
             " set to runStrategy Halted: KubeVirt shuts the guest down (ACPI)";
  return out;
}

Status KubeVirtProvider::start(const VmSpec& spec) {
  auto c = client();
  if (!c) return c.error();
  const std::string where = spec.ns + "/" + spec.name;
  auto vm = c->get(kube::kVirtualMachine, spec.ns, spec.name);
  if (!vm) return vm.error().with_context("VirtualMachine " + where);
  if (vm_run_strategy(*vm) == "Always") return {};
  if (auto r =
          c->merge_patch(kube::kVirtualMachine, spec.ns, spec.name, run_strategy_patch("Always"));
      !r)
    return r.error().with_context("starting VirtualMachine " + where);
  return {};
}

}  // namespace factory::kubevirt
