// `factory tenant create|delete` with tenants.source: kubernetes (issue 26):
// the admin API writes and deletes the tenant's Tenant object, so the
// cluster's Tenants are the one source of truth. The real `factory` binary
// (the CLI, and `factory serve` through CoordinatorHarness) against the
// Kubernetes API test double (tests/fakes/kube_apiserver.py), which STANDS
// IN FOR the host cluster's kube-apiserver with the Tenant CRD installed
// (Tenants validated by the CRD's schema, finalizers that hold a deleted
// object until they are off, resourceVersion conflicts) and KubeVirt.
// Nothing runs the Tenant controller here: where a test needs its
// finalizer on a Tenant, the test puts it there, as the controller would.
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

#include "common/net/http_client.hpp"
#include "common/yaml_json.hpp"
#include "coordinator/kube/client.hpp"
#include "coordinator/tenants/tenant_objects.hpp"
#include "coordinator/tenants/tenant_resource.hpp"
#include "tests/integration/tenant_fixture.hpp"

using namespace factory::testing;
using namespace std::chrono_literals;
using factory::CommandResult;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr const char* kTenantsPath = "/apis/factory.dev/v1alpha1/namespaces/tenants/tenants";

std::string tenant_path(const std::string& name) {
  return std::string(kTenantsPath) + "/" + name;
}

// The requests the double has seen with this method and path.
int requests_to(const FakeKube& kube, const std::string& method, const std::string& path) {
  json seen = kube.control("/_fake/requests", json::object(), "GET");
  int n = 0;
  for (const auto& r : seen.value("requests", json::array())) {
    std::string p = r.value("path", "");
    p = p.substr(0, p.find('?'));
    if (r.value("method", "") == method && p == path) ++n;
  }
  return n;
}

std::vector<json> yaml_documents(const std::string& text) {
  std::vector<json> docs;
  std::string chunk;
  auto flush = [&] {
    auto j = factory::parse_yaml(chunk, "doc");
    if (j.ok() && j->is_object()) docs.push_back(*j);
    chunk.clear();
  };
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line == "---")
      flush();
    else
      chunk += line + "\n";
  }
  flush();
  return docs;
}

class TenantApiObjects : public Tenants {
 protected:
  void SetUp() override {
    Tenants::SetUp();
    // The coordinator of Tenants::coordinator(), with its tenants in the cluster.
    h_ = std::make_unique<CoordinatorHarness>(
        dir_.path(),
        "kube:\n  kubeconfig: " + kube_.kubeconfig() + "\ntenants:\n  source: kubernetes\n");
    h_->start();
  }

  factory::kube::KubeClient client() {
    auto c = factory::kube::connect({kube_.kubeconfig(), ""});
    EXPECT_TRUE(c.ok()) << c.error().message;
    return std::move(*c);
  }

