// The pure parts of the tenant service: the request and how it resolves
// against the catalog, the GPU capacity arithmetic on API lists shaped as
// the API server sends them, the `--wait` progress lines, and the
// coordinator config's kube: and catalog: keys. The service end to end is
// tests/integration/tenants_test.cpp.
#include <gtest/gtest.h>

#include "contract/catalog.hpp"
#include "coordinator/config/coordinator_config.hpp"
#include "coordinator/kubevirt/kubevirt_provider.hpp"
#include "coordinator/tenants/progress.hpp"
#include "coordinator/tenants/request.hpp"
#include "tests/coordinator/tenant_test_data.hpp"

namespace factory::testing {
namespace {

using nlohmann::json;
using namespace factory::kubevirt;
using namespace factory::tenants;

catalog::Catalog builtin_catalog() {
  auto c = catalog::builtin();
  EXPECT_TRUE(c.ok());
  return *c;
}

TEST(TenantRequest, RoundTripsAndNeverCarriesThePasswordUnlessAsked) {
  TenantRequest r;
  r.name = "tenant-1";
  r.tier = "gpu-vm";
  r.gpus = 2;
  r.memory = "32Gi";
  r.ssh_node_port = 30022;
  r.ssh_authorized_keys = {kTestEd25519Key};
  r.password = "Xq7mR2pLk9vT4wZs8nHc";
  json j = r.to_json();
  EXPECT_FALSE(j.contains("password"));
  EXPECT_FALSE(j.contains("cpu")) << "unset overrides are left out";
  EXPECT_EQ(r.to_json(true)["password"], r.password);
  auto back = TenantRequest::from_json(r.to_json(true));
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->to_json(true), r.to_json(true));
}

TEST(TenantRequest, RefusesWrongTypesAndUnknownFieldsWithTheFieldName) {
  auto bad = [](const json& j) {
    auto r = TenantRequest::from_json(j);
    EXPECT_FALSE(r.ok()) << j.dump();
    return r.ok() ? std::string() : r.error().message;
  };
  EXPECT_NE(bad({{"name", "a"}, {"tier", "gpu-vm"}, {"gpus", "2"}}).find("'gpus'"),
            std::string::npos);
  EXPECT_NE(bad({{"name", "a"}, {"tier", "gpu-vm"}, {"colour", "red"}}).find("'colour'"),
            std::string::npos);
  EXPECT_NE(bad({{"name", "a"}, {"tier", "gpu-vm"}, {"ssh_authorized_keys", "k"}})
                .find("ssh_authorized_keys"),
            std::string::npos);
  EXPECT_NE(bad({{"name", "a"}}).find("no tier"), std::string::npos);
  EXPECT_NE(bad(json::array()).find("JSON object"), std::string::npos);
  // Numbers are range-checked as JSON numbers: 2^32 + 1 must not wrap to 1.
  EXPECT_EQ(bad({{"name", "a"}, {"tier", "gpu-vm"}, {"gpus", 4294967297ull}}),
            "'gpus' is 4294967297: want a whole number from 0 to 16");
  EXPECT_EQ(bad({{"name", "a"}, {"tier", "gpu-vm"}, {"gpus", -1}}),
            "'gpus' is -1: want a whole number from 0 to 16");
  EXPECT_EQ(bad({{"name", "a"}, {"tier", "gpu-vm"}, {"gpus", 17}}),
            "'gpus' is 17: want a whole number from 0 to 16");
  EXPECT_NE(bad({{"name", "a"}, {"tier", "gpu-vm"}, {"gpus", 1.5}}).find("'gpus' must be"),
            std::string::npos);
  EXPECT_EQ(bad({{"name", "a"}, {"tier", "gpu-vm"}, {"ssh_node_port", 4294997296ull}}),
            "'ssh_node_port' is 4294997296: want a NodePort, 30000-32767");
  EXPECT_NE(bad({{"name", 7}, {"tier", "gpu-vm"}}).find("'name' must be a string"),
            std::string::npos);
}

TEST(ResolveVmSpec, TakesTheTiersShapeAndTheOverrides) {
  auto cat = builtin_catalog();
  TenantRequest r;
  r.name = "tenant-1";
  r.tier = "gpu-vm";
  auto vm = resolve_vm_spec(cat, r, "tenants");
  ASSERT_TRUE(vm.ok()) << vm.error().message;
  const auto& shape = cat.find("gpu-vm")->vm;
  EXPECT_EQ(vm->cpu, shape.cpu);
  EXPECT_EQ(vm->memory, shape.memory);
  EXPECT_EQ(vm->disk, shape.disk);
  EXPECT_EQ(vm->image_url, shape.image);
  EXPECT_EQ(vm->gpus, shape.gpus);
  EXPECT_EQ(vm->ns, "tenants");
  EXPECT_EQ(vm->tier, "gpu-vm");
  EXPECT_EQ(vm->gpu_resource, "") << "any allowlisted: the coordinator picks";
  auto dry = resolve_vm_spec(cat, r, "tenants", true);
  ASSERT_TRUE(dry.ok());
  EXPECT_EQ(dry->gpu_resource, kAnyAllowlistedGpuPlaceholder);

  r.cpu = "4";
  r.memory = "8Gi";
  r.gpus = 2;
  r.ns = "team-a";
  r.gpu_resource = kL4Resource;
  vm = resolve_vm_spec(cat, r, "tenants");
  ASSERT_TRUE(vm.ok()) << vm.error().message;
  EXPECT_EQ(vm->cpu, "4");
  EXPECT_EQ(vm->memory, "8Gi");
  EXPECT_EQ(vm->gpus, 2);
  EXPECT_EQ(vm->ns, "team-a");
  EXPECT_EQ(vm->gpu_resource, kL4Resource);
}

TEST(ResolveVmSpec, BadInputIsOneLineNamingIt) {
  auto cat = builtin_catalog();
  auto msg = [&](TenantRequest r) {
    auto vm = resolve_vm_spec(cat, r, "tenants");
    EXPECT_FALSE(vm.ok());
    return vm.ok() ? std::string() : vm.error().message;
  };
  TenantRequest r;
  r.name = "tenant-1";
  r.tier = "gpu-xl";
  EXPECT_EQ(msg(r), "unknown tier 'gpu-xl' (known: gpu-vm, gpu-k8s, gpu-k8s-mig, model-endpoint)");
  r.tier = "gpu-vm";
  r.name = "Tenant_1";
  EXPECT_NE(msg(r).find("tenant name: invalid tenant name 'Tenant_1'"), std::string::npos);
  r.name = "tenant-1";
  r.ssh_node_port = 22;
  EXPECT_NE(msg(r).find("node port 22 is out of range"), std::string::npos);
  r.ssh_node_port = 0;
  r.disk = "a lot";
  EXPECT_NE(msg(r).find("--disk"), std::string::npos);
  r.disk.clear();
  r.gpus = 99;
  EXPECT_NE(msg(r).find("--gpus 99"), std::string::npos);
  r.gpus = -1;
  EXPECT_EQ(msg(r), "--gpus -1 is out of range: want 0-16");
  r.gpus.reset();
  r.ns = "Team_A";
  EXPECT_NE(msg(r).find("Team_A"), std::string::npos);
}

// The spec a tenant's record keeps is the VM it was first resolved to, every
// field of it: a re-run of create, a restart or a key rotation builds exactly
// that VM. Each field below differs from its default, so one the record
// dropped would come back different.
TEST(StoredSpec, EveryFieldRoundTripsThroughTheRecord) {
  VmSpec v;
  v.name = "tenant-1";
  v.ns = "team-a";
  v.cpu = "4";
  v.memory = "8Gi";
  v.disk = "50Gi";
  v.image_url = "https://images.example/noble.img";
  v.gpu_resource = kL4Resource;
  v.gpus = 2;
  v.ssh_node_port = 30022;
  v.tier = "gpu-k8s-mig";
  v.needs_mig = true;
  v.ssh_service = false;
  v.endpoint_port = 11434;
  v.labels = {{"team", "a"}, {"cost-center", "42"}};
  const VmSpec defaults;
  EXPECT_NE(v.ns, defaults.ns);
  EXPECT_NE(v.gpus, defaults.gpus);
  EXPECT_NE(v.needs_mig, defaults.needs_mig);
  EXPECT_NE(v.ssh_service, defaults.ssh_service);

  bool needs_mig_stored = false;
  // Through the text the store writes, as a record is read back.
  const json stored = json::parse(vm_spec_to_stored(v).to_json().dump());
  EXPECT_FALSE(stored.contains("name")) << "the record's own name, not stored twice";
  auto read = store::TenantSpec::from_json(stored);
  ASSERT_TRUE(read.ok()) << read.error().message;
  VmSpec back = vm_spec_from_stored(*read, "tenant-1", &needs_mig_stored);
  EXPECT_EQ(back, v) << stored.dump();
  EXPECT_TRUE(needs_mig_stored);

  // A record from before needs_mig and labels were kept reads as it did,
  // and says needs_mig is not its own (the caller asks the catalog).
  VmSpec plain;
  plain.name = "tenant-2";
  store::TenantSpec old = vm_spec_to_stored(plain);
  old.needs_mig.reset();
  EXPECT_FALSE(old.labels.has_value());
  EXPECT_FALSE(old.ssh_service.has_value()) << "written only when it differs";
  EXPECT_EQ(vm_spec_from_stored(old, "tenant-2", &needs_mig_stored), plain);
  EXPECT_FALSE(needs_mig_stored);

  // What create stores is this spec plus the request's own fields.
  TenantRequest req;
  req.name = "tenant-1";
  req.ssh_authorized_keys = {kTestEd25519Key};
  const store::TenantSpec rec = stored_spec(v, req);
  EXPECT_EQ(vm_spec_from_stored(rec, "tenant-1"), v);
  EXPECT_EQ(rec.to_json()["ssh_authorized_keys"], json::array({kTestEd25519Key}));
}

TEST(SameRequest, OnlyWhatTheNewRequestSetsMustMatch) {
  auto cat = builtin_catalog();
  TenantRequest first;
  first.name = "tenant-1";
  first.tier = "gpu-vm";
  first.ssh_node_port = 30022;
  first.ssh_authorized_keys = {kTestEd25519Key};
  auto vm = resolve_vm_spec(cat, first, "tenants");
  ASSERT_TRUE(vm.ok());
  vm->gpu_resource = kL4Resource;  // what the coordinator picked
  store::TenantSpec stored = stored_spec(*vm, first);

  TenantRequest again;
  again.name = "tenant-1";
  again.tier = "gpu-vm";
  EXPECT_TRUE(same_request(stored, again).ok());
  EXPECT_TRUE(same_request(stored, first).ok());
  again.gpu_resource = kL4Resource;
  EXPECT_TRUE(same_request(stored, again).ok());
  again.ssh_node_port = 30023;
  auto st = same_request(stored, again);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, Errc::already_exists);
  EXPECT_NE(st.error().message.find("ssh_node_port 30022, not 30023"), std::string::npos)
      << st.error().message;
  again.ssh_node_port = 0;
  again.tier = "gpu-k8s";
  EXPECT_NE(same_request(stored, again).error().message.find("tier \"gpu-vm\", not \"gpu-k8s\""),
            std::string::npos);
}

