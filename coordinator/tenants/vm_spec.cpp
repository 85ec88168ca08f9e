#include "coordinator/tenants/vm_spec.hpp"

#include <string_view>

#include "coordinator/tenants/k8s_names.hpp"

namespace factory::tenants {

namespace {

Error invalid_vm_spec(std::string message) {
  return Error(Errc::invalid_argument, std::move(message));
}

bool vm_spec_starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// CDI fetches the image itself (source.http); it takes http and https. The
// URL must have a host and no whitespace or control characters, which would
// only surface later as an import pod failing in a loop.
Status validate_image_url(std::string_view url) {
  std::string_view rest;
  if (vm_spec_starts_with(url, "https://"))
    rest = url.substr(8);
  else if (vm_spec_starts_with(url, "http://"))
    rest = url.substr(7);
  else
    return invalid_vm_spec("image URL '" + std::string(url.substr(0, 100)) +
                           "' must start with https:// or http:// (CDI downloads it into the VM's "
                           "root disk)");
  if (rest.empty() || rest.front() == '/')
    return invalid_vm_spec("image URL '" + std::string(url.substr(0, 100)) + "' has no host");
  for (char c : url)
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f)
      return invalid_vm_spec(
          "image URL contains a space or a control character: percent-encode it");
  return {};
}

}  // namespace

Status validate_vm_spec(const VmSpec& spec) {
  if (auto st = validate_vm_name(spec.name); !st.ok()) return st;
  if (auto st = validate_namespace_name(spec.ns); !st.ok()) return st;
  if (auto st = validate_quantity("--cpu", spec.cpu); !st.ok()) return st;
  if (auto st = validate_quantity("--memory", spec.memory); !st.ok()) return st;
  if (auto st = validate_quantity("--disk", spec.disk); !st.ok()) return st;
  if (auto st = validate_image_url(spec.image_url); !st.ok()) return st;
  if (spec.gpus < 0 || spec.gpus > kMaxGpusPerVm)
    return invalid_vm_spec("--gpus " + std::to_string(spec.gpus) + " is out of range: want 0-" +
                           std::to_string(kMaxGpusPerVm));
  if (spec.gpus > 0) {
    if (spec.gpu_resource.empty())
      return invalid_vm_spec(
          "no GPU resource name for a VM with " + std::to_string(spec.gpus) +
          " GPU(s): allowlist the card with `factory kubevirt allowlist` and name "
          "its resource in the tier");
    if (auto st = validate_resource_name(spec.gpu_resource); !st.ok()) return st;
  }
  if (spec.ssh_node_port != 0)
    if (auto st = validate_node_port(spec.ssh_node_port); !st.ok()) return st;
  if (spec.tier.empty()) return invalid_vm_spec("no tier for tenant '" + spec.name + "'");
  if (auto st = validate_label(kTierLabel, spec.tier); !st.ok()) return st;
  for (const auto& [k, v] : spec.labels) {
    if (auto st = validate_label(k, v); !st.ok()) return st;
    // Factory finds its objects by these; a caller's label must not shadow them.
    if (k == kManagedByLabel || k == kDomainLabel || vm_spec_starts_with(k, "factory.dev/"))
      return invalid_vm_spec("label '" + k + "' is reserved for Factory's own bookkeeping");
  }
  return {};
}

store::TenantSpec vm_spec_to_stored(const VmSpec& spec) {
  store::TenantSpec s;
  s.tier = spec.tier;
  s.ns = spec.ns;
  s.cpu = spec.cpu;
  s.memory = spec.memory;
  s.disk = spec.disk;
  s.image = spec.image_url;
  s.gpus = spec.gpus;
  s.gpu_resource = spec.gpu_resource;
  s.ssh_node_port = spec.ssh_node_port;
  s.needs_mig = spec.needs_mig;
  if (!spec.ssh_service) s.ssh_service = false;
  if (spec.endpoint_port != 0) s.endpoint_port = spec.endpoint_port;
  if (!spec.labels.empty()) s.labels = spec.labels;
  return s;
}

VmSpec vm_spec_from_stored(const store::TenantSpec& s, const std::string& name,
                           bool* needs_mig_stored) {
  VmSpec v;
  v.name = name;
  v.tier = s.tier.value_or("");
  v.ns = s.ns.value_or("");
  v.cpu = s.cpu.value_or("");
  v.memory = s.memory.value_or("");
  v.disk = s.disk.value_or("");
  v.image_url = s.image.value_or("");
  v.gpus = s.gpus.value_or(0);
  v.gpu_resource = s.gpu_resource.value_or("");
  v.ssh_node_port = s.ssh_node_port.value_or(0);
  v.ssh_service = s.ssh_service.value_or(true);
  v.endpoint_port = s.endpoint_port.value_or(0);
  v.needs_mig = s.needs_mig.value_or(false);
  if (needs_mig_stored) *needs_mig_stored = s.needs_mig.has_value();
  v.labels = s.labels.value_or(std::map<std::string, std::string>{});
  return v;
}

}  // namespace factory::tenants
