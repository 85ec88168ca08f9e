#include "coordinator/kube/resources.hpp"

#include "coordinator/kube/url_encode.hpp"

namespace factory::kube {

const std::vector<Resource>& known_resources() {
  static const std::vector<Resource> all = {
      {"", "v1", "Namespace", "namespaces", false},
      {"", "v1", "Secret", "secrets", true},
      {"", "v1", "Service", "services", true},
      {"", "v1", "Node", "nodes", false},
      {"", "v1", "ConfigMap", "configmaps", true},
      {"", "v1", "PersistentVolumeClaim", "persistentvolumeclaims", true},
      {"", "v1", "PersistentVolume", "persistentvolumes", false},
      {"", "v1", "Pod", "pods", true},
      {"coordination.k8s.io", "v1", "Lease", "leases", true},
      {"networking.k8s.io", "v1", "ServiceCIDR", "servicecidrs", false},
      {"kubevirt.io", "v1", "KubeVirt", "kubevirts", true},
      {"kubevirt.io", "v1", "VirtualMachine", "virtualmachines", true},
      {"kubevirt.io", "v1", "VirtualMachineInstance", "virtualmachineinstances", true},
      {"cdi.kubevirt.io", "v1beta1", "DataVolume", "datavolumes", true},
      {"nvidia.com", "v1", "ClusterPolicy", "clusterpolicies", false},
      {"factory.dev", "v1alpha1", "Tenant", "tenants", true},
  };
  return all;
}

Result<Resource> resource_for(const Kind& kind) {
  for (const auto& r : known_resources())
    if (r.kind == kind.kind && r.api_version() == kind.api_version) return r;
  return Error(Errc::not_found,
               "factory does not know the Kubernetes kind " + kind.api_version + "/" + kind.kind);
}

std::string Resource::base_path() const {
  return group.empty() ? "/api/" + version : "/apis/" + group + "/" + version;
}

std::string Resource::collection_path(const std::string& ns) const {
  if (!namespaced || ns.empty()) return base_path() + "/" + plural;
  // Names are encoded like every segment a client builds: one that holds a
  // '/' or '?' stays one segment, and the API server refuses it by name.
  return base_path() + "/namespaces/" + url_encode(ns) + "/" + plural;
}

std::string Resource::object_path(const std::string& ns, const std::string& name) const {
  return collection_path(namespaced ? ns : "") + "/" + url_encode(name);
}

}  // namespace factory::kube