// What the Tenant controller says of an edited spec: every difference, not
// only the first.
TEST(SameRequest, RequestDifferencesNamesEveryFieldThatDiffers) {
  auto cat = builtin_catalog();
  TenantRequest first;
  first.name = "tenant-1";
  first.tier = "gpu-vm";
  auto vm = resolve_vm_spec(cat, first, "tenants");
  ASSERT_TRUE(vm.ok());
  store::TenantSpec stored = stored_spec(*vm, first);
  EXPECT_TRUE(request_differences(stored, first).empty());
  TenantRequest edited = first;
  edited.memory = "999Gi";
  edited.cpu = "64";
  auto d = request_differences(stored, edited);
  ASSERT_EQ(d.size(), 2u) << ::testing::PrintToString(d);
  EXPECT_NE(d[0].find("cpu "), std::string::npos) << d[0];
  EXPECT_NE(d[0].find(", not \"64\""), std::string::npos) << d[0];
  EXPECT_NE(d[1].find("memory "), std::string::npos) << d[1];
  EXPECT_NE(d[1].find(", not \"999Gi\""), std::string::npos) << d[1];
  // same_request names the first of them, in the same words.
  EXPECT_NE(same_request(stored, edited).error().message.find(d[0]), std::string::npos);
}

// ------------------------------------------------------------------ capacity

