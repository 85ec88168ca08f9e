// Tenants end to end: the real `factory` binary (the CLI, and `factory serve`
// through CoordinatorHarness) against the fake Kubernetes API server
// (tests/fakes/kube_apiserver.py), which STANDS IN FOR the host cluster's
// kube-apiserver and KubeVirt: it validates every object against the real
// KubeVirt/CDI OpenAPI schemas and python3-kubernetes' models, refuses
// clashing node ports, advertises the runbook host's two L4s on vfio-pci once
// they are allowlisted, and runs a VMI for each VM whose GPU is free. The
// objects are compared with the runbook's manifests (tests/fixtures/runbook).
// Issue 4's acceptance: dry run, two tenants, the third refused with the
// reason, delete leaving nothing, bad input leaving nothing half-made.
#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <fstream>
#include <sstream>

#include "common/atomic_file.hpp"
#include "common/pki.hpp"
#include "common/yaml_json.hpp"
#include "contract/catalog.hpp"
#include "coordinator/kube/client.hpp"
#include "coordinator/tenants/request.hpp"
#include "tests/integration/event_reader.hpp"
#include "tests/integration/tenant_fixture.hpp"

using namespace factory::testing;
using namespace std::chrono_literals;
using factory::CommandResult;
using nlohmann::json;
namespace fs = std::filesystem;

TEST(TenantsDryRun, PrintsValidObjectsAndContactsNothing) {
  TempDir dir("tenants-dry");
  // The admin's key where ssh-keygen puts it; no --ssh-key needed.
  fs::create_directories(dir / "home" / ".ssh");
  write_text(dir / "home" / ".ssh" / "id_ed25519.pub", std::string(kTestEd25519Key) + "\n");
  // A config whose coordinator and cluster do not exist: a dry run must not
  // need either, nor create the state directory.
  write_text(dir / "coordinator.yaml",
             "state_dir: " + (dir / "state").string() +
                 "\nexternal_url: wss://factory.example:8443\napi:\n  listen: 127.0.0.1:" +
                 std::to_string(free_loopback_port()) +
                 "\nkube:\n  kubeconfig: " + (dir / "no-such-kubeconfig").string() + "\n");
  auto r = run({factory_bin(), "--config", (dir / "coordinator.yaml").string(), "tenant", "create",
                "tenant-1", "--tier", "gpu-vm", "--dry-run", "-o", "yaml"},
               30s, {{"HOME", (dir / "home").string()}});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(fs::exists(dir / "state")) << "a dry run stores nothing";
  EXPECT_NE(r.output.find("# PLACEHOLDERS"), std::string::npos) << r.output;

  write_text(dir / "objects.yaml", r.output);
  auto v = validate_k8s_files({(dir / "objects.yaml").string()});
  EXPECT_EQ(v.exit_code, 0) << v.output;
  EXPECT_NE(v.output.find("doc 3 (VirtualMachine tenant-1): valid"), std::string::npos) << v.output;
  EXPECT_NE(v.output.find("doc 2 (Secret tenant-1-cloud-init): valid"), std::string::npos)
      << v.output;

  // The documents in creation order, and the Secret's user-data as cloud-init reads it.
  std::vector<json> docs;
  {
    std::string chunk;
    std::istringstream in(r.output);
    std::string line;
    auto flush = [&] {
      auto j = factory::parse_yaml(chunk, "doc");
      if (j.ok() && j->is_object()) docs.push_back(*j);
      chunk.clear();
    };
    while (std::getline(in, line)) {
      if (line == "---")
        flush();
      else
        chunk += line + "\n";
    }
    flush();
  }
  ASSERT_EQ(docs.size(), 4u) << r.output;
  EXPECT_EQ(docs[0]["kind"], "Namespace");
  EXPECT_EQ(docs[1]["kind"], "Secret");
  EXPECT_EQ(docs[2]["kind"], "VirtualMachine");
  EXPECT_EQ(docs[3]["kind"], "Service");
  const std::string userdata = docs[1]["stringData"]["userdata"].get<std::string>();
  write_text(dir / "userdata.yaml", userdata);
  auto ci = cloud_init_schema(dir / "userdata.yaml");
  EXPECT_EQ(ci.exit_code, 0) << ci.output << "\n" << userdata;
  for (auto p :
       {factory::tenants::kBootstrapTokenPlaceholder, factory::tenants::kPasswordPlaceholder,
        factory::tenants::kCaPemPlaceholder, factory::tenants::kAgentSha256Placeholder})
    EXPECT_NE(userdata.find(p), std::string::npos) << "placeholder " << p << " not marked";
  EXPECT_NE(userdata.find(kTestEd25519Key), std::string::npos) << "the admin's key from ~/.ssh";
  EXPECT_NE(userdata.find("wss://factory.example:8443"), std::string::npos);
  EXPECT_NE(userdata.find("https://factory.example:8443/v1/agent/binary"), std::string::npos);
  // "any allowlisted" GPU: a marked placeholder the header explains.
  EXPECT_EQ(docs[2]["spec"]["template"]["spec"]["domain"]["devices"]["gpus"][0]["deviceName"],
            factory::tenants::kAnyAllowlistedGpuPlaceholder);
  EXPECT_NE(
      r.output.find(std::string("deviceName ") + factory::tenants::kAnyAllowlistedGpuPlaceholder),
      std::string::npos);

  // -o json: the same objects as a v1 List; --gpu-resource names the card.
  auto j = run({factory_bin(), "--config", (dir / "coordinator.yaml").string(), "tenant", "create",
                "tenant-2", "--tier", "gpu-k8s", "--dry-run", "-o", "json", "--gpu-resource", kL4,
                "--ssh-node-port", "30023", "--ssh-key",
                (dir / "home" / ".ssh" / "id_ed25519.pub").string()},
               30s, {{"HOME", (dir / "nohome").string()}});
  ASSERT_EQ(j.exit_code, 0) << j.output;
  auto list = json::parse(j.output);
  ASSERT_EQ(list["kind"], "List");
  ASSERT_EQ(list["items"].size(), 4u);
  EXPECT_EQ(
      list["items"][2]["spec"]["template"]["spec"]["domain"]["devices"]["gpus"][0]["deviceName"],
      kL4);
  EXPECT_EQ(list["items"][3]["spec"]["ports"][0]["nodePort"], 30023);
  EXPECT_EQ(list["items"][2]["metadata"]["labels"]["factory.dev/tier"], "gpu-k8s");

  // No key anywhere: one line saying what to pass.
  auto nokey = run({factory_bin(), "--config", (dir / "coordinator.yaml").string(), "tenant",
                    "create", "tenant-1", "--tier", "gpu-vm", "--dry-run"},
                   30s, {{"HOME", (dir / "nohome").string()}});
  expect_one_line_failure(nokey, "pass --ssh-key FILE");
}

