// KubeClient's verbs and its error lines against the fake API server
// (tests/fakes/kube_apiserver.py), which stands in for kube-apiserver with
// KubeVirt and CDI installed: real HTTPS, Status bodies shaped as the real
// server's, objects validated against the real KubeVirt / CDI OpenAPI
// schemas and python3-kubernetes' models.
#include <gtest/gtest.h>

#include <fstream>

#include "common/yaml_json.hpp"
#include "coordinator/kube/client.hpp"
#include "tests/fakes/fake_kube.hpp"
#include "tests/support/test_support.hpp"

namespace factory::kube {
namespace {

using factory::testing::FakeKube;

json secret(const std::string& name, const std::string& ns = "default") {
  return {{"apiVersion", "v1"},
          {"kind", "Secret"},
          {"metadata", {{"name", name}, {"namespace", ns}, {"labels", {{"test", "client"}}}}},
          {"stringData", {{"userdata", "#cloud-config\n"}}}};
}

// The runbook's tenant-1 VirtualMachine (tests/fixtures/runbook).
json runbook_vm() {
  auto vm = load_yaml_file(
      (factory::testing::source_dir() / "tests/fixtures/runbook/tenant-1-virtualmachine.yaml")
          .string());
  EXPECT_TRUE(vm.ok()) << vm.error().message;
  return vm.ok() ? *vm : json();
}

class KubeClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(kube_.ok()) << kube_.log();
    auto a = load_kubeconfig(kube_.kubeconfig());
    ASSERT_TRUE(a.ok()) << a.error().message;
    client_.emplace(*a);
  }
  FakeKube kube_{{"--vfio-cards", "10DE:27B8=2", "--forbid", "patch:kubevirts.kubevirt.io:kubevirt",
                  "--forbid", "delete:nodes"}};
  std::optional<KubeClient> client_;
};

TEST_F(KubeClientTest, CreateGetListDelete) {
  auto created = client_->create(secret("one"));
  ASSERT_TRUE(created.ok()) << created.error().message;
  EXPECT_FALSE((*created)["metadata"]["resourceVersion"].get<std::string>().empty());
  ASSERT_TRUE(client_->create(secret("two")).ok());
  auto other = secret("three");
  other["metadata"]["labels"]["test"] = "other";
  ASSERT_TRUE(client_->create(other).ok());

  auto got = client_->get(kSecret, "default", "one");
  ASSERT_TRUE(got.ok()) << got.error().message;
  // The server folded stringData into data, as a real one does.
  EXPECT_EQ((*got)["data"]["userdata"], "I2Nsb3VkLWNvbmZpZwo=");

  auto listed = client_->list(kSecret, "default", {.label_selector = "test=client"});
  ASSERT_TRUE(listed.ok()) << listed.error().message;
  ASSERT_EQ((*listed)["items"].size(), 2u);
  EXPECT_EQ((*listed)["items"][0]["metadata"]["name"], "one");
  EXPECT_EQ((*listed)["items"][1]["metadata"]["name"], "two");

  ASSERT_TRUE(client_->remove(kSecret, "default", "one").ok());
  auto gone = client_->get(kSecret, "default", "one");
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.error().code, Errc::not_found);
  EXPECT_EQ(gone.error().message, "secrets \"one\" not found");
  auto again = client_->remove(kSecret, "default", "one");
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code, Errc::not_found);
  EXPECT_TRUE(ignore_not_found(again).ok());

  // The delete asked for background propagation.
  auto reqs = kube_.control("/_fake/requests", {}, "GET");
  bool saw = false;
  for (const auto& r : reqs["requests"])
    if (r["method"] == "DELETE") saw = true;
  EXPECT_TRUE(saw);
}

