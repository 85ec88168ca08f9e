#include "coordinator/tenants/vm_spec.hpp"

#include <string_view>

#include "coordinator/tenants/k8s_names.hpp"

namespace factory::tenants {

namespace {

Error invalid(std::string message) {
  return Error(Errc::invalid_argument, std::move(message));
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// CDI fetches the image itself (source.http); it takes http and https. The
// URL must have a host and no whitespace or control characters, which would
// only surface later as an import pod failing in a loop.
Status validate_image_url(std::string_view url) {
  std::string_view rest;
  if (starts_with(url, "https://"))
    rest = url.substr(8);
  else if (starts_with(url, "http://"))
    rest = url.substr(7);
  else
    return invalid("image URL '" + std::string(url.substr(0, 100)) +
                   "' must start with https:// or http:// (CDI downloads it into the VM's "
                   "root disk)");
  if (rest.empty() || rest.front() == '/')
    return invalid("image URL '" + std::string(url.substr(0, 100)) + "' has no host");
  for (char c : url)
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f)
      return invalid("image URL contains a space or a control character: percent-encode it");
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
    return invalid("--gpus " + std::to_string(spec.gpus) + " is out of range: want 0-" +
                   std::to_string(kMaxGpusPerVm));
  if (spec.gpus > 0) {
    if (spec.gpu_resource.empty())
      return invalid("no GPU resource name for a VM with " + std::to_string(spec.gpus) +
                     " GPU(s): allowlist the card with `factory kubevirt allowlist` and name "
                     "its resource in the tier");
    if (auto st = validate_resource_name(spec.gpu_resource); !st.ok()) return st;
  }
  if (spec.ssh_node_port != 0)
    if (auto st = validate_node_port(spec.ssh_node_port); !st.ok()) return st;
  if (spec.tier.empty()) return invalid("no tier for tenant '" + spec.name + "'");
  if (auto st = validate_label(kTierLabel, spec.tier); !st.ok()) return st;
  for (const auto& [k, v] : spec.labels) {
    if (auto st = validate_label(k, v); !st.ok()) return st;
    // Factory finds its objects by these; a caller's label must not shadow them.
    if (k == kManagedByLabel || k == kDomainLabel || starts_with(k, "factory.dev/"))
      return invalid("label '" + k + "' is reserved for Factory's own bookkeeping");
  }
  return {};
}

nlohmann::json vm_spec_to_stored(const VmSpec& spec) {
  nlohmann::json j = {{"tier", spec.tier},
                      {"namespace", spec.ns},
                      {"cpu", spec.cpu},
                      {"memory", spec.memory},
                      {"disk", spec.disk},
                      {"image", spec.image_url},
                      {"gpus", spec.gpus},
                      {"gpu_resource", spec.gpu_resource},
                      {"ssh_node_port", spec.ssh_node_port},
                      {"needs_mig", spec.needs_mig}};
  if (!spec.ssh_service) j["ssh_service"] = false;
  if (spec.endpoint_port != 0) j["endpoint_port"] = spec.endpoint_port;
  if (!spec.labels.empty()) j["labels"] = spec.labels;
  return j;
}

VmSpec vm_spec_from_stored(const nlohmann::json& s, const std::string& name,
                           bool* needs_mig_stored) {
  VmSpec v;
  v.name = name;
  v.tier = s.value("tier", "");
  v.ns = s.value("namespace", "");
  v.cpu = s.value("cpu", "");
  v.memory = s.value("memory", "");
  v.disk = s.value("disk", "");
  v.image_url = s.value("image", "");
  v.gpus = s.value("gpus", 0);
  v.gpu_resource = s.value("gpu_resource", "");
  v.ssh_node_port = s.value("ssh_node_port", 0);
  v.ssh_service = s.value("ssh_service", true);
  v.endpoint_port = s.value("endpoint_port", 0);
  v.needs_mig = s.value("needs_mig", false);
  if (needs_mig_stored) *needs_mig_stored = s.contains("needs_mig");
  if (s.contains("labels") && s["labels"].is_object())
    for (const auto& [k, val] : s["labels"].items())
      if (val.is_string()) v.labels[k] = val.get<std::string>();
  return v;
}

}  // namespace factory::tenants