// Issue 13's acceptance: the MIG tier's objects are what the strict schemas
// accept, as every tier's are.
TEST(TenantsDryRun, TheMigTierValidatesAgainstTheRealSchemas) {
  TempDir dir("tenants-dry-mig");
  fs::create_directories(dir / "home" / ".ssh");
  write_text(dir / "home" / ".ssh" / "id_ed25519.pub", std::string(kTestEd25519Key) + "\n");
  write_text(dir / "coordinator.yaml",
             "state_dir: " + (dir / "state").string() +
                 "\nexternal_url: wss://factory.example:8443\napi:\n  listen: 127.0.0.1:" +
                 std::to_string(free_loopback_port()) +
                 "\nkube:\n  kubeconfig: " + (dir / "no-such-kubeconfig").string() + "\n");
  auto r = run({factory_bin(), "--config", (dir / "coordinator.yaml").string(), "tenant", "create",
                "t3", "--tier", "gpu-k8s-mig", "--dry-run", "-o", "yaml"},
               30s, {{"HOME", (dir / "home").string()}});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  write_text(dir / "objects.yaml", r.output);
  auto v = validate_k8s_files({(dir / "objects.yaml").string()});
  EXPECT_EQ(v.exit_code, 0) << v.output;
  EXPECT_NE(v.output.find("doc 3 (VirtualMachine t3): valid"), std::string::npos) << v.output;
  EXPECT_NE(v.output.find("doc 2 (Secret t3-cloud-init): valid"), std::string::npos) << v.output;
  EXPECT_NE(r.output.find("factory.dev/tier: \"gpu-k8s-mig\""), std::string::npos) << r.output;
}

// A card without MIG is refused for the MIG tier before anything is made,
// with the reason; the runbook's L4 is such a card.
TEST_F(Tenants, TheMigTierIsRefusedOnTheRunbooksL4WithTheReason) {
  allowlist();
  auto t3 = create("t3", "gpu-k8s-mig");
  ASSERT_NE(t3.exit_code, 0) << t3.output;
  EXPECT_NE(t3.output.find("tier gpu-k8s-mig needs a MIG-capable GPU"), std::string::npos)
      << t3.output;
  EXPECT_NE(t3.output.find("nvidia.com/AD104GL_L4"), std::string::npos) << t3.output;
  EXPECT_NE(t3.output.find("has no MIG"), std::string::npos) << t3.output;
  EXPECT_TRUE(tenants().empty()) << "a refused create stores nothing";
  // The same L4 still serves a tier without MIG.
  auto t1 = create("tenant-1", "gpu-vm");
  EXPECT_EQ(t1.exit_code, 0) << t1.output;
}