TEST_F(KubeClientTest, CreateTwiceIsAlreadyExists) {
  ASSERT_TRUE(client_->create(secret("dup")).ok());
  auto r = client_->create(secret("dup"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::already_exists);
  EXPECT_EQ(r.error().message, "secrets \"dup\" already exists");
}

TEST_F(KubeClientTest, CreateInAMissingNamespaceIsNotFound) {
  auto r = client_->create(secret("x", "tenants"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::not_found);
  EXPECT_EQ(r.error().message, "namespaces \"tenants\" not found");
}

TEST_F(KubeClientTest, ForbiddenSaysWhichRightIsMissing) {
  json cr = {{"apiVersion", "kubevirt.io/v1"},
             {"kind", "KubeVirt"},
             {"metadata", {{"name", "kubevirt"}, {"namespace", "kubevirt"}}},
             {"spec", {{"configuration", {{"imagePullPolicy", "IfNotPresent"}}}}}};
  auto r = client_->apply(cr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::permission_denied);
  EXPECT_EQ(r.error().message,
            "forbidden: the coordinator's account cannot patch kubevirts.kubevirt.io in namespace "
            "kubevirt: grant it with RBAC (see deploy/)");

  auto node = client_->remove(kNode, "", "utho");
  ASSERT_FALSE(node.ok());
  EXPECT_EQ(
      node.error().message,
      "forbidden: the coordinator's account cannot delete nodes: grant it with RBAC (see deploy/)");
  // Reading is still allowed.
  EXPECT_TRUE(client_->get(kKubeVirt, "kubevirt", "kubevirt").ok());
}

TEST_F(KubeClientTest, ApplyCreatesThenMergesAsFieldManagerFactory) {
  ASSERT_TRUE(
      client_
          ->create(
              {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "tenants"}}}})
          .ok());
  json vm = runbook_vm();
  auto first = client_->apply(vm);
  ASSERT_TRUE(first.ok()) << first.error().message;
  EXPECT_EQ((*first)["metadata"]["namespace"], "tenants");

  vm["metadata"]["labels"] = {{"app.kubernetes.io/managed-by", "factory"}};
  auto second = client_->apply(vm);
  ASSERT_TRUE(second.ok()) << second.error().message;
  EXPECT_EQ((*second)["metadata"]["labels"]["app.kubernetes.io/managed-by"], "factory");
  EXPECT_EQ((*second)["metadata"]["uid"], (*first)["metadata"]["uid"]);

  bool saw_apply = false;
  json seen = kube_.control("/_fake/requests", {}, "GET");
  for (const auto& r : seen["requests"]) {
    if (r["method"] != "PATCH") continue;
    saw_apply = true;
    EXPECT_EQ(r["contentType"], "application/apply-patch+yaml");
    std::string path = r["path"];
    EXPECT_NE(path.find("fieldManager=factory"), std::string::npos) << path;
    EXPECT_NE(path.find("force=true"), std::string::npos) << path;
    EXPECT_NE(path.find("fieldValidation=Strict"), std::string::npos) << path;
  }
  EXPECT_TRUE(saw_apply);
}

TEST_F(KubeClientTest, ObjectFailingTheSchemaIsRejectedAndNotStored) {
  ASSERT_TRUE(
      client_
          ->create(
              {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "tenants"}}}})
          .ok());
  json vm = runbook_vm();
  // A typo a real strict server refuses: deviceName spelt in lower case.
  auto& gpu = vm["spec"]["template"]["spec"]["domain"]["devices"]["gpus"][0];
  gpu["devicename"] = gpu["deviceName"];
  gpu.erase("deviceName");
  auto r = client_->create(vm);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::invalid_argument);
  EXPECT_EQ(r.error().message,
            "VirtualMachine.kubevirt.io \"tenant-1\" is invalid: "
            "spec.template.spec.domain.devices.gpus[0].devicename: unknown field \"devicename\"");
  EXPECT_EQ(client_->get(kVirtualMachine, "tenants", "tenant-1").error().code, Errc::not_found);

  // Same through apply, and a DataVolume with a wrong type (CDI schema).
  EXPECT_EQ(client_->apply(vm).error().code, Errc::invalid_argument);
  json dv = {{"apiVersion", "cdi.kubevirt.io/v1beta1"},
             {"kind", "DataVolume"},
             {"metadata", {{"name", "d"}, {"namespace", "tenants"}}},
             {"spec", {{"source", {{"http", {{"url", 42}}}}}}}};
  auto bad_dv = client_->create(dv);
  ASSERT_FALSE(bad_dv.ok());
  EXPECT_NE(bad_dv.error().message.find(
                "spec.source.http.url: Invalid value: 42: must be of type string"),
            std::string::npos)
      << bad_dv.error().message;
}

TEST_F(KubeClientTest, DryRunStoresNothing) {
  auto r = client_->create(secret("dry"), {.dry_run = true});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ((*r)["metadata"]["name"], "dry");
  EXPECT_EQ(client_->get(kSecret, "default", "dry").error().code, Errc::not_found);
}

