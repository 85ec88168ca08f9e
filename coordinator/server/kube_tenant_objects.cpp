// The admin API's Tenant objects over the Kubernetes client (kube_tenant_objects.hpp).
#include "coordinator/server/kube_tenant_objects.hpp"

#include <algorithm>

#include "coordinator/kubevirt/objects.hpp"

namespace factory::coordinator {

using nlohmann::json;

namespace {

// A conditional write that lost to another writer is tried again on what
// is there now; more than this many losses in a row is a fight, said so.
constexpr int kMaxConflicts = 5;

}  // namespace

Result<std::optional<json>> KubeTenantObjects::get(const std::string& ns, const std::string& name) {
  auto obj = client_.get(kube::kTenant, ns, name);
  if (obj) return std::optional<json>(std::move(*obj));
  if (obj.error().code == Errc::not_found) return std::optional<json>();
  return obj.error();
}

Result<json> KubeTenantObjects::create(const json& tenant) {
  // The tenant's namespace may not exist yet: the provider makes it only
  // later in the create. Made here as the provider makes it (its labels),
  // shared by tenants, never deleted by us.
  const std::string ns = tenant.value("/metadata/namespace"_json_pointer, std::string());
  auto have = client_.get(kube::kNamespace, "", ns);
  if (!have) {
    if (have.error().code != Errc::not_found) return have.error();
    auto made = client_.create(kubevirt::namespace_object(ns));
    if (!made && made.error().code != Errc::already_exists)
      return made.error().with_context("Namespace " + ns);
  }
  auto made = client_.create(tenant);
  // The collection itself is missing: the one command that installs it.
  if (!made && made.error().code == Errc::not_found)
    return Error(Errc::not_found, made.error().message +
                                      " (`factory install crds | kubectl apply -f -` installs "
                                      "the Tenant's)");
  return made;
}

Result<bool> KubeTenantObjects::remove(const std::string& ns, const std::string& name) {
  auto st = client_.remove(kube::kTenant, ns, name);
  if (st.ok()) return true;
  if (st.error().code == Errc::not_found) return false;
  return st.error();
}

Result<bool> KubeTenantObjects::release(const std::string& ns, const std::string& name) {
  for (int attempt = 0; attempt < kMaxConflicts; ++attempt) {
    auto obj = client_.get(kube::kTenant, ns, name);
    if (!obj) {
      if (obj.error().code == Errc::not_found) return false;
      return obj.error();
    }
    const json finalizers = obj->value("/metadata/finalizers"_json_pointer, json::array());
    if (!finalizers.is_array() || std::find(finalizers.begin(), finalizers.end(),
                                            json(tenants::kTenantFinalizer)) == finalizers.end())
      return false;
    json rest = json::array();
    for (const auto& f : finalizers)
      if (f != json(tenants::kTenantFinalizer)) rest.push_back(f);
    // Conditional on the version read: a finalizer another controller added
    // meanwhile is not written away.
    json patch = {{"metadata",
                   {{"finalizers", rest},
                    {"resourceVersion",
                     obj->value("/metadata/resourceVersion"_json_pointer, std::string())}}}};
    auto put = client_.merge_patch(kube::kTenant, ns, name, patch);
    if (put) return true;
    if (put.error().code == Errc::not_found) return false;
    if (put.error().code != Errc::conflict) return put.error();
  }
  return Error(Errc::conflict, "Tenant " + ns + "/" + name + " changed " +
                                   std::to_string(kMaxConflicts) +
                                   " times while its finalizer was taken off");
}

}  // namespace factory::coordinator