json node(const std::string& name, const json& allocatable) {
  return {{"metadata", {{"name", name}}}, {"status", {{"allocatable", allocatable}}}};
}

json vm(const std::string& ns, const std::string& name, const std::string& resource, int gpus,
        const std::string& tenant = "", const std::string& strategy = "Always") {
  json list = json::array();
  for (int i = 0; i < gpus; ++i)
    list.push_back({{"name", "gpu" + std::to_string(i + 1)}, {"deviceName", resource}});
  json md = {{"namespace", ns}, {"name", name}};
  if (!tenant.empty())
    md["labels"] = {{"app.kubernetes.io/managed-by", "factory"}, {"factory.dev/tenant", tenant}};
  return {{"metadata", md},
          {"spec",
           {{"runStrategy", strategy},
            {"template", {{"spec", {{"domain", {{"devices", {{"gpus", list}}}}}}}}}}}};
}

TEST(GpuCapacity, SumsNodesAndSubtractsRunningVmsNamingThem) {
  json nodes = {{"items",
                 {node("utho", {{"cpu", "64"}, {kL4Resource, "2"}}),
                  node("other", {{kL4Resource, "1"}}), node("cpu-only", {{"cpu", "8"}})}}};
  json vms = {
      {"items",
       {vm("tenants", "tenant-1", kL4Resource, 1, "tenant-1"),
        vm("tenants", "tenant-2", kL4Resource, 1, "tenant-2"), vm("lab", "scratch", kL4Resource, 1),
        vm("lab", "stopped", kL4Resource, 1, "", "Halted"),
        vm("tenants", "h200", "nvidia.com/GH100_H200", 1, "h200")}}};
  auto c = gpu_capacity(kL4Resource, nodes, vms, "", "");
  EXPECT_EQ(c.allocatable, 3);
  EXPECT_EQ(c.in_use, 3) << "a Halted VM holds no card";
  EXPECT_EQ(c.users, (std::vector<std::string>{"lab/scratch", "tenant-1", "tenant-2"}));
  EXPECT_EQ(c.free(), 0);
  EXPECT_EQ(capacity_shortfall(c, 1),
            "no free nvidia.com/AD104GL_L4: 3 allocatable, 3 in use by lab/scratch, tenant-1, "
            "tenant-2");
  // A re-run of a create does not count the tenant's own VM against it.
  auto mine = gpu_capacity(kL4Resource, nodes, vms, "tenants", "tenant-1");
  EXPECT_EQ(mine.free(), 1);

  json deleting = vms;
  deleting["items"][0]["metadata"]["deletionTimestamp"] = "2026-11-30T09:00:00Z";
  EXPECT_EQ(gpu_capacity(kL4Resource, nodes, deleting, "", "").in_use, 2);

  auto none = gpu_capacity("nvidia.com/GH100_H200", nodes, vms, "", "");
  EXPECT_EQ(capacity_shortfall(none, 1).rfind("no free nvidia.com/GH100_H200: 0 allocatable, 1 in "
                                              "use by h200 (no node advertises it",
                                              0),
            0u)
      << capacity_shortfall(none, 1);
  GpuCapacity partial{kL4Resource, 2, 1, {"tenant-1"}};
  EXPECT_EQ(capacity_shortfall(partial, 2),
            "only 1 free nvidia.com/AD104GL_L4 (want 2): 2 allocatable, 1 in use by tenant-1");
}

