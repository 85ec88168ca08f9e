// Issue 26's acceptance for Tenants as objects: `kubectl apply` of a Tenant
// gives a ready tenant, applying it again writes nothing, drift is reported
// and repaired, a spec edit that cannot apply is said, and deleting the
// Tenant removes every object once.
//
// What is real: `factory serve` (tenants.source: kubernetes, its Tenant
// controller, the KubeVirt provider), the factory-agent that enrolls with
// the token the controller's create wrote into the VM's Secret and runs its
// tier's plan.
// What stands in:
//   - tests/fakes/kube_apiserver.py for the host cluster's API server: the
//     Tenant CRD (objects validated by its schema, the status subresource,
//     metadata.generation moving with the spec only, finalizers holding a
//     deleted object, resourceVersion conflicts, watches with bookmarks),
//     KubeVirt's VirtualMachines, Secrets and Services; its request log is
//     how the writes are counted;
//   - the test's raw HTTPS calls for kubectl (create, merge patch, delete,
//     as kubectl sends them, with a bearer token: the double logs them
//     under another user than the coordinator's client certificate);
//   - the agent runs on an empty guest root of its own (the VM the fake
//     KubeVirt cannot boot), with a one-step tier that needs no GPU driver.
#include <fstream>

#include "tests/integration/tenant_fixture.hpp"

