#pragma once
// The Tenant objects that `factory tenant create|delete` (POST and DELETE
// /v1/tenants) write when the coordinator's tenants live in the host
// cluster (tenants.source: kubernetes, issue 26): one source of truth, so a
// tenant made with the CLI is a Tenant that `kubectl get tenants` lists,
// and deleting it with the CLI deletes the Tenant too.
//
// TenantObjects is the seam: the tenants module does not see the
// Kubernetes client (docs/architecture.md), so the server gives the service
// an implementation over it (coordinator/server/kube_tenant_objects.hpp).
// What an answer means (the same spec, another spec, a Tenant being
// deleted) is decided here, once, over any implementation.
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "common/error.hpp"
#include "coordinator/tenants/request.hpp"

namespace factory::tenants {

// The finalizer the Tenant controller puts on every Tenant, so deleting one
// waits until its tenant is removed. The admin API's delete removes the
// tenant itself, then takes it off.
inline constexpr const char* kTenantFinalizer = "factory.dev/tenant";

// The label on a Tenant the admin API wrote, so `kubectl get tenants -l
// factory.dev/written-by` tells those made with `factory tenant create`
// from those applied by hand or from Git. Not app.kubernetes.io/managed-by:
// every Tenant is managed by the coordinator, whoever wrote it.
inline constexpr const char* kTenantWrittenByLabel = "factory.dev/written-by";
inline constexpr const char* kTenantWrittenByApi = "factory-tenant-create";

class TenantObjects {
 public:
  virtual ~TenantObjects() = default;
  // The Tenant as the API server holds it; nullopt when there is none.
  virtual Result<std::optional<nlohmann::json>> get(const std::string& ns,
                                                    const std::string& name) = 0;
  // Creates the Tenant (its namespace too, when missing); Errc::already_exists
  // when a Tenant of that name is there.
  virtual Result<nlohmann::json> create(const nlohmann::json& tenant) = 0;
  // Asks for the Tenant's deletion: one without finalizers goes at once, one
  // with finalizers is marked (deletionTimestamp) and goes when they are off.
  // false when there was no Tenant.
  virtual Result<bool> remove(const std::string& ns, const std::string& name) = 0;
  // Takes kTenantFinalizer off the Tenant (the others stay), conditional on
  // the version read and read again when it changed meanwhile. true when
  // this call took it off; false when the Tenant or the finalizer was not there.
  virtual Result<bool> release(const std::string& ns, const std::string& name) = 0;
};

// The Tenant the admin API writes for `req`: tenant_object of it in
// namespace `ns` (the tenant's, never empty), labelled as written by it.
nlohmann::json api_tenant_object(const TenantRequest& req, const std::string& ns);

// How a Tenant's spec differs from what `wanted` asks: the first field that
// `wanted`'s spec sets and `existing`'s does not hold the same, as one line
// (`spec.memory: the Tenant has "8Gi", this create asks "16Gi"`); nullopt
// when there is none. Fields only `existing` sets are the Tenant's business,
// as a re-run of create leaves the fields it does not set to the first one.
std::optional<std::string> tenant_spec_difference(const nlohmann::json& existing,
                                                  const nlohmann::json& wanted);

enum class TenantObjectPut {
  created,    // this call wrote it
  unchanged,  // one asking the same was there: nothing written
};

// Writes `tenant` unless a Tenant asking the same is there. Refuses one
// asking something else (Errc::already_exists, the difference and what to
// do with kubectl) and one being deleted (Errc::failed_precondition).
Result<TenantObjectPut> create_or_confirm(TenantObjects& objects, const nlohmann::json& tenant);

}  // namespace factory::tenants
