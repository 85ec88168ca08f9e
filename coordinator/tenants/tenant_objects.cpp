// The Tenant objects the admin API writes (tenant_objects.hpp).
#include "coordinator/tenants/tenant_objects.hpp"

#include "coordinator/tenants/tenant_resource.hpp"

namespace factory::tenants {

using nlohmann::json;

namespace {

std::string text_at(const json& obj, const json::json_pointer& at) {
  return obj.contains(at) && obj[at].is_string() ? obj[at].get<std::string>() : "";
}

std::string where(const json& tenant) {
  return text_at(tenant, "/metadata/namespace"_json_pointer) + "/" +
         text_at(tenant, "/metadata/name"_json_pointer);
}

}  // namespace

json api_tenant_object(const TenantRequest& req, const std::string& ns) {
  TenantResource r;
  r.request = req;
  r.request.ns = ns;
  json obj = tenant_object(r);
  obj["metadata"]["labels"] = {{kTenantWrittenByLabel, kTenantWrittenByApi}};
  return obj;
}

std::optional<std::string> tenant_spec_difference(const json& existing, const json& wanted) {
  const json have = existing.value("spec", json::object());
  const json want = wanted.value("spec", json::object());
  for (const auto& [key, value] : want.items()) {
    if (have.is_object() && have.contains(key) && have[key] == value) continue;
    const bool set = have.is_object() && have.contains(key);
    return "spec." + key + ": the Tenant has " + (set ? have[key].dump() : "none") +
           ", this create asks " + value.dump();
  }
  return std::nullopt;
}

Result<TenantObjectPut> create_or_confirm(TenantObjects& objects, const json& tenant) {
  const std::string ns = text_at(tenant, "/metadata/namespace"_json_pointer);
  const std::string name = text_at(tenant, "/metadata/name"_json_pointer);
  const std::string what = "Tenant " + where(tenant);
  auto have = objects.get(ns, name);
  if (!have) return have.error().with_context("reading " + what);
  if (!*have) {
    auto made = objects.create(tenant);
    if (made) return TenantObjectPut::created;
    if (made.error().code != Errc::already_exists)
      return made.error().with_context("writing " + what);
    // Someone else (kubectl, another replica) wrote it meanwhile: theirs is
    // judged as if it had been there first.
    have = objects.get(ns, name);
    if (!have) return have.error().with_context("reading " + what);
    if (!*have)
      return Error(Errc::conflict, what +
                                       " was written and deleted by someone else while this "
                                       "create ran: run the create again");
  }
  const json& obj = **have;
  if (!text_at(obj, "/metadata/deletionTimestamp"_json_pointer).empty())
    return Error(Errc::failed_precondition,
                 what + " is being deleted: wait until it is gone (`kubectl get tenant " + name +
                     " -n " + ns + " -w`), then create it again");
  if (auto diff = tenant_spec_difference(obj, tenant))
    return Error(Errc::already_exists,
                 what + " asks for something else (" + *diff + "): change it with `kubectl edit " +
                     "tenant " + name + " -n " + ns + "`, or delete it (`kubectl delete tenant " +
                     name + " -n " + ns + "`) and create it again");
  return TenantObjectPut::unchanged;
}

}  // namespace factory::tenants