TEST_F(Tenants, TwoTenantsMatchTheRunbookAThirdIsRefusedAndDeleteLeavesNothing) {
  allowlist();
  auto t1 = create("tenant-1", "gpu-vm", {"--ssh-node-port", "30022"});
  ASSERT_EQ(t1.exit_code, 0) << t1.output << coordinator().log();
  EXPECT_NE(t1.output.find("tenant tenant-1 created: tier gpu-vm, 1 x nvidia.com/AD104GL_L4, "
                           "namespace tenants, SSH node port 30022"),
            std::string::npos)
      << t1.output;
  auto t2 = create("tenant-2", "gpu-k8s", {"--ssh-node-port", "30023"});
  ASSERT_EQ(t2.exit_code, 0) << t2.output << coordinator().log();

  // The objects as the cluster holds them: valid for a strict server...
  std::vector<std::string> files;
  for (const std::string t : {"tenant-1", "tenant-2"}) {
    for (const auto& [path, kind] : std::vector<std::pair<std::string, std::string>>{
             {"/apis/kubevirt.io/v1/namespaces/tenants/virtualmachines/" + t, "vm"},
             {"/api/v1/namespaces/tenants/secrets/" + t + "-cloud-init", "secret"},
             {"/api/v1/namespaces/tenants/services/" + t + "-ssh", "service"}}) {
      json obj = kube_.get(path);
      ASSERT_EQ(obj.value("kind", ""), kind == "vm"       ? "VirtualMachine"
                                       : kind == "secret" ? "Secret"
                                                          : "Service")
          << obj.dump();
      auto f = dir_ / (t + "-" + kind + ".yaml");
      write_text(f, factory::to_yaml(obj));
      files.push_back(f.string());
    }
  }
  auto v = validate_k8s_files(files);
  EXPECT_EQ(v.exit_code, 0) << v.output;

  // ...and the runbook's manifests, field for field where it gives them.
  json vm1 = kube_.get("/apis/kubevirt.io/v1/namespaces/tenants/virtualmachines/tenant-1");
  expect_superset(load_runbook_fixture("tenant-1-virtualmachine.yaml"), vm1, "tenant-1 VM");
  json vm2 = kube_.get("/apis/kubevirt.io/v1/namespaces/tenants/virtualmachines/tenant-2");
  expect_superset(replace_in_strings(load_runbook_fixture("tenant-1-virtualmachine.yaml"),
                                     "tenant-1", "tenant-2"),
                  vm2, "tenant-2 VM");
  expect_superset(load_runbook_fixture("tenant-1-ssh-service.yaml"),
                  kube_.get("/api/v1/namespaces/tenants/services/tenant-1-ssh"),
                  "tenant-1 Service");
  json svc2 = load_runbook_fixture("tenant-1-ssh-service.yaml");
  svc2 = replace_in_strings(svc2, "tenant-1", "tenant-2");
  svc2["spec"]["ports"][0]["nodePort"] = 30023;
  expect_superset(svc2, kube_.get("/api/v1/namespaces/tenants/services/tenant-2-ssh"),
                  "tenant-2 Service");

  // The Secret: the runbook's user-data with its placeholders filled in (the
  // password printed once by create, the admin's key), plus the agent's files.
  json secret_fixture = load_runbook_fixture("tenant-1-cloud-init-secret.yaml");
  json secret1 = kube_.get("/api/v1/namespaces/tenants/secrets/tenant-1-cloud-init");
  expect_superset(secret_fixture["metadata"], secret1["metadata"], "tenant-1 Secret metadata");
  auto runbook_ud =
      factory::parse_yaml(secret_fixture["stringData"]["userdata"].get<std::string>(), "runbook");
  ASSERT_TRUE(runbook_ud.ok());
  const std::string password = password_from(t1.output);
  ASSERT_EQ(password.size(), 20u) << t1.output;
  json want_ud = replace_in_strings(*runbook_ud, "<generated>", password);
  want_ud = replace_in_strings(want_ud, "<your public key>", kTestEd25519Key);
  json ud1 = live_user_data(kube_, "tenant-1");
  expect_superset(want_ud, ud1, "tenant-1 user-data");
  write_text(dir_ / "ud1.yaml", b64decode(secret1["data"].value("userdata", "")));
  auto ci = cloud_init_schema(dir_ / "ud1.yaml");
  EXPECT_EQ(ci.exit_code, 0) << ci.output;
  // The password is printed once and kept nowhere but the Secret.
  EXPECT_EQ(coordinator().log().find(password), std::string::npos);
  // What the agent needs: this coordinator's CA, a one-time token for this
  // tenant, the SHA-256 of the agent binary it serves.
  EXPECT_EQ(write_file_content(ud1, "/etc/factory/ca.crt"),
            slurp(coordinator().state_dir() / "ca.crt"));
  auto bin = factory::read_file(agent_bin());
  ASSERT_TRUE(bin.ok());
  EXPECT_EQ(write_file_content(ud1, "/etc/factory/agent.sha256"),
            factory::pki::sha256_hex(*bin) + "  /usr/local/bin/factory-agent\n");
  const std::string token = write_file_content(ud1, "/etc/factory/bootstrap-token");
  ASSERT_NE(token.find('.'), std::string::npos) << token;
  bool active = false;
  for (const auto& t : token_list())
    if (t.value("id", "") == token.substr(0, token.find('.')))
      active = t.value("tenant", "") == "tenant-1" && t.value("state", "") == "active";
  EXPECT_TRUE(active) << token_list().dump();
  EXPECT_EQ(coordinator().log().find(token.substr(token.find('.') + 1)), std::string::npos)
      << "the token's secret half must never be logged";

  // The coordinator's view: both recorded, their VMs running on the node.
  auto names = tenant_names();
  EXPECT_EQ(names, (std::vector<std::string>{"tenant-1", "tenant-2"}));
  json s1;
  ASSERT_TRUE(eventually(
      [&] {
        s1 = show("tenant-1");
        return s1["vm"].value("phase", "") == "Running";
      },
      10s, 100ms))
      << s1.dump(2);
  EXPECT_EQ(s1["phase"], "pending");
  EXPECT_EQ(s1["tier"], "gpu-vm");
  EXPECT_EQ(s1["spec"]["gpu_resource"], kL4);
  EXPECT_EQ(s1["vm"]["node"], "utho");
  EXPECT_FALSE(s1["vm"].value("ip", "").empty());
  EXPECT_EQ(s1["vm"]["ssh_node_port"], 30022);
  EXPECT_EQ(s1["kube"]["state"], "created");
  // The plan the agent will be sent, step by step, in the catalog's order.
  auto cat = factory::catalog::builtin();
  ASSERT_TRUE(cat.ok());
  json plan = (*cat).find("gpu-vm")->plan();
  ASSERT_EQ(s1["plan_steps"].size(), plan["steps"].size());
  for (size_t i = 0; i < plan["steps"].size(); ++i) {
    EXPECT_EQ(s1["plan_steps"][i]["id"], plan["steps"][i]["id"]);
    EXPECT_EQ(s1["plan_steps"][i]["state"], "pending");
  }
  auto table = coordinator().factory({"tenant", "show", "tenant-1"});
  EXPECT_EQ(table.exit_code, 0) << table.output;
  EXPECT_NE(table.output.find("VMI Running on utho"), std::string::npos) << table.output;

  // Two cards, two tenants: a third single-card VM can never schedule.
  auto t3 = create("tenant-3", "gpu-vm");
  expect_one_line_failure(t3,
                          "no free nvidia.com/AD104GL_L4: 2 allocatable, 2 in use by tenant-1, "
                          "tenant-2");
  EXPECT_TRUE(objects_of(kube_, "tenants", "tenant-3").empty());
  EXPECT_EQ(tenant_names().size(), 2u);

  // A create run again for a tenant that is complete changes nothing.
  auto again = create("tenant-1", "gpu-vm", {"--ssh-node-port", "30022"});
  EXPECT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("exists already"), std::string::npos) << again.output;
  EXPECT_EQ(password_from(again.output), "") << "no second password";
  EXPECT_EQ(live_user_data(kube_, "tenant-1"), ud1) << "the Secret was not rewritten";
  auto differs = create("tenant-1", "gpu-k8s");
  expect_one_line_failure(differs, "exists with a different spec (tier");

  // Delete: nothing of either tenant is left, in any kind the cluster has.
  for (const std::string t : {"tenant-1", "tenant-2"}) {
    auto d = coordinator().factory({"tenant", "delete", t});
    EXPECT_EQ(d.exit_code, 0) << d.output;
    EXPECT_NE(d.output.find("tenant " + t + " deleted"), std::string::npos) << d.output;
  }
  EXPECT_EQ(everything_in(kube_, "tenants"), std::vector<std::string>{});
  EXPECT_TRUE(tenant_names().empty());
  for (const auto& t : token_list())
    EXPECT_NE(t.value("state", ""), "active") << "a token outlived its tenant: " << t.dump();
  auto twice = coordinator().factory({"tenant", "delete", "tenant-1"});
  EXPECT_EQ(twice.exit_code, 0) << twice.output;
  EXPECT_NE(twice.output.find("nothing to delete"), std::string::npos) << twice.output;

  // The cards are free again: the third tenant fits now.
  auto t3b = create("tenant-3", "gpu-vm");
  EXPECT_EQ(t3b.exit_code, 0) << t3b.output;
}