TEST(GpuCapacity, PermittedResourcesAreKubeVirtsOwnInCrOrder) {
  json kvs = {{"items",
               {{{"spec",
                  {{"configuration",
                    {{"permittedHostDevices",
                      {{"pciHostDevices",
                        {{{"pciVendorSelector", "10DE:2335"},
                          {"resourceName", "nvidia.com/GH100_H200"},
                          {"externalResourceProvider", true}},
                         {{"pciVendorSelector", "10DE:27B8"}, {"resourceName", kL4Resource}},
                         {{"pciVendorSelector", "10DE:20B5"},
                          {"resourceName", "nvidia.com/GA100_A100"}}}}}}}}}}},
                {{"spec", {{"configuration", json::object()}}}}}}};
  EXPECT_EQ(permitted_gpu_resources(kvs),
            (std::vector<std::string>{kL4Resource, "nvidia.com/GA100_A100"}));
  EXPECT_TRUE(permitted_gpu_resources(json{{"items", json::array()}}).empty());
}

TEST(SshService, TheApiServersNodePortRefusalsBecomeOneActionableLine) {
  auto spec = runbook_vm_spec("tenant-3", 30022);
  // The messages as kube::status_error carries them up from the fake API
  // server's 422 (the real API server's words).
  Error taken(Errc::invalid_argument,
              "Service \"tenant-3-ssh\" is invalid: spec.ports[0].nodePort: Invalid value: 30022: "
              "provided port is already allocated");
  EXPECT_EQ(ssh_service_error(taken, spec).message,
            "node port 30022 is already allocated to another Service: pick another "
            "--ssh-node-port, or leave it out and Kubernetes picks a free one");
  Error range(Errc::invalid_argument,
              "Service \"tenant-3-ssh\" is invalid: spec.ports[0].nodePort: Invalid value: 30022: "
              "provided port is not in the valid range. The range of valid ports is 31000-32767");
  EXPECT_NE(ssh_service_error(range, spec).message.find("outside the cluster's node port range"),
            std::string::npos);
  Error other(Errc::permission_denied, "forbidden: cannot patch services");
  EXPECT_EQ(ssh_service_error(other, spec).message,
            "Service tenants/tenant-3-ssh: forbidden: cannot patch services");
  EXPECT_EQ(ssh_service_error(other, spec).code, Errc::permission_denied);
}

