#pragma once
// The admin API's Tenant objects (tenants::TenantObjects) in the host
// cluster, through the Kubernetes client: what the server gives the tenants
// service when tenants.source is kubernetes. The tenants module decides what
// an answer means; this only speaks to the API server.
#include "coordinator/kube/client.hpp"
#include "coordinator/tenants/tenant_objects.hpp"

namespace factory::coordinator {

class KubeTenantObjects : public tenants::TenantObjects {
 public:
  explicit KubeTenantObjects(kube::KubeClient client) : client_(std::move(client)) {}

  Result<std::optional<nlohmann::json>> get(const std::string& ns,
                                            const std::string& name) override;
  Result<nlohmann::json> create(const nlohmann::json& tenant) override;
  Result<bool> remove(const std::string& ns, const std::string& name) override;
  Result<bool> release(const std::string& ns, const std::string& name) override;

 private:
  kube::KubeClient client_;
};

}  // namespace factory::coordinator