TEST_F(Tenants, BadInputGetsOneLineAndLeavesNothingHalfMade) {
  allowlist();
  ASSERT_EQ(create("tenant-1", "gpu-vm", {"--ssh-node-port", "30022"}).exit_code, 0);
  // Once the fake KubeVirt has made the VM's VMI and DataVolume, nothing moves.
  ASSERT_TRUE(eventually([&] { return everything_in(kube_, "tenants").size() == 5; }, 5s))
      << ::testing::PrintToString(everything_in(kube_, "tenants"));
  const auto before = everything_in(kube_, "tenants");

  expect_one_line_failure(
      create("tenant-x", "gpu-xl"),
      "unknown tier 'gpu-xl' (known: gpu-vm, gpu-k8s, gpu-k8s-mig, model-endpoint)");
  expect_one_line_failure(create("Tenant_X", "gpu-vm"), "invalid tenant name 'Tenant_X'");
  expect_one_line_failure(create("9tenant", "gpu-vm"), "9tenant");
  expect_one_line_failure(create("tenant-x", "gpu-vm", {"--ssh-node-port", "80"}),
                          "node port 80 is out of range");
  expect_one_line_failure(create("tenant-x", "gpu-vm", {"--ssh-node-port", "30022"}),
                          "node port 30022 is taken by Service tenants/tenant-1-ssh");
  expect_one_line_failure(create("tenant-x", "gpu-vm", {"--memory", "lots"}), "--memory");
  expect_one_line_failure(create("tenant-x", "gpu-vm", {"--gpus", "2"}),
                          "only 1 free nvidia.com/AD104GL_L4 (want 2): 2 allocatable, 1 in use by "
                          "tenant-1");
  expect_one_line_failure(create("tenant-x", "gpu-vm", {"--gpu-resource", "nvidia.com/H200"}),
                          "no free nvidia.com/H200: 0 allocatable");
  write_text(dir_ / "private.key", "-----BEGIN OPENSSH PRIVATE KEY-----\nxx\n");
  expect_one_line_failure(coordinator().factory({"tenant", "create", "tenant-x", "--tier", "gpu-vm",
                                                 "--ssh-key", (dir_ / "private.key").string()}),
                          "is a private key");

  // An object of the tenant's names that someone else made is not taken over.
  auto access = factory::kube::load_kubeconfig(kube_.kubeconfig());
  ASSERT_TRUE(access.ok()) << access.error().message;
  factory::kube::KubeClient client(*access);
  auto foreign =
      client.create({{"apiVersion", "v1"},
                     {"kind", "Secret"},
                     {"metadata", {{"name", "tenant-y-cloud-init"}, {"namespace", "tenants"}}},
                     {"stringData", {{"userdata", "#cloud-config\n"}}}});
  ASSERT_TRUE(foreign.ok()) << foreign.error().message;
  expect_one_line_failure(create("tenant-y", "gpu-vm"),
                          "Secret tenants/tenant-y-cloud-init exists and was not made by Factory");
  ASSERT_TRUE(client.remove(factory::kube::kSecret, "tenants", "tenant-y-cloud-init").ok());

  EXPECT_EQ(everything_in(kube_, "tenants"), before) << "a refused create left something behind";
  EXPECT_EQ(tenant_names(), std::vector<std::string>{"tenant-1"});
}