namespace factory::testing {
namespace {

using steady = std::chrono::steady_clock;

constexpr const char* kTenants = "/apis/factory.dev/v1alpha1/namespaces/tenants/tenants";

// One tier whose plan is one quick step: a tenant is ready as soon as its
// agent runs it.
const char* kQuickCatalog = R"(version: 1
tiers:
  - name: quick
    description: One step that ends at once.
    vm: {cpu: "2", memory: 4Gi, disk: 20Gi, image: "https://example.invalid/i.img", gpus: 1, gpu_resource: ""}
    steps:
      - id: hello
        kind: script
        timeout: 1m
        params:
          run: "true"
)";

json condition(const json& tenant, const std::string& type) {
  for (const auto& c : tenant.value("/status/conditions"_json_pointer, json::array()))
    if (c.value("type", "") == type) return c;
  return json::object();
}

class TenantController : public Tenants {
 protected:
  CoordinatorHarness& objects_coordinator() {
    if (!h_) {
      std::ofstream(dir_.path() / "quick.yaml") << kQuickCatalog;
      h_ = std::make_unique<CoordinatorHarness>(
          dir_.path(), "catalog: " + (dir_.path() / "quick.yaml").string() +
                           "\nkube:\n  kubeconfig: " + kube_.kubeconfig() +
                           "\ntenants:\n  source: kubernetes\n");
      h_->start();
    }
    return *h_;
  }
  json tenant_object(const std::string& name) {
    return kube_.get(std::string(kTenants) + "/" + name);
  }
  // Writes by the coordinator (not the test's own kubectl calls) from
  // request index `from` on.
  std::vector<std::string> coordinator_writes(std::size_t from) {
    std::vector<std::string> out;
    json all = kube_.requests();
    for (std::size_t i = from; i < all.size(); ++i) {
      const json& r = all[i];
      if (r.value("user", "") == "token-user" || r.value("method", "") == "GET") continue;
      out.push_back(r.value("method", "") + " " + r.value("path", ""));
    }
    return out;
  }
};

TEST_F(TenantController, ApplyGivesAReadyTenantAgainChangesNothingDeleteRemovesEveryObjectOnce) {
  allowlist();
  auto& h = objects_coordinator();

  // kubectl apply -f tenant.yaml (a first apply creates).
  const json manifest = {
      {"apiVersion", "factory.dev/v1alpha1"},
      {"kind", "Tenant"},
      {"metadata", {{"name", "t1"}, {"namespace", "tenants"}}},
      {"spec", {{"tier", "quick"}, {"sshKeys", json::array({{{"publicKey", kTestEd25519Key}}})}}}};
  // The tenants namespace, as the platform team made it with the CRD.
  json ns = kube_.post(
      "/api/v1/namespaces",
      {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "tenants"}}}});
  ASSERT_EQ(ns.value("kind", ""), "Namespace") << ns.dump();
  const auto applied_at = steady::now();
  json made = kube_.post(kTenants, manifest);
  ASSERT_EQ(made.value("kind", ""), "Tenant") << made.dump();

  // The controller takes it: its finalizer, then the VM and its objects.
  ASSERT_TRUE(eventually(
      [&] {
        json s = kube_.get("/api/v1/namespaces/tenants/secrets/t1-cloud-init");
        return s.is_object() && s.contains("data");
      },
      30s))
      << tenant_object("t1").dump(2) << kube_.requests().dump() << h.log();
  json t = tenant_object("t1");
  EXPECT_EQ(t["metadata"]["finalizers"], json::array({"factory.dev/tenant"})) << t.dump(2);
  ASSERT_TRUE(eventually(
      [&] { return condition(tenant_object("t1"), "Provisioned").value("status", "") == "True"; },
      30s))
      << tenant_object("t1").dump(2);
  EXPECT_EQ(condition(tenant_object("t1"), "Ready").value("status", ""), "False");
  EXPECT_EQ(tenant_object("t1")["status"].value("gpu", ""), kL4);

  // The VM "boots": its agent enrolls with the token in its Secret.
  json ud = live_user_data(kube_, "t1");
  AgentProcess agent(h, bootstrap_token_in(ud, h), on_empty_guest(dir_.path()));
  ASSERT_TRUE(eventually(
      [&] { return condition(tenant_object("t1"), "Ready").value("status", "") == "True"; }, 60s))
      << tenant_object("t1").dump(2) << "\n"
      << agent.log() << h.log();
  const double ready_s = std::chrono::duration<double>(steady::now() - applied_at).count();
  t = tenant_object("t1");
  EXPECT_EQ(t["status"]["phase"], "ready");
  EXPECT_EQ(condition(t, "AgentConnected").value("status", ""), "True");
  // The empty guest has no GPU on its bus: the agent's health diagnosis is
  // the Degraded condition's reason, its summary and fix the message.
  EXPECT_EQ(condition(t, "Degraded").value("status", ""), "True") << t.dump(2);
  EXPECT_EQ(condition(t, "Degraded").value("reason", ""), "GpuNotOnPciBus") << t.dump(2);
  EXPECT_FALSE(t["status"].contains("step")) << "the plan is done: " << t.dump(2);
  EXPECT_EQ(t["status"]["observedGeneration"], t["metadata"]["generation"]);
  // `kubectl get tenants`: the list shows it as the printer columns read it.
  json list = kube_.get(kTenants);
  ASSERT_EQ(list["items"].size(), 1u);
  EXPECT_EQ(list["items"][0]["status"]["phase"], "ready");

  // A second apply of the same file: zero writes by the coordinator over
  // more than a resync period (every Tenant is reconciled again in it).
  std::size_t mark = kube_.requests().size();
  json again = kube_.merge_patch(std::string(kTenants) + "/t1", {{"spec", manifest["spec"]}});
  ASSERT_TRUE(again.is_object() && again.contains("metadata")) << again.dump();
  std::this_thread::sleep_for(12s);
  auto writes = coordinator_writes(mark);
  EXPECT_TRUE(writes.empty()) << "the second apply wrote: " << json(writes).dump();
  const std::size_t reads_in_a_resync = kube_.requests().size() - mark;
  EXPECT_GT(reads_in_a_resync, 0u) << "the controller did not look again at all";

  // Drift: a person deletes the SSH Service and stops the VM by hand. Said in
  // the Degraded condition and put back within 60 s.
  const auto drift_at = steady::now();
  kube_.remove("/api/v1/namespaces/tenants/services/t1-ssh");
  kube_.merge_patch("/apis/kubevirt.io/v1/namespaces/tenants/virtualmachines/t1",
                    {{"spec", {{"runStrategy", "Halted"}}}});
  ASSERT_TRUE(eventually(
      [&] { return condition(tenant_object("t1"), "Degraded").value("reason", "") == "Repaired"; },
      60s))
      << tenant_object("t1").dump(2) << h.log();
  const double repaired_s = std::chrono::duration<double>(steady::now() - drift_at).count();
  const std::string said = condition(tenant_object("t1"), "Degraded").value("message", "");
  EXPECT_NE(said.find("Service tenants/t1-ssh is missing"), std::string::npos) << said;
  EXPECT_NE(said.find("VirtualMachine tenants/t1: spec.runStrategy is \"Halted\""),
            std::string::npos)
      << said;
  json svc = kube_.get("/api/v1/namespaces/tenants/services/t1-ssh");
  EXPECT_EQ(svc.value("kind", ""), "Service") << svc.dump();
  json vm = kube_.get("/apis/kubevirt.io/v1/namespaces/tenants/virtualmachines/t1");
  EXPECT_EQ(vm["spec"].value("runStrategy", ""), "Always") << vm.dump();
  EXPECT_NE(h.log().find("controller: tenant t1 was changed by hand"), std::string::npos)
      << h.log();

  // A spec edit a running tenant cannot take: said, nothing changed.
  json edited = kube_.merge_patch(std::string(kTenants) + "/t1", {{"spec", {{"memory", "8Gi"}}}});
  ASSERT_TRUE(edited.is_object()) << edited.dump();
  const auto generation = edited["metadata"]["generation"];
  ASSERT_TRUE(eventually(
      [&] {
        return condition(tenant_object("t1"), "Degraded").value("reason", "") == "SpecNotApplied";
      },
      30s))
      << tenant_object("t1").dump(2);
  t = tenant_object("t1");
  EXPECT_EQ(t["status"]["observedGeneration"], generation);
  EXPECT_NE(condition(t, "Degraded").value("message", "").find("memory \"4Gi\", not \"8Gi\""),
            std::string::npos)
      << t.dump(2);
  vm = kube_.get("/apis/kubevirt.io/v1/namespaces/tenants/virtualmachines/t1");
  EXPECT_EQ(vm.dump().find("8Gi"), std::string::npos) << "the VM was changed: " << vm.dump();
  // Put back as it was: what is said is the guest's own trouble again.
  kube_.merge_patch(std::string(kTenants) + "/t1", {{"spec", {{"memory", nullptr}}}});
  EXPECT_TRUE(eventually(
      [&] {
        return condition(tenant_object("t1"), "Degraded").value("reason", "") == "GpuNotOnPciBus";
      },
      30s))
      << tenant_object("t1").dump(2);

  // kubectl delete: the finalizer holds the Tenant until the tenant is gone;
  // every object deleted once; then the Tenant goes.
  mark = kube_.requests().size();
  kube_.remove(std::string(kTenants) + "/t1");
  ASSERT_TRUE(eventually([&] { return tenant_object("t1").value("kind", "") == "Status"; }, 30s))
      << tenant_object("t1").dump(2) << h.log();
  EXPECT_TRUE(objects_of(kube_, "tenants", "t1").empty())
      << json(objects_of(kube_, "tenants", "t1")).dump();
  std::map<std::string, int> deletes;
  for (const auto& w : coordinator_writes(mark))
    if (w.rfind("DELETE ", 0) == 0) ++deletes[w.substr(0, w.find('?'))];
  EXPECT_FALSE(deletes.empty());
  for (const auto& [path, n] : deletes) EXPECT_EQ(n, 1) << path << " deleted " << n << " times";
  auto gone = h.factory({"tenant", "show", "t1"});
  EXPECT_NE(gone.exit_code, 0) << gone.output;

  std::printf(
      "[tenant-objects] apply -> ready %.1f s (the agent's plan included); second apply: %zu "
      "writes; drift put back in %.1f s; delete: %zu objects, each deleted once\n",
      ready_s, writes.size(), repaired_s, deletes.size());
}

