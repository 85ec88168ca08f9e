#pragma once
// The syntax rules Kubernetes applies to the names and values Factory puts in
// a tenant's objects, checked before anything is sent, so that bad input gets
// one clear line from us instead of a 422 from the API server after half the
// objects exist. Tenant names themselves are checked by
// enroll::validate_tenant_name (they are also certificate CNs); the rules here
// add what the derived object names need.
#include <string_view>

#include "common/error.hpp"

namespace factory::tenants {

// NodePorts come from the API server's default --service-node-port-range.
inline constexpr int kMinNodePort = 30000;
inline constexpr int kMaxNodePort = 32767;

// The longest suffix Factory appends to a VM name to name a derived object
// ("-ssh" for the Service; "-cloud-init" and "-root" go into Secret and
// DataVolume names, which may be up to 253 characters).
inline constexpr size_t kMaxVmNameLength = 63 - 4;

// [a-z0-9]([-a-z0-9]*[a-z0-9])?, at most 63 characters: namespaces, hostnames.
bool is_dns1123_label(std::string_view s);

// DNS-1123 labels joined by '.', at most 253 characters: Secret names.
bool is_dns1123_subdomain(std::string_view s);

// A VM (= tenant) name: a DNS-1123 label that starts with a letter and leaves
// room for "-ssh", because `<name>-ssh` is a Service name, and Service names
// are DNS-1035 labels (no leading digit, at most 63 characters).
Status validate_vm_name(std::string_view name);

// A namespace name: a DNS-1123 label.
Status validate_namespace_name(std::string_view name);

// An explicit NodePort: within kMinNodePort..kMaxNodePort.
Status validate_node_port(int port);

// A resource.Quantity as Kubernetes writes it ("8", "500m", "16Gi", "1e3"),
// positive. `what` names the field in the message ("--memory").
Status validate_quantity(std::string_view what, std::string_view quantity);

// An extended resource name as a device plugin advertises it
// ("nvidia.com/AD104GL_L4"): a DNS subdomain prefix, '/', and a name of
// [A-Za-z0-9_.-] that starts and ends with an alphanumeric.
Status validate_resource_name(std::string_view name);

// A label key ("[prefix/]name") and value, by the rules of
// k8s.io/apimachinery/pkg/util/validation.
Status validate_label(std::string_view key, std::string_view value);

}  // namespace factory::tenants