TEST_F(Tenants, UnreachableClusterOrBrokenKubeconfigGetsOneLine) {
  // A kubeconfig for an API server that is not there.
  int dead = free_loopback_port();
  std::string cfg = slurp(kube_.kubeconfig());
  std::string url = kube_.url();
  cfg.replace(cfg.find(url), url.size(), "https://127.0.0.1:" + std::to_string(dead));
  write_text(dir_ / "dead.kubeconfig", cfg);
  write_text(dir_ / "broken.kubeconfig", "apiVersion: v1\nkind: Config\nclusters: [oops\n");

  for (const auto& [file, needle] : std::vector<std::pair<std::string, std::string>>{
           {(dir_ / "dead.kubeconfig").string(), "127.0.0.1:" + std::to_string(dead)},
           {(dir_ / "broken.kubeconfig").string(), "broken.kubeconfig"},
           {(dir_ / "missing.kubeconfig").string(), "missing.kubeconfig"}}) {
    TempDir d("tenants-cluster");
    CoordinatorHarness h(d.path(), "kube:\n  kubeconfig: " + file + "\n");
    h.start();
    auto r = h.factory(
        {"tenant", "create", "tenant-1", "--tier", "gpu-vm", "--ssh-key", key_file_.string()});
    expect_one_line_failure(r, needle);
    auto list = h.factory({"tenant", "list", "-o", "json"});
    EXPECT_EQ(json::parse(list.output)["tenants"], json::array()) << "nothing recorded";
    EXPECT_EQ(h.factory({"token", "list", "-o", "json"}).output.find("tenant-1"), std::string::npos)
        << "no token issued";
  }
}

