#pragma once
// The Kubernetes objects Factory owns for a tenant, as JSON documents ready to
// send to the API server or print with `--dry-run -o yaml`. They are the
// manifests of the runbook's step 4 (VirtualMachine, cloud-init Secret, SSH
// NodePort Service) plus the Namespace, field for field, with Factory's labels
// added so `tenant delete` can find everything it made by label selector.
//
// The builders are pure: no I/O, no defaults looked up elsewhere. Callers take
// the VM shape from the catalog and flags, call validate_vm_spec()
// (coordinator/tenants/vm_spec.hpp, the spec every provider takes), then build.
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "coordinator/tenants/vm_spec.hpp"

namespace factory::kubevirt {

// The Secret key KubeVirt's cloudInitNoCloud.secretRef reads the user-data from.
inline constexpr const char* kUserDataKey = "userdata";

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

// The labels on every object of the tenant: spec.labels, then Factory's own
// (managed-by, tenant, tier: tenants/vm_spec.hpp), which validate_vm_spec()
// forbids overriding.
std::map<std::string, std::string> tenant_labels(const tenants::VmSpec& spec);
// "app.kubernetes.io/managed-by=factory,factory.dev/tenant=<name>": the label
// selector that lists every object Factory made for the tenant.
std::string tenant_selector(const std::string& tenant);

// The namespace the tenants live in. It is shared by tenants, so it is
// labelled managed-by factory but with no tenant: deleting a tenant by its
// selector never deletes the namespace under the others.
nlohmann::json namespace_object(const std::string& ns);
// Secret `<name>-cloud-init`, type Opaque, stringData.userdata = userdata.
nlohmann::json cloud_init_secret(const tenants::VmSpec& spec, const std::string& userdata);
// kubevirt.io/v1 VirtualMachine as in the runbook: runStrategy Always, a CDI
// dataVolumeTemplate `<name>-root` from the image URL, q35, virtio disks, the
// GPUs through `gpus[].deviceName` (no feature gate, unlike hostDevices),
// masquerade networking, the cloud-init disk from the Secret.
nlohmann::json virtual_machine(const tenants::VmSpec& spec);
// NodePort Service `<name>-ssh`: port 22 of the VM's launcher pod.
nlohmann::json ssh_service(const tenants::VmSpec& spec);

// NodePort Service `<name>-endpoint`: port 443 to the endpoint's guest port.
nlohmann::json endpoint_service(const tenants::VmSpec& spec);
// Secret `<name>-endpoint-key`, type Opaque, stringData.api-key = the tenant's
// API key: the only place the key itself is kept (the guest has its SHA-256).
nlohmann::json api_key_secret(const tenants::VmSpec& spec, const std::string& api_key);

// All of the tenant's objects in the order they are created (Namespace,
// Secret, the API key Secret when the tier has an endpoint, VirtualMachine,
// the SSH Service when there is login, the endpoint Service); delete goes in
// reverse. `api_key` is shown only in the API key Secret.
std::vector<nlohmann::json> tenant_objects(const tenants::VmSpec& spec, const std::string& userdata,
                                           const std::string& api_key = kApiKeyPlaceholder);

}  // namespace factory::kubevirt