TEST_F(KubeClientTest, StaleResourceVersionIsAConflict) {
  auto created = client_->create(secret("cas"));
  ASSERT_TRUE(created.ok());
  json stale = *created;
  json fresh = *created;
  fresh["metadata"]["labels"]["round"] = "1";
  ASSERT_TRUE(client_->update(fresh).ok());
  stale["metadata"]["labels"]["round"] = "2";
  auto r = client_->update(stale);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::conflict);
  EXPECT_NE(r.error().message.find("the object has been modified"), std::string::npos);

  // A merge patch carrying the old resourceVersion is refused the same way.
  json patch = {{"metadata",
                 {{"resourceVersion", (*created)["metadata"]["resourceVersion"]},
                  {"labels", {{"round", "3"}}}}}};
  EXPECT_EQ(client_->merge_patch(kSecret, "default", "cas", patch).error().code, Errc::conflict);
  auto cur = client_->get(kSecret, "default", "cas");
  patch["metadata"]["resourceVersion"] = (*cur)["metadata"]["resourceVersion"];
  auto ok = client_->merge_patch(kSecret, "default", "cas", patch);
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ((*ok)["metadata"]["labels"]["round"], "3");
}

TEST_F(KubeClientTest, VirtualMachineRunsAndDeleteTakesItsInstanceAlong) {
  ASSERT_TRUE(
      client_
          ->create(
              {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "tenants"}}}})
          .ok());
  // Allowlist the L4 with a PUT (this fake forbids patching the CR).
  auto cr = client_->get(kKubeVirt, "kubevirt", "kubevirt");
  ASSERT_TRUE(cr.ok());
  (*cr)["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"] = json::array(
      {{{"pciVendorSelector", "10DE:27B8"}, {"resourceName", "nvidia.com/AD104GL_L4"}}});
  auto upd = client_->update(*cr);
  ASSERT_TRUE(upd.ok()) << upd.error().message;

  ASSERT_TRUE(client_->create(runbook_vm()).ok());
  json vmi;
  ASSERT_TRUE(factory::testing::eventually(
      [&] {
        auto r = client_->get(kVirtualMachineInstance, "tenants", "tenant-1");
        if (!r || (*r)["status"].value("phase", "") != "Running") return false;
        vmi = *r;
        return true;
      },
      std::chrono::seconds(10)));
  EXPECT_EQ(vmi["status"]["nodeName"], "utho");
  EXPECT_FALSE(vmi["status"]["interfaces"][0]["ipAddress"].get<std::string>().empty());
  EXPECT_TRUE(client_->get(kDataVolume, "tenants", "tenant-1-root").ok());

  ASSERT_TRUE(client_->remove(kVirtualMachine, "tenants", "tenant-1").ok());
  EXPECT_EQ(client_->get(kVirtualMachineInstance, "tenants", "tenant-1").error().code,
            Errc::not_found);
  EXPECT_EQ(client_->get(kDataVolume, "tenants", "tenant-1-root").error().code, Errc::not_found);
}

TEST(KubeClientGroups, MissingApiGroupSaysWhatIsNotInstalled) {
  FakeKube kube({"--no-group", "cdi.kubevirt.io"});
  ASSERT_TRUE(kube.ok()) << kube.log();
  auto a = load_kubeconfig(kube.kubeconfig());
  ASSERT_TRUE(a.ok());
  KubeClient client(*a);
  auto r = client.get(kDataVolume, "default", "root");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::not_found);
  EXPECT_EQ(r.error().message, "the Kubernetes API at " + kube.url() +
                                   " does not serve datavolumes.cdi.kubevirt.io "
                                   "(cdi.kubevirt.io/v1beta1): is CDI installed?");
  // A kind Factory does not map is refused before any request.
  auto unknown =
      client.get(Kind{"snapshot.kubevirt.io/v1beta1", "VirtualMachineSnapshot"}, "x", "y");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.error().message.find("does not know the Kubernetes kind"), std::string::npos);
}

TEST_F(KubeClientTest, VersionAnswers) {
  auto v = client_->version();
  ASSERT_TRUE(v.ok()) << v.error().message;
  EXPECT_EQ((*v)["major"], "1");
}

}  // namespace
}  // namespace factory::kube
