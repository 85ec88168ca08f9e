#pragma once
// VMs as KubeVirt VirtualMachines in the host cluster, through the
// Kubernetes API (coordinator/kube), behind the tenants' VM-provider seam
// (tenants/vm_provider.hpp) as the QEMU provider is: the runbook's step 4
// objects from objects.hpp, GPU capacity read from the nodes and the KubeVirt
// CR, node ports read from the Services, the host's ranges from host_ranges.hpp.
#include <chrono>
#include <string>
#include <vector>

#include "coordinator/kube/client.hpp"
#include "coordinator/kubevirt/objects.hpp"
#include "coordinator/tenants/vm_provider.hpp"

namespace factory::kubevirt {

// GPU capacity of one resource, as the nodes advertise it and the VMs use it.
struct GpuCapacity {
  std::string resource;            // "nvidia.com/AD104GL_L4"
  long long allocatable = 0;       // summed over the nodes
  long long in_use = 0;            // requested by VMs that are not being deleted
  std::vector<std::string> users;  // who requests it: tenant names, or ns/name
  long long free() const { return allocatable - in_use; }
};

// Pure parts of the capacity check, kept apart so tests can feed them lists.
// The resource names KubeVirt's own device plugin advertises: every
// pciHostDevices entry of every KubeVirt CR without externalResourceProvider
// (an external plugin's resources are that plugin's business), in CR order.
std::vector<std::string> permitted_gpu_resources(const nlohmann::json& kubevirt_list);
// The candidates whose allowlisted card (pciVendorSelector) supports MIG
// (contract/mig_cards.hpp), or the error naming each refused one and why.
Result<std::vector<std::string>> mig_capable_resources(const std::vector<std::string>& candidates,
                                                       const nlohmann::json& kubevirt_list,
                                                       const std::string& tier);
// Capacity of `resource` from a NodeList and a VirtualMachineList, leaving
// out the VM `skip_ns/skip_name` (the tenant being created again).
GpuCapacity gpu_capacity(const std::string& resource, const nlohmann::json& node_list,
                         const nlohmann::json& vm_list, const std::string& skip_ns,
                         const std::string& skip_name);
// "no free nvidia.com/AD104GL_L4: 2 allocatable, 2 in use by tenant-1, tenant-2"
std::string capacity_shortfall(const GpuCapacity& c, int wanted);
// The API server's refusal of the SSH Service, said the way a user acts on
// it: a node port taken since the preflight looked (a race), or outside the
// cluster's --service-node-port-range.
Error ssh_service_error(const Error& e, const tenants::VmSpec& spec);

class KubeVirtProvider : public tenants::VmProvider {
 public:
  // The seam's types (tenants/vm_provider.hpp), unqualified in this provider.
  using VmSpec = tenants::VmSpec;
  using VmObject = tenants::VmObject;
  using VmObservation = tenants::VmObservation;
  using RestartRequest = tenants::RestartRequest;
  using RestartOutcome = tenants::RestartOutcome;

  // Connects on every call, so a kubeconfig fixed (or a token rotated) while
  // the coordinator runs is picked up, and a broken one is reported where it
  // matters instead of stopping `factory serve` from starting.
  KubeVirtProvider(kube::AccessOptions access, std::chrono::milliseconds request_timeout);

  Status preflight(VmSpec& spec) override;
  Result<bool> has_user_data(const VmSpec& spec) override;
  Result<std::string> api_key(const VmSpec& spec) override;
  Status put_api_key(const VmSpec& spec, const std::string& key,
                     std::vector<VmObject>& created) override;
  Status provision(const VmSpec& spec, const std::string& userdata,
                   std::vector<VmObject>& created) override;
  std::vector<std::pair<VmObject, Error>> remove(const std::vector<VmObject>& objects) override;
  Result<std::vector<VmObject>> destroy(const std::string& tenant, const std::string& ns) override;
  Result<VmObservation> observe(const std::string& tenant, const std::string& ns) override;
  // Every object of the tenant's: its Secrets there, and the VirtualMachine's
  // and Services' fields that Factory writes (spec, labels) as provision()
  // would write them. Fields the API server or KubeVirt add are not drift.
  Result<std::vector<std::string>> drift(const VmSpec& spec) override;
  Result<std::vector<ranges::Fact>> host_ranges() override;
  Result<RestartOutcome> restart(const VmSpec& spec, const RestartRequest& req) override;
  Status set_node_schedulable(const std::string& node, bool schedulable) override;
  // Movable when its root disk's volume is not node-local and another
  // schedulable node has free cards of its resource.
  Result<tenants::Mobility> mobility(const VmSpec& spec) override;
  // runStrategy Halted / Always (merge patch), as virtctl stop / start.
  Result<tenants::StopOutcome> stop(const VmSpec& spec) override;
  Status start(const VmSpec& spec) override;
  std::string user_data_location(const VmSpec& spec) const override {
    return "Secret " + spec.ns + "/" + cloud_init_secret_name(spec.name);
  }
  std::string api_key_location(const VmSpec& spec) const override {
    return api_key_secret_name(spec.name);
  }

 private:
  Result<kube::KubeClient> client() const;

  kube::AccessOptions access_;
  std::chrono::milliseconds timeout_;
};

}  // namespace factory::kubevirt