TEST_F(Tenants, InterruptedCreateIsFinishedByRunningItAgainOrCleanedByDelete) {
  allowlist();
  // The Service cannot be created (an RBAC gap, say): the create fails at
  // its last object and takes back what it made.
  ASSERT_FALSE(
      kube_.control("/_fake/forbid", {{"verb", "patch"}, {"resource", "services"}}).is_null());
  auto r = create("tenant-1", "gpu-vm");
  expect_one_line_failure(r, "forbidden: the coordinator's account cannot patch services");
  EXPECT_TRUE(objects_of(kube_, "tenants", "tenant-1").empty())
      << "rolled back: " << ::testing::PrintToString(objects_of(kube_, "tenants", "tenant-1"));
  EXPECT_TRUE(tenant_names().empty());
  for (const auto& t : token_list()) EXPECT_EQ(t.value("state", ""), "revoked") << t.dump();
  kube_.control("/_fake/forbid", {}, "DELETE");
  auto ok = create("tenant-1", "gpu-vm");
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_EQ(show("tenant-1")["phase"], "pending");

  // Now the rollback cannot finish either (VMs may not be deleted): the
  // tenant stays, in phase failed with the reason, its VM in the cluster.
  kube_.control("/_fake/forbid", {{"verb", "patch"}, {"resource", "services"}});
  kube_.control("/_fake/forbid", {{"verb", "delete"}, {"resource", "virtualmachines"}});
  auto half = create("tenant-2", "gpu-vm");
  expect_one_line_failure(half, "tenant tenant-2 is left in phase failed");
  json t2 = show("tenant-2");
  EXPECT_EQ(t2["phase"], "failed");
  EXPECT_NE(t2["kube"].value("error", "").find("cannot patch services"), std::string::npos)
      << t2.dump(2);
  const std::vector<std::string> vm_only = {
      "virtualmachines/tenant-2", "virtualmachineinstances/tenant-2", "datavolumes/tenant-2-root"};
  EXPECT_TRUE(eventually([&] { return objects_of(kube_, "tenants", "tenant-2") == vm_only; }, 5s))
      << ::testing::PrintToString(objects_of(kube_, "tenants", "tenant-2"));
  kube_.control("/_fake/forbid", {}, "DELETE");

  // Running the same create again finishes it: the VM it made is kept, the
  // Secret and Service are made, and it counts its own VM's card as its own.
  auto finish = create("tenant-2", "gpu-vm");
  ASSERT_EQ(finish.exit_code, 0) << finish.output;
  EXPECT_NE(password_from(finish.output), "") << finish.output;
  t2 = show("tenant-2");
  EXPECT_EQ(t2["phase"], "pending");
  EXPECT_EQ(t2["kube"]["state"], "created");
  EXPECT_FALSE(t2["kube"].contains("error"));
  auto objs = objects_of(kube_, "tenants", "tenant-2");
  for (const std::string want :
       {"secrets/tenant-2-cloud-init", "services/tenant-2-ssh", "virtualmachines/tenant-2"})
    EXPECT_NE(std::find(objs.begin(), objs.end(), want), objs.end()) << want;

  // And a half-made tenant that is not wanted any more: delete cleans it.
  ASSERT_EQ(coordinator().factory({"tenant", "delete", "tenant-1"}).exit_code, 0);
  kube_.control("/_fake/forbid", {{"verb", "patch"}, {"resource", "services"}});
  kube_.control("/_fake/forbid", {{"verb", "delete"}, {"resource", "virtualmachines"}});
  expect_one_line_failure(create("tenant-3", "gpu-vm"), "left in phase failed");
  kube_.control("/_fake/forbid", {}, "DELETE");
  auto d = coordinator().factory({"tenant", "delete", "tenant-3"});
  EXPECT_EQ(d.exit_code, 0) << d.output;
  EXPECT_TRUE(objects_of(kube_, "tenants", "tenant-3").empty());
  EXPECT_EQ(tenant_names(), std::vector<std::string>{"tenant-2"});
}

