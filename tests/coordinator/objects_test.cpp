// The tenant's Kubernetes objects: field for field against the runbook's
// manifests (tests/fixtures/runbook, verbatim from the seed), and valid for
// a strict API server (the real KubeVirt OpenAPI schema; core kinds against
// python3-kubernetes' models) — see tenant_test_data.hpp for the validators.
#include "coordinator/kubevirt/objects.hpp"

#include <gtest/gtest.h>

#include "coordinator/tenants/k8s_names.hpp"
#include "tests/coordinator/tenant_test_data.hpp"

namespace factory::testing {
namespace {

using nlohmann::json;
using namespace factory::kubevirt;
using namespace factory::tenants;

const json kFactoryLabels = {{"app.kubernetes.io/managed-by", "factory"},
                             {"factory.dev/tenant", "tenant-1"},
                             {"factory.dev/tier", "gpu-vm"}};

// Removes Factory's own labels (the only thing it adds to the runbook's
// manifests) and returns what it removed, so both halves can be checked.
json strip_labels(json& labels_parent) {
  json removed = json::object();
  if (!labels_parent.contains("labels")) return removed;
  auto& labels = labels_parent["labels"];
  for (auto it = labels.begin(); it != labels.end();) {
    if (it.key() == kDomainLabel) {
      ++it;
      continue;
    }
    removed[it.key()] = it.value();
    it = labels.erase(it);
  }
  if (labels.empty()) labels_parent.erase("labels");
  return removed;
}

std::string diff(const json& expected, const json& actual) {
  return json::diff(expected, actual).dump(2);
}

json replace_in_strings(json j, const std::string& from, const std::string& to) {
  if (j.is_string()) {
    std::string s = j.get<std::string>();
    for (size_t pos = 0; (pos = s.find(from, pos)) != std::string::npos; pos += to.size())
      s.replace(pos, from.size(), to);
    return s;
  }
  if (j.is_object() || j.is_array())
    for (auto& v : j) v = replace_in_strings(v, from, to);
  return j;
}

TEST(TenantObjects, VirtualMachineIsTheRunbooksFieldForField) {
  json expected = load_runbook_fixture("tenant-1-virtualmachine.yaml");
  ASSERT_FALSE(expected.is_null());
  json vm = virtual_machine(runbook_vm_spec());

  EXPECT_EQ(strip_labels(vm["metadata"]), kFactoryLabels);
  EXPECT_EQ(strip_labels(vm["spec"]["dataVolumeTemplates"][0]["metadata"]), kFactoryLabels);
  EXPECT_EQ(strip_labels(vm["spec"]["template"]["metadata"]), kFactoryLabels);
  EXPECT_EQ(vm, expected) << "differences from the runbook (RFC 6902, runbook -> ours):\n"
                          << diff(expected, vm);
}

TEST(TenantObjects, SecondTenantIsTheSameManifestWithItsOwnNames) {
  // "tenant-2 is the same manifest with its own name, disk, Secret and label."
  json expected = replace_in_strings(load_runbook_fixture("tenant-1-virtualmachine.yaml"),
                                     "tenant-1", "tenant-2");
  auto spec = runbook_vm_spec("tenant-2", 30023);
  spec.tier = "gpu-k8s";
  json vm = virtual_machine(spec);
  json labels = {{"app.kubernetes.io/managed-by", "factory"},
                 {"factory.dev/tenant", "tenant-2"},
                 {"factory.dev/tier", "gpu-k8s"}};
  EXPECT_EQ(strip_labels(vm["metadata"]), labels);
  strip_labels(vm["spec"]["dataVolumeTemplates"][0]["metadata"]);
  strip_labels(vm["spec"]["template"]["metadata"]);
  EXPECT_EQ(vm, expected) << diff(expected, vm);
}

TEST(TenantObjects, SshServiceIsTheRunbooksFieldForField) {
  json expected = load_runbook_fixture("tenant-1-ssh-service.yaml");
  json svc = ssh_service(runbook_vm_spec());
  EXPECT_EQ(strip_labels(svc["metadata"]), kFactoryLabels);
  EXPECT_EQ(svc, expected) << diff(expected, svc);
}

TEST(TenantObjects, SshServiceWithoutNodePortLetsKubernetesPick) {
  json svc = ssh_service(runbook_vm_spec("tenant-1", 0));
  ASSERT_EQ(svc["spec"]["ports"].size(), 1u);
  EXPECT_FALSE(svc["spec"]["ports"][0].contains("nodePort")) << svc.dump();
  EXPECT_EQ(svc["spec"]["ports"][0]["port"], 22);
}

TEST(TenantObjects, CloudInitSecretIsTheRunbooksWithRenderedUserData) {
  json expected = load_runbook_fixture("tenant-1-cloud-init-secret.yaml");
  auto params = sample_cloud_init_params();
  auto ud = render_user_data(params);
  ASSERT_TRUE(ud.ok()) << ud.error().message;
  json secret = cloud_init_secret(runbook_vm_spec(), ud->text);

  EXPECT_EQ(strip_labels(secret["metadata"]), kFactoryLabels);
  EXPECT_EQ(secret["metadata"], expected["metadata"]);
  EXPECT_EQ(secret["apiVersion"], expected["apiVersion"]);
  EXPECT_EQ(secret["kind"], expected["kind"]);
  // The runbook leaves type to its default; we say it.
  EXPECT_EQ(secret["type"], "Opaque");
  ASSERT_EQ(secret["stringData"].size(), 1u) << "KubeVirt reads only the userdata key";
  ASSERT_TRUE(secret["stringData"].contains("userdata"));
  ASSERT_EQ(secret["stringData"]["userdata"], ud->text);

  // Every setting of the runbook's user-data is in ours, with its
  // placeholders (<generated>, <your public key>) filled in.
  auto theirs = parse_yaml(expected["stringData"]["userdata"].get<std::string>(), "runbook");
  auto ours = parse_yaml(ud->text, "ours");
  ASSERT_TRUE(theirs.ok() && ours.ok());
  json want = *theirs;
  want["chpasswd"]["users"][0]["password"] = params.password;
  want["users"][0]["ssh_authorized_keys"] = params.ssh_authorized_keys;
  for (auto& [key, value] : want.items())
    EXPECT_EQ((*ours)[key], value) << "user-data key " << key << ": " << diff(value, (*ours)[key]);
}

TEST(TenantObjects, EveryObjectCarriesTheTenantLabelsExceptTheSharedNamespace) {
  auto spec = runbook_vm_spec();
  spec.labels = {{"team", "ml-research"}};
  auto objects = tenant_objects(spec, "#cloud-config\n");
  ASSERT_EQ(objects.size(), 4u);
  EXPECT_EQ(objects[0]["kind"], "Namespace");
  EXPECT_EQ(objects[1]["kind"], "Secret");
  EXPECT_EQ(objects[2]["kind"], "VirtualMachine");
  EXPECT_EQ(objects[3]["kind"], "Service");

  // Deleting a tenant by its selector must never take the shared namespace.
  EXPECT_EQ(objects[0]["metadata"]["labels"], json({{"app.kubernetes.io/managed-by", "factory"}}));
  for (size_t i = 1; i < objects.size(); ++i) {
    const auto& labels = objects[i]["metadata"]["labels"];
    EXPECT_EQ(labels["app.kubernetes.io/managed-by"], "factory") << objects[i]["kind"];
    EXPECT_EQ(labels["factory.dev/tenant"], "tenant-1") << objects[i]["kind"];
    EXPECT_EQ(labels["factory.dev/tier"], "gpu-vm") << objects[i]["kind"];
    EXPECT_EQ(labels["team"], "ml-research") << objects[i]["kind"];
    EXPECT_EQ(objects[i]["metadata"]["namespace"], "tenants");
  }
  // The DataVolume CDI creates from the template, and the VMI, are labelled too.
  EXPECT_EQ(
      objects[2]["spec"]["dataVolumeTemplates"][0]["metadata"]["labels"]["factory.dev/tenant"],
      "tenant-1");
  EXPECT_EQ(objects[2]["spec"]["template"]["metadata"]["labels"]["factory.dev/tenant"], "tenant-1");
  EXPECT_EQ(tenant_selector("tenant-1"),
            "app.kubernetes.io/managed-by=factory,factory.dev/tenant=tenant-1");
}

TEST(TenantObjects, GpuCountBecomesNumberedGpus) {
  auto spec = runbook_vm_spec();
  spec.gpus = 2;
  json devices = virtual_machine(spec)["spec"]["template"]["spec"]["domain"]["devices"];
  EXPECT_EQ(devices["gpus"], json::parse(R"([{"name":"gpu1","deviceName":"nvidia.com/AD104GL_L4"},
                                             {"name":"gpu2","deviceName":"nvidia.com/AD104GL_L4"}])"));
  EXPECT_FALSE(devices.contains("hostDevices"));
  spec.gpus = 0;
  devices = virtual_machine(spec)["spec"]["template"]["spec"]["domain"]["devices"];
  EXPECT_FALSE(devices.contains("gpus")) << devices.dump();
}

// Writes each object as `-o yaml` prints it, one file per object (any
// validator with the `validate FILE...` command line takes that), and runs
// the schema validator on them.
CommandResult validate_objects(const std::vector<json>& objects, const TempDir& dir) {
  std::vector<std::string> files;
  for (size_t i = 0; i < objects.size(); ++i) {
    auto file = dir / ("object-" + std::to_string(i) + ".yaml");
    write_text(file, to_yaml(objects[i]));
    files.push_back(file.string());
  }
  return validate_k8s_files(files);
}

TEST(TenantObjects, AllObjectsValidateAgainstTheRealSchemas) {
  TempDir dir("objects");
  auto ud = render_user_data(sample_cloud_init_params());
  ASSERT_TRUE(ud.ok()) << ud.error().message;

  auto r = validate_objects(tenant_objects(runbook_vm_spec(), ud->text), dir);
  EXPECT_TRUE(r.ok()) << "schema validator rejected the runbook tenant (" << r.describe() << "):\n"
                      << r.output;

  // Other shapes: two GPUs, no GPU, no node port, extra labels, another namespace.
  auto spec = runbook_vm_spec("tenant-2", 0);
  spec.gpus = 2;
  spec.ns = "factory-tenants";
  spec.cpu = "500m";
  spec.memory = "8Gi";
  spec.disk = "40Gi";
  spec.labels = {{"example.com/cost-centre", "ml-42"}};
  auto no_gpu = runbook_vm_spec("cpu-only", 31000);
  no_gpu.gpus = 0;
  std::vector<json> objects = tenant_objects(spec, ud->text);
  objects.push_back(virtual_machine(no_gpu));
  r = validate_objects(objects, dir);
  EXPECT_TRUE(r.ok()) << "schema validator rejected a tenant (" << r.describe() << "):\n"
                      << r.output;
}

TEST(TenantObjects, SchemaValidatorRejectsWhatAStrictServerWould) {
  // Proves the check above can fail: each mutation is something a strict
  // API server refuses.
  TempDir dir("objects-neg");
  auto spec = runbook_vm_spec();
  struct Case {
    const char* what;
    std::function<json()> make;
  } cases[] = {
      {"unknown VM field (hostDevices misspelt)",
       [&] {
         json vm = virtual_machine(spec);
         vm["spec"]["template"]["spec"]["domain"]["devices"]["hostDevicez"] = json::array();
         return vm;
       }},
      {"GPU without a name",
       [&] {
         json vm = virtual_machine(spec);
         vm["spec"]["template"]["spec"]["domain"]["devices"]["gpus"][0].erase("name");
         return vm;
       }},
      {"unknown field inside masquerade",
       [&] {
         json vm = virtual_machine(spec);
         vm["spec"]["template"]["spec"]["domain"]["devices"]["interfaces"][0]["masquerade"]["x"] =
             1;
         return vm;
       }},
      {"Service port as a string",
       [&] {
         json svc = ssh_service(spec);
         svc["spec"]["ports"][0]["port"] = "22";
         return svc;
       }},
      {"unknown Service field",
       [&] {
         json svc = ssh_service(spec);
         svc["spec"]["nodeport"] = 30022;
         return svc;
       }},
      {"Secret with an unknown field",
       [&] {
         json s = cloud_init_secret(spec, "#cloud-config\n");
         s["stringdata"] = json::object();
         return s;
       }},
      {"Namespace with an invalid name", [&] { return namespace_object("Tenants"); }},
  };
  for (const auto& c : cases) {
    auto r = validate_objects({c.make()}, dir);
    EXPECT_FALSE(r.ok()) << c.what << ": the validator accepted it:\n" << r.output;
    EXPECT_FALSE(r.timed_out) << c.what;
    // Refused as invalid, not crashed on.
    EXPECT_EQ(r.output.find("Traceback"), std::string::npos) << c.what << ": " << r.output;
  }
}

TEST(TenantObjects, SpecValidationRefusesBadInputWithOneLine) {
  auto expect_invalid = [](VmSpec s, const std::string& needle) {
    auto st = validate_vm_spec(s);
    ASSERT_FALSE(st.ok()) << "accepted: " << needle;
    EXPECT_EQ(st.error().code, Errc::invalid_argument);
    EXPECT_NE(st.error().message.find(needle), std::string::npos) << st.error().message;
    EXPECT_EQ(st.error().message.find('\n'), std::string::npos) << st.error().message;
  };
  EXPECT_TRUE(validate_vm_spec(runbook_vm_spec()).ok());
  EXPECT_TRUE(validate_vm_spec(runbook_vm_spec("tenant-1", 0)).ok());
  EXPECT_TRUE(validate_vm_spec(runbook_vm_spec("tenant-1", 30000)).ok());
  EXPECT_TRUE(validate_vm_spec(runbook_vm_spec("tenant-1", 32767)).ok());

  expect_invalid(runbook_vm_spec("tenant-1", 29999), "out of range");
  expect_invalid(runbook_vm_spec("tenant-1", 32768), "out of range");
  expect_invalid(runbook_vm_spec("tenant-1", -1), "out of range");
  expect_invalid(runbook_vm_spec("Tenant-1"), "invalid tenant name");
  expect_invalid(runbook_vm_spec("tenant_1"), "invalid tenant name");
  expect_invalid(runbook_vm_spec("tenant-"), "invalid tenant name");
  expect_invalid(runbook_vm_spec("1tenant"), "must start with a letter");
  expect_invalid(runbook_vm_spec(std::string(60, 'a')), "longer than 59");
  EXPECT_TRUE(validate_vm_spec(runbook_vm_spec(std::string(59, 'a'))).ok());

  auto s = runbook_vm_spec();
  s.ns = "Tenants";
  expect_invalid(s, "invalid namespace");
  s = runbook_vm_spec();
  s.cpu = "eight";
  expect_invalid(s, "--cpu");
  s = runbook_vm_spec();
  s.memory = "16GB";
  expect_invalid(s, "unknown suffix");
  s = runbook_vm_spec();
  s.disk = "0Gi";
  expect_invalid(s, "more than zero");
  s = runbook_vm_spec();
  s.image_url = "ftp://example.com/x.img";
  expect_invalid(s, "https://");
  s = runbook_vm_spec();
  s.image_url = "https:///x.img";
  expect_invalid(s, "no host");
  s = runbook_vm_spec();
  s.gpu_resource = "";
  expect_invalid(s, "no GPU resource name");
  s.gpus = 0;
  EXPECT_TRUE(validate_vm_spec(s).ok()) << "a VM without GPUs needs no resource name";
  s = runbook_vm_spec();
  s.gpu_resource = "AD104GL_L4";
  expect_invalid(s, "invalid GPU resource name");
  s = runbook_vm_spec();
  s.gpus = kMaxGpusPerVm + 1;
  expect_invalid(s, "--gpus");
  s = runbook_vm_spec();
  s.tier = "";
  expect_invalid(s, "no tier");
  s = runbook_vm_spec();
  s.labels = {{"factory.dev/tenant", "someone-else"}};
  expect_invalid(s, "reserved");
  s = runbook_vm_spec();
  s.labels = {{"bad key!", "x"}};
  expect_invalid(s, "invalid label key");
  s = runbook_vm_spec();
  s.labels = {{"team", "-x"}};
  expect_invalid(s, "invalid value");
}

TEST(TenantObjects, QuantitiesFollowKubernetesSyntax) {
  for (const char* q : {"8", "500m", "16Gi", "100Gi", "1.5", "2k", "1e3", "1E+3", "0.5Gi", "1Ei"})
    EXPECT_TRUE(validate_quantity("q", q).ok()) << q;
  for (const char* q : {"", "Gi", "16 Gi", "16gb", "-1", "1.2.3", "0", "0m", "1e", "1x"})
    EXPECT_FALSE(validate_quantity("q", q).ok()) << q;
}

}  // namespace
}  // namespace factory::testing