// ------------------------------------------------------------------ --wait

json tenant_doc(const std::string& phase) {
  return {{"name", "tenant-1"},
          {"phase", phase},
          {"agent", {{"connected", false}}},
          {"vm",
           {{"exists", true},
            {"status", "Starting"},
            {"phase", "Scheduling"},
            {"ssh_node_port", 30022}}},
          {"plan_steps",
           {{{"id", "gpu-present"}, {"kind", "gpu_present"}, {"state", "pending"}},
            {{"id", "nvidia-driver"}, {"kind", "nvidia_driver"}, {"state", "pending"}}}}};
}

TEST(WaitProgress, OneLinePerChangeAndNothingWhenNothingChanged) {
  json a = tenant_doc("pending");
  auto first = progress_lines(nullptr, a);
  EXPECT_EQ(first, (std::vector<std::string>{"VM: Starting, VMI Scheduling", "phase pending"}));
  EXPECT_TRUE(progress_lines(a, a).empty());

  json b = a;
  b["vm"] = {{"exists", true}, {"status", "Running"}, {"phase", "Running"},
             {"node", "utho"}, {"ip", "10.42.0.98"},  {"ssh_node_port", 30022}};
  b["agent"] = {{"connected", true}, {"version", "0.1.0"}, {"hostname", "tenant-1"}};
  b["phase"] = "provisioning";
  b["plan_steps"][0]["state"] = "succeeded";
  b["plan_steps"][1]["state"] = "progress";
  b["plan_steps"][1]["message"] = "downloading nvidia-driver-local-repo.deb";
  EXPECT_EQ(progress_lines(a, b),
            (std::vector<std::string>{
                "VM: Running, VMI Running on utho, IP 10.42.0.98, SSH node port 30022",
                "agent connected (factory-agent 0.1.0 on tenant-1)", "step gpu-present: succeeded",
                "step nvidia-driver: progress - downloading nvidia-driver-local-repo.deb",
                "phase provisioning"}));

  json c = b;
  c["agent"]["connected"] = false;
  c["plan_steps"][1]["state"] = "reboot_requested";
  c["plan_steps"][1]["message"] = "rebooting to load the driver";
  c["plan_steps"][1]["percent"] = 40;
  EXPECT_EQ(progress_lines(b, c),
            (std::vector<std::string>{
                "agent disconnected (a reboot is expected once, for the driver)",
                "step nvidia-driver: reboot_requested - rebooting to load the driver"}));
  json d = c;
  d["plan_steps"][1]["state"] = "progress";
  d["plan_steps"][1]["percent"] = 55;
  d["plan_steps"][1]["message"] = "pulling llama3.2:1b";
  EXPECT_EQ(progress_lines(c, d),
            (std::vector<std::string>{"step nvidia-driver: progress 55% - pulling llama3.2:1b"}));

  json unsched = a;
  unsched["vm"]["reason"] = "0/1 nodes are available: 1 Insufficient nvidia.com/AD104GL_L4";
  EXPECT_EQ(progress_lines(a, unsched),
            (std::vector<std::string>{"VM cannot start yet: 0/1 nodes are available: 1 "
                                      "Insufficient nvidia.com/AD104GL_L4"}));
  json err = a;
  err["vm"] = {{"error", "cannot reach the Kubernetes API at https://127.0.0.1:6443"}};
  EXPECT_EQ(progress_lines(a, err)[0],
            "VM: cannot read it from the cluster: cannot reach the Kubernetes API at "
            "https://127.0.0.1:6443");
}