TEST_F(Tenants, CreateCutShortByACoordinatorCrashIsFinishedByRunningItAgain) {
  allowlist();
  auto first = create("tenant-1", "gpu-vm", {"--ssh-node-port", "30022"});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  json ud = live_user_data(kube_, "tenant-1");
  // Rewind to where a coordinator killed after the Secret would have left
  // things: the record says "creating", the VM and Service were never made.
  coordinator().kill9();
  auto access = factory::kube::load_kubeconfig(kube_.kubeconfig());
  ASSERT_TRUE(access.ok());
  factory::kube::KubeClient client(*access);
  ASSERT_TRUE(client.remove(factory::kube::kService, "tenants", "tenant-1-ssh").ok());
  ASSERT_TRUE(client.remove(factory::kube::kVirtualMachine, "tenants", "tenant-1").ok());
  auto stored = coordinator().stored_record("tenant-1");
  ASSERT_TRUE(stored.has_value());
  json rec = *stored;
  ASSERT_EQ(rec.value("phase", ""), "pending") << rec.dump(2);
  rec["phase"] = "creating";
  rec["status"]["kube"]["state"] = "creating";
  coordinator().write_stored_record(rec);
  coordinator().start();

  auto tl = tenants();
  ASSERT_EQ(tl.size(), 1u);
  EXPECT_EQ(tl[0]["phase"], "creating");
  auto again = create("tenant-1", "gpu-vm");
  ASSERT_EQ(again.exit_code, 0) << again.output << coordinator().log();
  // The Secret the VM may already have read is kept, token and password
  // included; the missing objects are made.
  EXPECT_EQ(password_from(again.output), "");
  EXPECT_NE(again.output.find("note: the user-data (and the ubuntu password) of an earlier attempt "
                              "is kept"),
            std::string::npos)
      << again.output;
  EXPECT_NE(again.output.find("created VirtualMachine/tenants/tenant-1"), std::string::npos);
  EXPECT_NE(again.output.find("created Service/tenants/tenant-1-ssh"), std::string::npos);
  EXPECT_EQ(live_user_data(kube_, "tenant-1"), ud);
  json t = show("tenant-1");
  EXPECT_EQ(t["phase"], "pending");
  EXPECT_EQ(t["kube"]["state"], "created");
  EXPECT_EQ(t["spec"]["ssh_node_port"], 30022) << "the stored spec, not a new one";
  expect_superset(load_runbook_fixture("tenant-1-ssh-service.yaml"),
                  kube_.get("/api/v1/namespaces/tenants/services/tenant-1-ssh"), "Service");
  // The token in the kept Secret still enrolls.
  const std::string token = write_file_content(ud, "/etc/factory/bootstrap-token");
  bool active = false;
  for (const auto& tk : token_list())
    if (tk.value("id", "") == token.substr(0, token.find('.')))
      active = tk.value("state", "") == "active";
  EXPECT_TRUE(active) << token_list().dump();
}

TEST_F(Tenants, DeleteRevokesTheTenantsTokens) {
  allowlist();
  ASSERT_EQ(create("tenant-1", "gpu-vm").exit_code, 0);
  // A second token for the tenant, as an admin might make by hand.
  json tok = coordinator().create_token("tenant-1");
  ASSERT_FALSE(tok.value("token", "").empty());
  auto d = coordinator().factory({"tenant", "delete", "tenant-1"});
  ASSERT_EQ(d.exit_code, 0) << d.output;
  EXPECT_NE(d.output.find("agent certificate and unused tokens revoked"), std::string::npos);
  int tenant_tokens = 0;
  for (const auto& t : token_list()) {
    if (t.value("tenant", "") != "tenant-1") continue;
    ++tenant_tokens;
    EXPECT_EQ(t.value("state", ""), "revoked") << t.dump();
  }
  EXPECT_EQ(tenant_tokens, 2) << "the user-data's token and the hand-made one";

  // An agent presenting the hand-made token is refused, and nothing of the
  // tenant comes back.
  AgentOptions o;
  o.extra_args = {"--link-only"};
  AgentProcess agent(coordinator(), tok, o);
  ASSERT_TRUE(eventually([&] { return agent.log().find("revoked") != std::string::npos; }, 10s))
      << agent.log();
  EXPECT_TRUE(tenant_names().empty());
}

