#pragma once
// The Tenant custom resource (factory.dev/v1alpha1, issue 26): what a
// platform team applies with kubectl or keeps in Git instead of running
// `factory tenant create`. This file holds its definition (the CRD that
// `factory install crds` prints and deploy/kubernetes/tenant-crd.yaml
// keeps) and the two conversions at its edge: a Tenant object read into
// the same TenantRequest the CLI and POST /v1/tenants make, by the same
// rules, and a request written back as a Tenant.
//
// The CRD's schema repeats the rules the coordinator checks (names,
// quantities, ranges, model names), so that `kubectl apply` refuses a bad
// Tenant before anything reads it; tenant_from_object checks them again,
// because an API server may run without schema validation (an old one, a
// test double, an object written before the CRD changed) and because the
// object's author is whoever may write Tenants, not the platform team.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "coordinator/tenants/request.hpp"

namespace factory::tenants {

inline constexpr const char* kTenantGroup = "factory.dev";
inline constexpr const char* kTenantVersion = "v1alpha1";
inline constexpr const char* kTenantApiVersion = "factory.dev/v1alpha1";
inline constexpr const char* kTenantKind = "Tenant";
inline constexpr const char* kTenantPlural = "tenants";
inline constexpr const char* kTenantCrdName = "tenants.factory.dev";

// At most this many SSH keys, inline or by reference, on one Tenant.
inline constexpr std::size_t kMaxTenantSshKeys = 32;

// A key of a Secret in the Tenant's namespace holding OpenSSH public keys
// (one per line, as an authorized_keys file), resolved by the controller.
struct SecretKeyRef {
  std::string name;
  std::string key;
  bool operator==(const SecretKeyRef&) const = default;
};

// A Tenant as the coordinator reads it: the request it makes, and what the
// object carries beyond a request.
struct TenantResource {
  TenantRequest request;  // name and namespace from metadata; inline keys in it
  std::vector<SecretKeyRef> ssh_key_refs;
  std::string project;          // "" = none; a DNS-1123 label (quotas group by it)
  std::string catalog_version;  // "" = whatever the coordinator's catalog is
  std::int64_t generation = 0;  // metadata.generation (0: not set, a new object)
  std::string uid;              // metadata.uid ("" before the API server set it)
};

// The CustomResourceDefinition (apiextensions.k8s.io/v1) for Tenants: a
// structural schema with the coordinator's validation rules, the status
// subresource, printer columns (tier, phase, GPU, ready, age).
nlohmann::json tenant_crd();

// Reads a Tenant object (JSON as the API server returns it). Refuses
// another apiVersion or kind, an unknown spec field, a wrong type, and
// every value the CLI would refuse; the error names the field
// ("spec.memory: ..."). Does not resolve the tier against a catalog (that
// is resolve_vm_spec's, when the controller acts on it).
Result<TenantResource> tenant_from_object(const nlohmann::json& object);

// The Tenant object for a resource: apiVersion, kind, metadata (name,
// namespace) and spec; no status. The password is never written.
nlohmann::json tenant_object(const TenantResource& resource);

}  // namespace factory::tenants
