#pragma once
// The Kubernetes objects Factory owns for a tenant, as JSON documents ready to
// send to the API server or print with `--dry-run -o yaml`. They are the
// manifests of the runbook's step 4 (VirtualMachine, cloud-init Secret, SSH
// NodePort Service) plus the Namespace, field for field, with Factory's labels
// added so `tenant delete` can find everything it made by label selector.
//
// The builders are pure: no I/O, no defaults looked up elsewhere. Callers take
// the VM shape from the catalog and flags, call validate_vm_spec(), then build.
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/error.hpp"

namespace factory::tenants {

// Every object Factory makes for a tenant carries these labels.
inline constexpr const char* kManagedByLabel = "app.kubernetes.io/managed-by";
inline constexpr const char* kManagedByValue = "factory";
inline constexpr const char* kTenantLabel = "factory.dev/tenant";
inline constexpr const char* kTierLabel = "factory.dev/tier";
// KubeVirt's own label: the Service selects the VM's launcher pod with it.
inline constexpr const char* kDomainLabel = "kubevirt.io/domain";
// The Secret key KubeVirt's cloudInitNoCloud.secretRef reads the user-data from.
inline constexpr const char* kUserDataKey = "userdata";

inline constexpr int kMaxGpusPerVm = 16;

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
};

// Names of the objects derived from the VM's name.
std::string cloud_init_secret_name(const std::string& vm_name);  // <name>-cloud-init
std::string root_volume_name(const std::string& vm_name);        // <name>-root
std::string ssh_service_name(const std::string& vm_name);        // <name>-ssh
std::string endpoint_service_name(const std::string& vm_name);   // <name>-endpoint
std::string api_key_secret_name(const std::string& vm_name);     // <name>-endpoint-key
// The key in the API key Secret's data.
inline constexpr const char* kApiKeyKey = "api-key";
// `--dry-run` shows the Secret with this instead of a key.
inline constexpr const char* kApiKeyPlaceholder = "<API key: generated at apply time>";

// Checks every field against what Kubernetes, KubeVirt and CDI accept, so a
// bad spec is refused before the first object is created.
Status validate_vm_spec(const VmSpec& spec);

// The labels on every object of the tenant: spec.labels, then Factory's own
// (managed-by, tenant, tier), which validate_vm_spec() forbids overriding.
std::map<std::string, std::string> tenant_labels(const VmSpec& spec);
// "app.kubernetes.io/managed-by=factory,factory.dev/tenant=<name>": the label
// selector that lists every object Factory made for the tenant.
std::string tenant_selector(const std::string& tenant);

// The namespace the tenants live in. It is shared by tenants, so it is
// labelled managed-by factory but with no tenant: deleting a tenant by its
// selector never deletes the namespace under the others.
nlohmann::json namespace_object(const std::string& ns);
// Secret `<name>-cloud-init`, type Opaque, stringData.userdata = userdata.
nlohmann::json cloud_init_secret(const VmSpec& spec, const std::string& userdata);
// kubevirt.io/v1 VirtualMachine as in the runbook: runStrategy Always, a CDI
// dataVolumeTemplate `<name>-root` from the image URL, q35, virtio disks, the
// GPUs through `gpus[].deviceName` (no feature gate, unlike hostDevices),
// masquerade networking, the cloud-init disk from the Secret.
nlohmann::json virtual_machine(const VmSpec& spec);
// NodePort Service `<name>-ssh`: port 22 of the VM's launcher pod.
nlohmann::json ssh_service(const VmSpec& spec);

// NodePort Service `<name>-endpoint`: port 443 to the endpoint's guest port.
nlohmann::json endpoint_service(const VmSpec& spec);
// Secret `<name>-endpoint-key`, type Opaque, stringData.api-key = the tenant's
// API key: the only place the key itself is kept (the guest has its SHA-256).
nlohmann::json api_key_secret(const VmSpec& spec, const std::string& api_key);

// All of the tenant's objects in the order they are created (Namespace,
// Secret, the API key Secret when the tier has an endpoint, VirtualMachine,
// the SSH Service when there is login, the endpoint Service); delete goes in
// reverse. `api_key` is shown only in the API key Secret.
std::vector<nlohmann::json> tenant_objects(const VmSpec& spec, const std::string& userdata,
                                           const std::string& api_key = kApiKeyPlaceholder);

}  // namespace factory::tenants