// `factory tenant restart` with KubeVirt (issue 25: the fix for a tenant on a
// faulted card): the VMI is replaced (virt-controller, played by the double,
// starts a new one for runStrategy Always), announced on the feed before
// and after, journaled in the record; a faulted tenant is offered it in
// `tenant show`; a restart a kill cut short is finished at the next start,
// once.
TEST_F(Tenants, ARestartReplacesTheVmiAnnouncedJournaledAndFinishedAfterAKill) {
  allowlist();
  ASSERT_EQ(create("tenant-1", "gpu-vm").exit_code, 0);
  const std::string vmi_path =
      "/apis/kubevirt.io/v1/namespaces/tenants/virtualmachineinstances/tenant-1";
  // Before virt-controller (the fake's) has made the VMI, the API answers a
  // Status object (404) whose "status" is a string: not a VMI yet.
  auto is_vmi = [](const json& v) {
    return v.is_object() && v.value("kind", "") == "VirtualMachineInstance";
  };
  auto vmi_uid = [&] {
    json v = kube_.get(vmi_path);
    return is_vmi(v) ? v["metadata"].value("uid", "") : std::string();
  };
  auto running = [&] {
    json v = kube_.get(vmi_path);
    return is_vmi(v) && v.value("status", json::object()).value("phase", "") == "Running";
  };
  ASSERT_TRUE(eventually(running, 10s));
  const std::string first = vmi_uid();
  ASSERT_FALSE(first.empty());

  // Dry run: what it would do, and nothing done.
  auto dry = coordinator().factory({"tenant", "restart", "tenant-1", "--dry-run", "-o", "json"});
  ASSERT_EQ(dry.exit_code, 0) << dry.output;
  json d = json::parse(dry.output, nullptr, false);
  EXPECT_NE(
      d.value("would", "").find("delete VirtualMachineInstance tenants/tenant-1 (uid " + first),
      std::string::npos)
      << dry.output;
  std::this_thread::sleep_for(1s);
  EXPECT_EQ(vmi_uid(), first);

  EventReader feed(coordinator(), "/v1/events?tenant=tenant-1",
                   {{"Authorization", "Bearer " + coordinator().admin_token()}});
  auto r = coordinator().factory({"tenant", "restart", "tenant-1"});
  ASSERT_EQ(r.exit_code, 0) << r.output << coordinator().log();
  EXPECT_NE(r.output.find("tenant tenant-1 restarted: delete VirtualMachineInstance"),
            std::string::npos)
      << r.output;
  auto started = feed.wait_for("action", "state", "started");
  auto done = feed.wait_for("action", "state", "done");
  ASSERT_TRUE(started && done) << feed.text();
  EXPECT_EQ(started->data["action"], "restart");
  EXPECT_LT(std::stoull(started->id), std::stoull(done->id)) << "announced before it acts";
  ASSERT_TRUE(
      eventually([&] { return !vmi_uid().empty() && vmi_uid() != first && running(); }, 10s));
  const std::string second = vmi_uid();
  json t = show("tenant-1");
  EXPECT_EQ(t["restart"]["state"], "done") << t.dump(2);
  EXPECT_EQ(t["restart"]["from_instance"], first);
  EXPECT_EQ(t["vm"]["instance"], second);
  EXPECT_FALSE(t.contains("restart_offer")) << "no card fault: nothing offered";

  // A card fault recorded on the tenant: `tenant show` offers the restart.
  coordinator().kill9();
  auto stored = coordinator().stored_record("tenant-1");
  ASSERT_TRUE(stored.has_value());
  json rec = *stored;
  rec["status"].erase("restart");
  rec["status"]["gpu_faults"] = {{"GPU-1/xid-79",
                                  {{"gpu", 0},
                                   {"uuid", "GPU-1"},
                                   {"kind", "xid"},
                                   {"xid", 79},
                                   {"code", "gpu_xid_79"},
                                   {"summary", "GPU has fallen off the bus"},
                                   {"fix", "quarantine"},
                                   {"first_seen", "2026-12-03T10:00:00Z"}}}};
  coordinator().write_stored_record(rec);
  coordinator().start();
  t = show("tenant-1");
  ASSERT_TRUE(t.contains("restart_offer")) << t.dump(2);
  EXPECT_EQ(t["restart_offer"]["command"], "factory tenant restart tenant-1");
  auto table = coordinator().factory({"tenant", "show", "tenant-1"});
  EXPECT_NE(table.output.find("Fix:       `factory tenant restart tenant-1` would delete "
                              "VirtualMachineInstance"),
            std::string::npos)
      << table.output;

  // Killed after the journal, before the VMI went: the next start finishes
  // it, and only once.
  coordinator().kill9();
  stored = coordinator().stored_record("tenant-1");
  ASSERT_TRUE(stored.has_value());
  rec = *stored;
  rec["status"]["restart"] = {{"state", "restarting"},
                              {"requested_at", "2026-12-03T11:00:00Z"},
                              {"from_instance", second},
                              {"avoid_gpus", json::array()},
                              {"gpus_before", json::array()}};
  coordinator().write_stored_record(rec);
  coordinator().start();
  ASSERT_TRUE(eventually(
      [&] {
        json now = show("tenant-1");
        return now["restart"].value("state", "") == "done" && vmi_uid() != second &&
               !vmi_uid().empty();
      },
      15s))
      << show("tenant-1").dump(2) << coordinator().log();
  const std::string third = vmi_uid();
  std::this_thread::sleep_for(2s);
  EXPECT_EQ(vmi_uid(), third) << "restarted once";
  EXPECT_NE(coordinator().log().find("finishing the restart of tenant-1 that a stop cut short"),
            std::string::npos);
  // Once done, the fault is older than the restart: no offer any more.
  EXPECT_FALSE(show("tenant-1").contains("restart_offer"));
}