  // POST /v1/tenants straight to the API: its status and body.
  std::pair<int, json> post_tenant(const json& body) {
    factory::net::HttpClient c({.ca_pem = slurp(coordinator().state_dir() / "ca.crt")});
    factory::net::HttpRequest req;
    req.method = "POST";
    req.url = "https://127.0.0.1:" + std::to_string(coordinator().api_port()) + "/v1/tenants";
    req.body = body.dump();
    req.headers["Authorization"] = "Bearer " + coordinator().admin_token();
    req.headers["Content-Type"] = "application/json";
    auto r = c.request(req);
    EXPECT_TRUE(r.ok()) << r.error().message;
    if (!r) return {0, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  }
};

TEST_F(TenantApiObjects, CreateWritesTheTenantAndASecondCreateWritesNothing) {
  allowlist();
  auto r = create("tenant-1", "gpu-vm", {"--memory", "16Gi"});
  ASSERT_EQ(r.exit_code, 0) << r.output << coordinator().log();
  EXPECT_NE(r.output.find("wrote Tenant tenants/tenant-1"), std::string::npos) << r.output;
  const std::string password = password_from(r.output);
  ASSERT_EQ(password.size(), 20u) << "the CLI still gets the password: " << r.output;

  // The Tenant as the API server holds it: the request, read back by the
  // same rules the controller reads it with; labelled as the API's; no password.
  json tenant = kube_.get(tenant_path("tenant-1"));
  ASSERT_EQ(tenant.value("kind", ""), "Tenant") << tenant.dump();
  EXPECT_EQ(tenant["metadata"]["labels"][factory::tenants::kTenantWrittenByLabel],
            factory::tenants::kTenantWrittenByApi);
  EXPECT_EQ(tenant.dump().find(password), std::string::npos);
  auto read = factory::tenants::tenant_from_object(tenant);
  ASSERT_TRUE(read.ok()) << read.error().message;
  EXPECT_EQ(read->request.name, "tenant-1");
  EXPECT_EQ(read->request.ns, "tenants");
  EXPECT_EQ(read->request.tier, "gpu-vm");
  EXPECT_EQ(read->request.memory, "16Gi");
  EXPECT_EQ(read->request.ssh_authorized_keys, std::vector<std::string>{kTestEd25519Key});
  // And the tenant itself, as without Tenants.
  const auto objects = objects_of(kube_, "tenants", "tenant-1");
  for (const char* o :
       {"virtualmachines/tenant-1", "secrets/tenant-1-cloud-init", "services/tenant-1-ssh"})
    EXPECT_NE(std::find(objects.begin(), objects.end(), o), objects.end())
        << o << " in " << json(objects).dump();
  EXPECT_EQ(show("tenant-1").value("phase", ""), "pending");

  // The same create again: the Tenant is confirmed, not written (the API
  // never PATCHes or PUTs a Tenant: what does is the controller's); the
  // tenant exists already.
  auto again = create("tenant-1", "gpu-vm", {"--memory", "16Gi"});
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("exists already"), std::string::npos) << again.output;
  EXPECT_EQ(again.output.find("wrote Tenant"), std::string::npos) << again.output;
  EXPECT_EQ(requests_to(kube_, "POST", kTenantsPath), 1);
  EXPECT_EQ(kube_.get(tenant_path("tenant-1"))["spec"], tenant["spec"]);
  // What the coordinator writes is unchanged; the KubeVirt double's own
  // controller may meanwhile have made the VM's instance and volume.
  auto written = [](std::vector<std::string> all) {
    std::erase_if(all, [](const std::string& o) {
      return o.starts_with("virtualmachineinstances/") || o.starts_with("datavolumes/");
    });
    return all;
  };
  EXPECT_EQ(written(objects_of(kube_, "tenants", "tenant-1")), written(objects));
}

TEST_F(TenantApiObjects, ATenantAskingSomethingElseIsRefusedWith409AndWhatToDo) {
  allowlist();
  // A Tenant a platform team applied by hand, with 8Gi.
  auto c = client();
  ASSERT_TRUE(
      c.create({{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "tenants"}}}})
          .ok());
  auto made = c.create({{"apiVersion", "factory.dev/v1alpha1"},
                        {"kind", "Tenant"},
                        {"metadata", {{"name", "tenant-1"}, {"namespace", "tenants"}}},
                        {"spec",
                         {{"tier", "gpu-vm"},
                          {"memory", "8Gi"},
                          {"sshKeys", json::array({json{{"publicKey", kTestEd25519Key}}})}}}});
  ASSERT_TRUE(made.ok()) << made.error().message;

  auto r = create("tenant-1", "gpu-vm", {"--memory", "16Gi"});
  expect_one_line_failure(r, "spec.memory: the Tenant has \"8Gi\", this create asks \"16Gi\"");
  EXPECT_NE(r.output.find("`kubectl edit tenant tenant-1 -n tenants`"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("`kubectl delete tenant tenant-1 -n tenants`"), std::string::npos)
      << r.output;
  // The API's status for it. The Tenant is as it was, and no tenant runs
  // with what the refused create asked (a Tenant controller, where one
  // runs, makes the Tenant's own, 8Gi).
  auto [status, body] = post_tenant({{"name", "tenant-1"},
                                     {"tier", "gpu-vm"},
                                     {"memory", "16Gi"},
                                     {"ssh_authorized_keys", {kTestEd25519Key}}});
  EXPECT_EQ(status, 409) << body.dump();
  EXPECT_NE(body.dump().find("asks for something else"), std::string::npos) << body.dump();
  json after = kube_.get(tenant_path("tenant-1"));
  EXPECT_EQ(after["spec"], (*made)["spec"]);
  EXPECT_FALSE(after["metadata"].contains("labels")) << "not taken over: " << after.dump();
  EXPECT_EQ(requests_to(kube_, "POST", kTenantsPath), 1) << "only the hand-made one";
  for (const auto& t : tenants()) EXPECT_NE(t["spec"].value("memory", ""), "16Gi") << t.dump();

  // A create asking what the Tenant asks is that Tenant's: confirmed, not
  // written, and the tenant made (or found made).
  auto same = post_tenant({{"name", "tenant-1"},
                           {"tier", "gpu-vm"},
                           {"memory", "8Gi"},
                           {"ssh_authorized_keys", {kTestEd25519Key}}});
  EXPECT_TRUE(same.first == 201 || same.first == 200) << same.first << same.second.dump();
  EXPECT_FALSE(same.second.contains("tenant_object")) << "it was not written by this create";
  EXPECT_EQ(requests_to(kube_, "POST", kTenantsPath), 1);
  EXPECT_EQ(kube_.get(tenant_path("tenant-1"))["spec"], (*made)["spec"]);
  EXPECT_EQ(show("tenant-1")["spec"].value("memory", ""), "8Gi");
}