TEST(WaitProgress, FailureReportNamesTheStepDiagnosisFixAndOutput) {
  json t = tenant_doc("failed");
  t["plan"] = {{"state", "failed"}, {"failed_step", "gpu-present"}};
  t["plan_steps"][0]["state"] = "failed";
  t["plan_steps"][0]["message"] = "no NVIDIA function on the PCI bus";
  t["plan_steps"][0]["output_tail"] = "00:01.0 Ethernet controller\n00:02.0 SCSI storage\n";
  t["plan_steps"][0]["diagnosis"] = {{"code", "gpu_not_on_pci_bus"},
                                     {"summary", "the VM never received the card"},
                                     {"fix", "check on the host that the card is on vfio-pci"}};
  t["diagnoses"] = {{"gpu_not_on_pci_bus", t["plan_steps"][0]["diagnosis"]}};
  EXPECT_EQ(failure_report(t),
            (std::vector<std::string>{
                "step gpu-present failed: no NVIDIA function on the PCI bus",
                "diagnosis gpu_not_on_pci_bus: the VM never received the card",
                "fix: check on the host that the card is on vfio-pci",
                "output (last lines):", "  00:01.0 Ethernet controller", "  00:02.0 SCSI storage",
                "fix the cause, then: factory tenant retry tenant-1 --step gpu-present"}));
  auto without = failure_report(t, /*with_step_line=*/false);
  EXPECT_EQ(without.front(), "diagnosis gpu_not_on_pci_bus: the VM never received the card");
  EXPECT_EQ(without.size(), failure_report(t).size() - 1);
  EXPECT_EQ(failure_summary(t),
            "tenant tenant-1 failed at step gpu-present: no NVIDIA function on the PCI bus");
  auto lines = progress_lines(tenant_doc("provisioning"), t);
  EXPECT_NE(std::find(lines.begin(), lines.end(),
                      "diagnosis gpu_not_on_pci_bus: the VM never received the card (fix: check "
                      "on the host that the card is on vfio-pci)"),
            lines.end());

  json create_failed = tenant_doc("failed");
  create_failed["kube"] = {{"state", "failed"}, {"error", "forbidden: cannot patch services"}};
  EXPECT_EQ(failure_report(create_failed),
            (std::vector<std::string>{"create failed: forbidden: cannot patch services"}));
}

// ------------------------------------------------------------------ config

TEST(CoordinatorConfigKube, KeysDefaultsAndRelativePaths) {
  TempDir dir("tenant-config");
  write_text(dir / "empty.yaml", "");
  auto d = coordinator::load_coordinator_config((dir / "empty.yaml").string(), true);
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_EQ(d->kube_kubeconfig, "");
  EXPECT_EQ(d->kube_namespace, "tenants");
  EXPECT_EQ(d->kube_request_timeout, std::chrono::seconds(10));
  EXPECT_EQ(d->token_tenant_ttl, std::chrono::hours(24));
  EXPECT_EQ(d->catalog, "");

  write_text(dir / "c.yaml",
             "kube:\n  kubeconfig: kube/config\n  context: lab\n  namespace: gpu-tenants\n"
             "  request_timeout: 5s\ncatalog: my-catalog.yaml\ntokens:\n  tenant_ttl: 2h\n");
  auto c = coordinator::load_coordinator_config((dir / "c.yaml").string(), true);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->kube_kubeconfig, (dir / "kube" / "config").string());
  EXPECT_EQ(c->kube_context, "lab");
  EXPECT_EQ(c->kube_namespace, "gpu-tenants");
  EXPECT_EQ(c->kube_request_timeout, std::chrono::seconds(5));
  EXPECT_EQ(c->token_tenant_ttl, std::chrono::hours(2));
  EXPECT_EQ(c->catalog, "my-catalog.yaml");

  write_text(dir / "bad.yaml", "kube:\n  kubeconfg: x\n");
  auto bad = coordinator::load_coordinator_config((dir / "bad.yaml").string(), true);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("unknown key 'kube.kubeconfg'"), std::string::npos)
      << bad.error().message;
  write_text(dir / "ttl.yaml", "tokens:\n  tenant_ttl: 1s\n");
  EXPECT_FALSE(coordinator::load_coordinator_config((dir / "ttl.yaml").string(), true).ok());
}

}  // namespace
}  // namespace factory::testing