// A Tenant the schema lets through but the tier cannot take (a tier with a
// login and no key): said in its status in the Tenant's own words, nothing
// made, and not tried again at every event.
TEST_F(TenantController, ATenantItsTierCannotTakeIsSaidAndNothingIsMade) {
  allowlist();
  auto& h = objects_coordinator();
  json ns = kube_.post(
      "/api/v1/namespaces",
      {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "tenants"}}}});
  ASSERT_EQ(ns.value("kind", ""), "Namespace") << ns.dump();
  json made = kube_.post(kTenants, {{"apiVersion", "factory.dev/v1alpha1"},
                                    {"kind", "Tenant"},
                                    {"metadata", {{"name", "nokey"}, {"namespace", "tenants"}}},
                                    {"spec", {{"tier", "quick"}}}});
  ASSERT_EQ(made.value("kind", ""), "Tenant") << made.dump();
  ASSERT_TRUE(eventually(
      [&] {
        return condition(tenant_object("nokey"), "Degraded").value("reason", "") == "InvalidSpec";
      },
      30s))
      << tenant_object("nokey").dump(2) << h.log();
  json t = tenant_object("nokey");
  EXPECT_NE(condition(t, "Degraded").value("message", "").find("spec.sshKeys"), std::string::npos)
      << t.dump(2);
  EXPECT_EQ(t["status"]["phase"], "invalid");
  EXPECT_EQ(condition(t, "Provisioned").value("reason", ""), "InvalidSpec");
  EXPECT_TRUE(objects_of(kube_, "tenants", "nokey").empty());
  EXPECT_EQ(h.log().find("creating tenant nokey"), std::string::npos) << h.log();
}

}  // namespace
}  // namespace factory::testing