TEST_F(TenantApiObjects, DeleteRemovesTheTenantPastItsFinalizerAndEveryObjectOnce) {
  allowlist();
  auto r = create("tenant-1", "gpu-vm");
  ASSERT_EQ(r.exit_code, 0) << r.output << coordinator().log();
  ASSERT_FALSE(objects_of(kube_, "tenants", "tenant-1").empty());
  // The controller's finalizer, and another controller's that must stay.
  json marked = kube_.merge_patch(
      tenant_path("tenant-1"),
      {{"metadata", {{"finalizers", {factory::tenants::kTenantFinalizer, "example.com/audit"}}}}});
  ASSERT_EQ(marked["metadata"]["finalizers"].size(), 2u) << marked.dump();

  auto d = coordinator().factory({"tenant", "delete", "tenant-1"});
  ASSERT_EQ(d.exit_code, 0) << d.output << coordinator().log();
  EXPECT_NE(d.output.find("deleted Tenant tenants/tenant-1"), std::string::npos) << d.output;
  EXPECT_TRUE(objects_of(kube_, "tenants", "tenant-1").empty())
      << json(objects_of(kube_, "tenants", "tenant-1")).dump();
  EXPECT_TRUE(tenant_names().empty());
  // Held only by the other finalizer now: being deleted, ours off.
  json held = kube_.get(tenant_path("tenant-1"));
  EXPECT_FALSE(held["metadata"].value("deletionTimestamp", "").empty()) << held.dump();
  EXPECT_EQ(held["metadata"]["finalizers"], json::array({"example.com/audit"})) << held.dump();
  // Each object of the tenant was deleted once, the Tenant once.
  EXPECT_EQ(requests_to(kube_, "DELETE", tenant_path("tenant-1")), 1);
  for (const auto& path : {"/apis/kubevirt.io/v1/namespaces/tenants/virtualmachines/tenant-1",
                           "/api/v1/namespaces/tenants/secrets/tenant-1-cloud-init",
                           "/api/v1/namespaces/tenants/services/tenant-1-ssh"})
    EXPECT_EQ(requests_to(kube_, "DELETE", path), 1) << path;

  // The other finalizer off: the Tenant goes.
  kube_.merge_patch(tenant_path("tenant-1"), {{"metadata", {{"finalizers", json::array()}}}});
  EXPECT_EQ(kube_.get(tenant_path("tenant-1")).value("code", 0), 404);

  // A Tenant already deleted with kubectl: the delete removes the tenant
  // all the same.
  auto r2 = create("tenant-2", "gpu-vm");
  ASSERT_EQ(r2.exit_code, 0) << r2.output;
  ASSERT_TRUE(client().remove(factory::kube::kTenant, "tenants", "tenant-2").ok());
  auto d2 = coordinator().factory({"tenant", "delete", "tenant-2"});
  ASSERT_EQ(d2.exit_code, 0) << d2.output;
  EXPECT_TRUE(objects_of(kube_, "tenants", "tenant-2").empty());
  EXPECT_TRUE(tenant_names().empty());
}

TEST_F(TenantApiObjects, ARefusedCreateLeavesNoTenantBehind) {
  // No card allowlisted: the create is refused after its Tenant was
  // written, and takes it back, or the controller would make the tenant.
  auto r = create("tenant-1", "gpu-vm");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_EQ(kube_.get(tenant_path("tenant-1")).value("code", 0), 404)
      << kube_.get(tenant_path("tenant-1")).dump();
  EXPECT_EQ(requests_to(kube_, "POST", kTenantsPath), 1) << "it was written, then deleted";
  EXPECT_TRUE(tenant_names().empty());
  // Bad input is refused before anything is written.
  auto bad = create("tenant-2", "gpu-xl");
  expect_one_line_failure(bad, "unknown tier 'gpu-xl'");
  EXPECT_EQ(requests_to(kube_, "POST", kTenantsPath), 1);
}

