#pragma once
// The kinds Factory reads and writes, and where each lives in the REST API.
// Kubernetes has discovery for this; Factory knows its few kinds up front, so
// a missing CRD shows up as a clear 404 on first use instead of a discovery
// round trip on every start.
#include <string>
#include <vector>

#include "common/error.hpp"

namespace factory::kube {

struct Kind {
  std::string api_version;  // "v1", "kubevirt.io/v1"
  std::string kind;         // "VirtualMachine"
};

inline const Kind kNamespace{"v1", "Namespace"};
inline const Kind kSecret{"v1", "Secret"};
inline const Kind kService{"v1", "Service"};
inline const Kind kNode{"v1", "Node"};
inline const Kind kConfigMap{"v1", "ConfigMap"};
inline const Kind kPersistentVolumeClaim{"v1", "PersistentVolumeClaim"};
inline const Kind kPersistentVolume{"v1", "PersistentVolume"};
inline const Kind kPod{"v1", "Pod"};
inline const Kind kLease{"coordination.k8s.io/v1", "Lease"};
// Kubernetes 1.33 and later (v1beta1 from 1.31): the cluster's service ranges.
inline const Kind kServiceCIDR{"networking.k8s.io/v1", "ServiceCIDR"};
inline const Kind kKubeVirt{"kubevirt.io/v1", "KubeVirt"};
inline const Kind kVirtualMachine{"kubevirt.io/v1", "VirtualMachine"};
inline const Kind kVirtualMachineInstance{"kubevirt.io/v1", "VirtualMachineInstance"};
inline const Kind kDataVolume{"cdi.kubevirt.io/v1beta1", "DataVolume"};
// Factory's own custom resource (coordinator/tenants/tenant_resource.hpp).
inline const Kind kTenant{"factory.dev/v1alpha1", "Tenant"};

struct Resource {
  std::string group;    // "" for the core group
  std::string version;  // "v1"
  std::string kind;     // "KubeVirt"
  std::string plural;   // "kubevirts"
  bool namespaced = true;

  // "kubevirts.kubevirt.io", or "secrets" for the core group: how RBAC rules
  // and kubectl name a resource.
  std::string qualified() const { return group.empty() ? plural : plural + "." + group; }
  std::string api_version() const { return group.empty() ? version : group + "/" + version; }
  // "/api/v1" or "/apis/kubevirt.io/v1"
  std::string base_path() const;
  // The collection: ".../namespaces/<ns>/<plural>", or ".../<plural>" when the
  // kind is cluster-scoped or ns is empty (all namespaces).
  std::string collection_path(const std::string& ns) const;
  std::string object_path(const std::string& ns, const std::string& name) const;
};

// not_found for a kind Factory does not know (a programming error, said clearly).
Result<Resource> resource_for(const Kind& kind);
// Every kind above, for listings and for tests.
const std::vector<Resource>& known_resources();

}  // namespace factory::kube
