#include "coordinator/kubevirt/objects.hpp"

namespace factory::kubevirt {

using nlohmann::json;
using tenants::kDomainLabel;
using tenants::kManagedByLabel;
using tenants::kManagedByValue;
using tenants::kTenantLabel;
using tenants::kTierLabel;
using tenants::VmSpec;

namespace {

json labels_json(const std::map<std::string, std::string>& labels) {
  json out = json::object();
  for (const auto& [k, v] : labels) out[k] = v;
  return out;
}

json object_meta(const VmSpec& spec, const std::string& name) {
  return {{"name", name}, {"namespace", spec.ns}, {"labels", labels_json(tenant_labels(spec))}};
}

}  // namespace

std::string cloud_init_secret_name(const std::string& vm_name) {
  return vm_name + "-cloud-init";
}
std::string root_volume_name(const std::string& vm_name) {
  return vm_name + "-root";
}
std::string ssh_service_name(const std::string& vm_name) {
  return vm_name + "-ssh";
}

std::string endpoint_service_name(const std::string& vm_name) {
  return vm_name + "-endpoint";
}

std::string api_key_secret_name(const std::string& vm_name) {
  return vm_name + "-endpoint-key";
}

std::map<std::string, std::string> tenant_labels(const VmSpec& spec) {
  auto labels = spec.labels;
  labels[kManagedByLabel] = kManagedByValue;
  labels[kTenantLabel] = spec.name;
  labels[kTierLabel] = spec.tier;
  return labels;
}

std::string tenant_selector(const std::string& tenant) {
  return std::string(kManagedByLabel) + "=" + kManagedByValue + "," + kTenantLabel + "=" + tenant;
}

json namespace_object(const std::string& ns) {
  return {{"apiVersion", "v1"},
          {"kind", "Namespace"},
          {"metadata", {{"name", ns}, {"labels", {{kManagedByLabel, kManagedByValue}}}}}};
}

json cloud_init_secret(const VmSpec& spec, const std::string& userdata) {
  // stringData, as the runbook: the API server stores it base64'd under data,
  // and a `--dry-run -o yaml` reader sees the user-data as text.
  return {{"apiVersion", "v1"},
          {"kind", "Secret"},
          {"metadata", object_meta(spec, cloud_init_secret_name(spec.name))},
          {"type", "Opaque"},
          {"stringData", {{kUserDataKey, userdata}}}};
}

json virtual_machine(const VmSpec& spec) {
  json labels = labels_json(tenant_labels(spec));

  json gpus = json::array();
  for (int i = 1; i <= spec.gpus; ++i)
    gpus.push_back({{"name", "gpu" + std::to_string(i)}, {"deviceName", spec.gpu_resource}});

  json devices = {
      {"disks",
       {{{"name", "rootdisk"}, {"disk", {{"bus", "virtio"}}}},
        {{"name", "cloudinitdisk"}, {"disk", {{"bus", "virtio"}}}}}},
      {"interfaces", {{{"name", "default"}, {"masquerade", json::object()}}}},
  };
  // gpus, not hostDevices: KubeVirt hands a PCI function to `gpus` without
  // the alpha HostDevices feature gate, and the runbook's VMs use it.
  if (spec.gpus > 0) devices["gpus"] = gpus;

  json template_labels = labels;
  // The SSH Service selects the launcher pod by this label.
  template_labels[kDomainLabel] = spec.name;

  json root_volume_meta = {{"name", root_volume_name(spec.name)}, {"labels", labels}};

  return {
      {"apiVersion", "kubevirt.io/v1"},
      {"kind", "VirtualMachine"},
      {"metadata", object_meta(spec, spec.name)},
      {"spec",
       {
           // Always: KubeVirt starts the VM now, and again whenever it
           // stops (a guest poweroff, an evicted launcher pod). Halted
           // while a host drain keeps it off: KubeVirt shuts the guest down
           // (ACPI, within terminationGracePeriodSeconds).
           {"runStrategy", spec.halted ? "Halted" : "Always"},
           {"dataVolumeTemplates",
            {{{"metadata", root_volume_meta},
              {"spec",
               {{"source", {{"http", {{"url", spec.image_url}}}}},
                // storage (not pvc): CDI picks access and volume mode from
                // the default StorageClass's profile.
                {"storage", {{"resources", {{"requests", {{"storage", spec.disk}}}}}}}}}}}},
           {"template",
            {{"metadata", {{"labels", template_labels}}},
             {"spec",
              {{"architecture", "amd64"},
               {"domain",
                {// q35: the GPU is a PCIe device and needs a PCIe root complex.
                 {"machine", {{"type", "q35"}}},
                 {"devices", devices},
                 {"resources", {{"requests", {{"cpu", spec.cpu}, {"memory", spec.memory}}}}}}},
               {"networks", {{{"name", "default"}, {"pod", json::object()}}}},
               {"volumes",
                {{{"name", "rootdisk"}, {"dataVolume", {{"name", root_volume_name(spec.name)}}}},
                 {{"name", "cloudinitdisk"},
                  // secretRef, not inline userData: KubeVirt caps inline
                  // user-data at 2048 bytes, and it holds a password.
                  {"cloudInitNoCloud",
                   {{"secretRef", {{"name", cloud_init_secret_name(spec.name)}}}}}}}}}}}},
       }},
  };
}

namespace {

// A NodePort Service in front of the VM's launcher pod, one port.
json node_port_service(const VmSpec& spec, const std::string& name, json port) {
  return {{"apiVersion", "v1"},
          {"kind", "Service"},
          {"metadata", object_meta(spec, name)},
          {"spec",
           {{"type", "NodePort"},
            {"selector", {{kDomainLabel, spec.name}}},
            {"ports", json::array({std::move(port)})}}}};
}

}  // namespace

json ssh_service(const VmSpec& spec) {
  json port = {{"name", "ssh"}, {"port", 22}, {"targetPort", 22}};
  if (spec.ssh_node_port != 0) port["nodePort"] = spec.ssh_node_port;
  return node_port_service(spec, ssh_service_name(spec.name), std::move(port));
}

json endpoint_service(const VmSpec& spec) {
  return node_port_service(spec, endpoint_service_name(spec.name),
                           {{"name", "https"}, {"port", 443}, {"targetPort", spec.endpoint_port}});
}

json api_key_secret(const VmSpec& spec, const std::string& api_key) {
  return {{"apiVersion", "v1"},
          {"kind", "Secret"},
          {"metadata", object_meta(spec, api_key_secret_name(spec.name))},
          {"type", "Opaque"},
          {"stringData", {{kApiKeyKey, api_key}}}};
}

std::vector<json> tenant_objects(const VmSpec& spec, const std::string& userdata,
                                 const std::string& api_key) {
  std::vector<json> out = {namespace_object(spec.ns), cloud_init_secret(spec, userdata)};
  if (spec.endpoint_port != 0) out.push_back(api_key_secret(spec, api_key));
  out.push_back(virtual_machine(spec));
  if (spec.ssh_service) out.push_back(ssh_service(spec));
  if (spec.endpoint_port != 0) out.push_back(endpoint_service(spec));
  return out;
}

}  // namespace factory::kubevirt
