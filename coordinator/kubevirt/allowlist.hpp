#pragma once
// Runbook step 3's allowlist: KubeVirt offers a host PCI device to VMs only
// when its vendor:device is listed in the KubeVirt CR under
// spec.configuration.permittedHostDevices.pciHostDevices. With
// externalResourceProvider unset, KubeVirt's own device plugin (virt-handler)
// advertises every matching function that is on vfio-pci as an allocatable
// node resource, under the entry's resourceName. This is product knowledge
// (which cards, under which names), so it lives here and not in the
// Kubernetes client (coordinator/kube), which knows no product.
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "coordinator/host/inventory.hpp"
#include "coordinator/kube/client.hpp"

namespace factory::kubevirt {

// One card model to allowlist.
struct GpuModel {
  std::string pci_vendor_selector;  // "10DE:27B8": KubeVirt's form, upper case
  std::string resource_name;        // "nvidia.com/AD104GL_L4"
  // From the host inventory, when the command runs on the GPU node:
  bool from_inventory = false;
  std::string name;                      // "AD104GL [L4]"
  std::vector<std::string> on_vfio;      // addresses bound to vfio-pci
  std::vector<std::string> not_on_vfio;  // "0000:41:00.0 (nvidia)"
  std::string note;                      // why the resource name is a fallback, if it is
  // Advertised by another device plugin (the GPU Operator's
  // kubevirt-gpu-device-plugin, `factory host bind --via gpu-operator`), not
  // by virt-handler: the entry gets externalResourceProvider: true.
  bool external = false;
};

// The NVIDIA display functions on this host, grouped by model.
Result<std::vector<GpuModel>> models_from_inventory(const host::HostInventory& inv);
// --pci-id 10de:27b8 --resource-name nvidia.com/AD104GL_L4 (validated, normalised).
Result<GpuModel> model_from_flags(const std::string& pci_id, const std::string& resource_name);

// The pure part of the change: our models merged into the CR's current list.
// Entries Factory did not make stay as they are and where they are; a model
// already listed under the same resourceName is left alone; the same
// selector under another resourceName is refused (KubeVirt would advertise
// the same cards twice under two names). An external model's entry gets
// externalResourceProvider: true, and one already listed without it is
// changed to have it (else virt-handler and the operator's plugin would both
// register the resource).
struct AllowlistMerge {
  nlohmann::json entries;             // the new pciHostDevices list
  std::vector<std::string> added;     // "10DE:27B8 as nvidia.com/AD104GL_L4"
  std::vector<std::string> updated;   // listed before, now externalResourceProvider: true
  std::vector<std::string> present;   // already there
  std::vector<std::string> warnings;  // e.g. an entry left to an external provider
  bool changed() const { return !added.empty() || !updated.empty(); }
};
Result<AllowlistMerge> merge_allowlist(const nlohmann::json& current,
                                       const std::vector<GpuModel>& models);

struct AllowlistResult {
  std::string cr_namespace, cr_name;
  AllowlistMerge merge;
  bool dry_run = false;
};
// Reads the namespace's KubeVirt CR and writes the merged list back as a
// merge patch conditional on the resourceVersion it read, retrying when the
// CR changed meanwhile. Why not server-side apply: pciHostDevices is an
// atomic list in KubeVirt's schema, so an apply would make Factory the owner
// of the whole list, and the next apply by whoever owns the other entries
// would drop ours (or ours theirs). dry_run: the server validates the patch
// and stores nothing.
Result<AllowlistResult> ensure_allowlisted(kube::KubeClient& client, const std::string& ns,
                                           const std::vector<GpuModel>& models, bool dry_run);

struct NodeResource {
  std::string node;
  std::string resource;
  long long allocatable = 0;
};
struct AdvertiseReport {
  std::vector<NodeResource> nodes;    // every node advertising a model (allocatable > 0)
  std::vector<std::string> problems;  // why a model is short, one line each
  bool satisfied = false;
};
// Follows the nodes until, for every model, some node advertises it (at least
// as many as the host has on vfio-pci, when the inventory says), or the
// timeout passes; then says why what is short is short.
Result<AdvertiseReport> wait_for_advertised(kube::KubeClient& client,
                                            const std::string& cr_namespace,
                                            const std::vector<GpuModel>& models,
                                            std::chrono::milliseconds timeout);

}  // namespace factory::kubevirt
