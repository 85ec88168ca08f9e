// What the admin API decides about Tenant objects (coordinator/tenants/
// tenant_objects.hpp): the Tenant it writes for a request, how a Tenant
// that is there already is judged, and create_or_confirm's answers for
// every state a Tenant can be found in. create_or_confirm is driven here
// through TenantsInMemory, a test double of the seam that stands in for the
// API server's Tenant collection (get, create refusing a name that exists,
// delete) and can play another writer racing the create; the real API
// server's side (the Kubernetes client, finalizers, conflicts) is
// tests/integration/tenant_api_objects_test.cpp, against the API test double.
#include "coordinator/tenants/tenant_objects.hpp"

#include <gtest/gtest.h>

#include <map>

#include "coordinator/tenants/tenant_resource.hpp"

namespace factory::tenants {
namespace {

using nlohmann::json;

const char* kKey =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGb2cHzNnZDn3MQ2oGpdlw8Bi4aDAZ5pqc3VkxmlH5sb alice@laptop";

TenantRequest alice() {
  TenantRequest r;
  r.name = "alice";
  r.tier = "gpu-vm";
  r.memory = "16Gi";
  r.ssh_authorized_keys = {kKey};
  r.password = "Xq7mR2pLk9vT4wZs8nHc";
  return r;
}

class TenantsInMemory : public TenantObjects {
 public:
  Result<std::optional<json>> get(const std::string& ns, const std::string& name) override {
    ++gets;
    auto it = objects.find(ns + "/" + name);
    if (it == objects.end()) return std::optional<json>();
    return std::optional<json>(it->second);
  }
  Result<json> create(const json& tenant) override {
    ++creates;
    const std::string key = tenant["metadata"]["namespace"].get<std::string>() + "/" +
                            tenant["metadata"]["name"].get<std::string>();
    if (racer) objects[key] = *racer;  // another writer got there between our get and create
    if (objects.count(key)) return Error(Errc::already_exists, "tenants \"alice\" already exists");
    objects[key] = tenant;
    return tenant;
  }
  Result<bool> remove(const std::string& ns, const std::string& name) override {
    return objects.erase(ns + "/" + name) > 0;
  }
  Result<bool> release(const std::string&, const std::string&) override { return false; }

  std::map<std::string, json> objects;
  std::optional<json> racer;
  int gets = 0, creates = 0;
};

TEST(ApiTenantObject, IsTheRequestInItsNamespaceLabelledAndWithoutThePassword) {
  const json t = api_tenant_object(alice(), "team-a");
  EXPECT_EQ(t["metadata"]["namespace"], "team-a");
  EXPECT_EQ(t["metadata"]["labels"], json({{kTenantWrittenByLabel, kTenantWrittenByApi}}));
  EXPECT_EQ(t.dump().find(alice().password), std::string::npos) << t.dump();
  // What the controller reads from it is the request the admin made.
  auto read = tenant_from_object(t);
  ASSERT_TRUE(read.ok()) << read.error().message;
  TenantRequest want = alice();
  want.password.clear();
  want.ns = "team-a";
  EXPECT_EQ(read->request.to_json(true), want.to_json(true));
}

TEST(TenantSpecDifference, OnlyWhatTheCreateAsksMustMatch) {
  const json wanted = api_tenant_object(alice(), "tenants");
  EXPECT_FALSE(tenant_spec_difference(wanted, wanted).has_value());
  // Fields only the Tenant sets are its own (a project, a key by reference).
  json more = wanted;
  more["spec"]["project"] = "ml";
  more["spec"]["gpus"] = 1;
  EXPECT_FALSE(tenant_spec_difference(more, wanted).has_value());
  json other = wanted;
  other["spec"]["memory"] = "8Gi";
  EXPECT_EQ(tenant_spec_difference(other, wanted).value_or(""),
            "spec.memory: the Tenant has \"8Gi\", this create asks \"16Gi\"");
  json fewer = wanted;
  fewer["spec"].erase("sshKeys");
  EXPECT_EQ(tenant_spec_difference(fewer, wanted)
                .value_or("")
                .rfind("spec.sshKeys: the Tenant has none", 0),
            0u);
  EXPECT_TRUE(tenant_spec_difference(json::object(), wanted).has_value()) << "no spec at all";
}

TEST(CreateOrConfirm, WritesANewTenantOnceAndConfirmsItAfter) {
  TenantsInMemory objects;
  const json t = api_tenant_object(alice(), "tenants");
  auto first = create_or_confirm(objects, t);
  ASSERT_TRUE(first.ok()) << first.error().message;
  EXPECT_EQ(*first, TenantObjectPut::created);
  EXPECT_EQ(objects.objects.at("tenants/alice"), t);
  auto again = create_or_confirm(objects, t);
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(*again, TenantObjectPut::unchanged);
  EXPECT_EQ(objects.creates, 1) << "a Tenant asking the same is not written again";
}

TEST(CreateOrConfirm, RefusesATenantAskingSomethingElseSayingWhatToDoWithKubectl) {
  TenantsInMemory objects;
  json theirs = api_tenant_object(alice(), "tenants");
  theirs["spec"]["memory"] = "8Gi";
  objects.objects["tenants/alice"] = theirs;
  auto r = create_or_confirm(objects, api_tenant_object(alice(), "tenants"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::already_exists);  // 409 at the API
  EXPECT_EQ(r.error().message,
            "Tenant tenants/alice asks for something else (spec.memory: the Tenant has \"8Gi\", "
            "this create asks \"16Gi\"): change it with `kubectl edit tenant alice -n tenants`, "
            "or delete it (`kubectl delete tenant alice -n tenants`) and create it again");
  EXPECT_EQ(objects.objects.at("tenants/alice"), theirs) << "left as it was";
  EXPECT_EQ(objects.creates, 0);
}

TEST(CreateOrConfirm, ATenantBeingDeletedIsRefusedUntilItIsGone) {
  TenantsInMemory objects;
  json going = api_tenant_object(alice(), "tenants");
  going["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z";
  objects.objects["tenants/alice"] = going;
  auto r = create_or_confirm(objects, api_tenant_object(alice(), "tenants"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::failed_precondition);
  EXPECT_NE(r.error().message.find("is being deleted: wait until it is gone"), std::string::npos)
      << r.error().message;
}

TEST(CreateOrConfirm, AWriterRacingTheCreateIsJudgedAsIfItHadBeenFirst) {
  const json mine = api_tenant_object(alice(), "tenants");
  {
    TenantsInMemory objects;
    objects.racer = mine;  // kubectl applied the same Tenant meanwhile
    auto r = create_or_confirm(objects, mine);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(*r, TenantObjectPut::unchanged);
    EXPECT_EQ(objects.gets, 2) << "read again after already_exists";
  }
  {
    TenantsInMemory objects;
    json theirs = mine;
    theirs["spec"]["tier"] = "gpu-k8s";
    objects.racer = theirs;
    auto r = create_or_confirm(objects, mine);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, Errc::already_exists);
    EXPECT_NE(r.error().message.find("spec.tier: the Tenant has \"gpu-k8s\""), std::string::npos)
        << r.error().message;
  }
}

}  // namespace
}  // namespace factory::tenants