// A cluster without the Tenant CRD: the create says what to install, in
// one line, and makes no VM.
TEST(TenantApiObjectsNoCrd, CreateSaysHowToInstallTheTenantResource) {
  TempDir dir("tenant-objects-no-crd");
  FakeKube kube({"--vfio-cards", "10DE:27B8=2", "--no-group", "factory.dev"});
  ASSERT_TRUE(kube.ok()) << kube.log();
  write_text(dir / "admin.pub", std::string(kTestEd25519Key) + "\n");
  CoordinatorHarness h(dir.path(), "kube:\n  kubeconfig: " + kube.kubeconfig() +
                                       "\ntenants:\n  source: kubernetes\n");
  h.start();
  auto r = h.factory({"tenant", "create", "tenant-1", "--tier", "gpu-vm", "--ssh-key",
                      (dir / "admin.pub").string()});
  expect_one_line_failure(
      r,
      "does not serve tenants.factory.dev (factory.dev/v1alpha1): is its "
      "CustomResourceDefinition installed? (`factory install crds | kubectl apply -f -`");
  EXPECT_EQ(
      kube.get("/apis/kubevirt.io/v1/namespaces/tenants/virtualmachines/tenant-1").value("code", 0),
      404);
}

TEST(TenantApiObjectsDryRun, PrintsTheTenantFirstWhenTenantsAreInTheCluster) {
  TempDir dir("tenant-objects-dry");
  write_text(dir / "admin.pub", std::string(kTestEd25519Key) + "\n");
  write_text(dir / "coordinator.yaml",
             "state_dir: " + (dir / "state").string() +
                 "\nexternal_url: wss://factory.example:8443\napi:\n  listen: 127.0.0.1:" +
                 std::to_string(free_loopback_port()) + "\nkube:\n  kubeconfig: " +
                 (dir / "no-such-kubeconfig").string() + "\ntenants:\n  source: kubernetes\n");
  const std::vector<std::string> base = {
      factory_bin(), "--config",  (dir / "coordinator.yaml").string(),
      "tenant",      "create",    "tenant-1",
      "--tier",      "gpu-vm",    "--memory",
      "16Gi",        "--ssh-key", (dir / "admin.pub").string(),
      "--dry-run"};
  auto yaml_args = base;
  yaml_args.insert(yaml_args.end(), {"-o", "yaml"});
  auto y = run(yaml_args, 30s);
  ASSERT_EQ(y.exit_code, 0) << y.output;
  EXPECT_FALSE(fs::exists(dir / "state")) << "a dry run stores nothing";
  auto docs = yaml_documents(y.output);
  ASSERT_EQ(docs.size(), 5u) << y.output;
  EXPECT_EQ(docs[0]["kind"], "Tenant");
  EXPECT_EQ(docs[1]["kind"], "Namespace");
  EXPECT_EQ(docs[3]["kind"], "VirtualMachine");
  EXPECT_EQ(docs[0]["metadata"]["namespace"], "tenants");
  EXPECT_EQ(docs[0]["metadata"]["labels"][factory::tenants::kTenantWrittenByLabel],
            factory::tenants::kTenantWrittenByApi);
  auto read = factory::tenants::tenant_from_object(docs[0]);
  ASSERT_TRUE(read.ok()) << read.error().message;
  EXPECT_EQ(read->request.memory, "16Gi");
  EXPECT_EQ(read->request.ssh_authorized_keys, std::vector<std::string>{kTestEd25519Key});
  EXPECT_NE(y.output.find("# The Tenant first"), std::string::npos) << y.output;

  // -o json: the same List, the Tenant as items[0].
  auto json_args = base;
  json_args.insert(json_args.end(), {"-o", "json"});
  auto j = run(json_args, 30s);
  ASSERT_EQ(j.exit_code, 0) << j.output;
  auto list = json::parse(j.output, nullptr, false);
  ASSERT_EQ(list.value("kind", ""), "List") << j.output;
  ASSERT_EQ(list["items"].size(), 5u);
  EXPECT_EQ(list["items"][0], docs[0]);
  EXPECT_EQ(list["items"][4]["kind"], "Service");
}

}  // namespace
