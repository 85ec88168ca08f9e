#pragma once
// The VM a tenant gets, as every VM provider takes it (vm_provider.hpp): its
// shape, its GPUs, its tier and the labels Factory finds its things by. The
// fields are written as Kubernetes writes them (resource.Quantity, a device
// plugin's resource name, a NodePort), and validate_vm_spec() holds them to
// those rules whichever provider runs the VM, so a bad spec is refused before
// anything is created.
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "common/error.hpp"
#include "coordinator/store/tenant_record.hpp"

namespace factory::tenants {

inline constexpr int kMaxGpusPerVm = 16;

// A new field goes into vm_spec_to_stored / vm_spec_from_stored too
// (StoredSpec.EveryFieldRoundTripsThroughTheRecord).
struct VmSpec {
  std::string name;  // the tenant's name; also the VM's and its hostname
  std::string ns = "tenants";
  std::string cpu = "8";  // resource.Quantity, as the runbook's VM
  std::string memory = "16Gi";
  std::string disk = "100Gi";
  std::string image_url;     // http(s) URL of a cloud image, imported by CDI
  std::string gpu_resource;  // e.g. nvidia.com/AD104GL_L4 (the allowlisted resourceName)
  int gpus = 1;              // 0: a VM without a GPU
  int ssh_node_port = 0;     // 0 = let Kubernetes pick
  std::string tier;          // catalog tier, e.g. gpu-vm
  bool needs_mig = false;    // the tier cuts its card into MIG slices (tier_needs_mig)
  // The SSH NodePort Service exists: a tier with login, or an admin who gave
  // --ssh-key to one without (catalog AccessSpec).
  bool ssh_service = true;
  // The guest port of the tier's model endpoint (catalog EndpointSpec), 0 for
  // none; exposed by the NodePort Service `<name>-endpoint` on port 443.
  int endpoint_port = 0;
  std::map<std::string, std::string> labels;  // extra labels for every object of the tenant
  // The VM is to be off: a host drain stopped it (KubeVirt: runStrategy
  // Halted). Not kept in the spec: the tenant's maintenance journal decides
  // it (TenantService::stored_vm), so repairing a drained tenant's objects
  // does not start its VM again.
  bool halted = false;

  bool operator==(const VmSpec&) const = default;
};

// Every object Factory makes for a tenant carries these labels.
inline constexpr const char* kManagedByLabel = "app.kubernetes.io/managed-by";
inline constexpr const char* kManagedByValue = "factory";
inline constexpr const char* kTenantLabel = "factory.dev/tenant";
inline constexpr const char* kTierLabel = "factory.dev/tier";
// KubeVirt's own label: the KubeVirt provider's Services select the VM's
// launcher pod with it, so a request may not set it either.
inline constexpr const char* kDomainLabel = "kubevirt.io/domain";

// Checks every field against what Kubernetes, KubeVirt and CDI accept, so a
// bad spec is refused before the first object is created.
Status validate_vm_spec(const VmSpec& spec);

// The spec as the tenant's record keeps it (TenantRecord::spec), every field
// but the name (the record's own), and back: a re-run of create, a restart
// or a key rotation acts on exactly the VM that was first resolved, whatever
// the catalog says now. ssh_service, endpoint_port and labels are set
// only when they differ from their defaults, as records always had them.
store::TenantSpec vm_spec_to_stored(const VmSpec& spec);
// A record written before needs_mig was kept has none: `needs_mig_stored`
// says so, for the caller to take it from the catalog.
VmSpec vm_spec_from_stored(const store::TenantSpec& stored, const std::string& name,
                           bool* needs_mig_stored = nullptr);

}  // namespace factory::tenants
