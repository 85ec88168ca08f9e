// The Tenant custom resource (coordinator/tenants/tenant_resource.hpp): the
// CRD's shape and structural schema, its patterns held against the
// coordinator's own validators, a Tenant read into the CLI's request and
// written back, every refusal naming its field, and the copy kept in
// deploy/ equal to what `factory install crds` prints.
#include "coordinator/tenants/tenant_resource.hpp"

#include <gtest/gtest.h>

#include <functional>
#include <regex>

#include "common/yaml_json.hpp"
#include "coordinator/enroll/tenant_name.hpp"
#include "coordinator/tenants/k8s_names.hpp"
#include "coordinator/tenants/vm_spec.hpp"
#include "tests/support/test_support.hpp"

namespace factory::tenants {
namespace {

using nlohmann::json;

const char* kKey =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGb2cHzNnZDn3MQ2oGpdlw8Bi4aDAZ5pqc3VkxmlH5sb alice@laptop";

const json& version0() {
  static const json v = tenant_crd()["spec"]["versions"][0];
  return v;
}

const json& spec_schema() {
  return version0()["schema"]["openAPIV3Schema"]["properties"]["spec"];
}

json full_tenant() {
  return {{"apiVersion", "factory.dev/v1alpha1"},
          {"kind", "Tenant"},
          {"metadata",
           {{"name", "alice"}, {"namespace", "tenants"}, {"generation", 3}, {"uid", "u-1"}}},
          {"spec",
           {{"tier", "gpu-vm"},
            {"gpus", 1},
            {"gpuResource", "nvidia.com/GH100_H200"},
            {"cpu", 8},
            {"memory", "64Gi"},
            {"disk", "200Gi"},
            {"image", "https://cloud-images.ubuntu.com/noble/current/noble.img"},
            {"models", {"llama3.2:1b", "hf.co/org/model:q4"}},
            {"sshKeys",
             {{{"publicKey", kKey}},
              {{"secretKeyRef", {{"name", "alice-keys"}, {"key", "authorized_keys"}}}}}},
            {"sshNodePort", 30022},
            {"project", "team-a"},
            {"catalogVersion", "2026.12.1"}}}};
}

TEST(TenantCrd, NamesTheResourceAsKubectlSeesIt) {
  const json crd = tenant_crd();
  EXPECT_EQ(crd["apiVersion"], "apiextensions.k8s.io/v1");
  EXPECT_EQ(crd["kind"], "CustomResourceDefinition");
  EXPECT_EQ(crd["metadata"]["name"], "tenants.factory.dev");
  EXPECT_EQ(crd["spec"]["group"], "factory.dev");
  EXPECT_EQ(crd["spec"]["scope"], "Namespaced");
  EXPECT_EQ(crd["spec"]["names"]["kind"], "Tenant");
  EXPECT_EQ(crd["spec"]["names"]["plural"], "tenants");
  ASSERT_EQ(crd["spec"]["versions"].size(), 1u);
  EXPECT_EQ(version0()["name"], "v1alpha1");
  EXPECT_TRUE(version0()["served"].get<bool>());
  EXPECT_TRUE(version0()["storage"].get<bool>());
  EXPECT_EQ(version0()["subresources"], json({{"status", json::object()}}))
      << "status is written through its subresource, never with the spec";
  std::vector<std::string> columns;
  for (const auto& c : version0()["additionalPrinterColumns"]) columns.push_back(c["name"]);
  EXPECT_EQ(columns, (std::vector<std::string>{"Tier", "Phase", "GPU", "Ready", "Age"}));
  const json root = version0()["schema"]["openAPIV3Schema"];
  EXPECT_EQ(root["required"], json({"spec"}));
  EXPECT_EQ(spec_schema()["required"], json({"tier"}));
  std::set<std::string> conditions_keys;
  for (auto& [k, v] :
       root["properties"]["status"]["properties"]["conditions"]["items"]["properties"].items())
    conditions_keys.insert(k);
  EXPECT_EQ(conditions_keys, (std::set<std::string>{"type", "status", "reason", "message",
                                                    "observedGeneration", "lastTransitionTime"}));
}

// The API server refuses a CRD whose schema is not structural
// (apiextensions.k8s.io/v1): every field has a type (or is an
// int-or-string), and inside anyOf there is no description or default.
void expect_structural(const json& node, const std::string& path) {
  SCOPED_TRACE(path);
  const bool int_or_string = node.value("x-kubernetes-int-or-string", false);
  if (int_or_string) {
    ASSERT_TRUE(node.contains("anyOf"));
    ASSERT_EQ(node["anyOf"].size(), 2u);
    EXPECT_EQ(node["anyOf"][0], json({{"type", "integer"}}));
    EXPECT_EQ(node["anyOf"][1], json({{"type", "string"}}));
    EXPECT_FALSE(node.contains("type"));
  } else {
    ASSERT_TRUE(node.contains("type")) << "no type";
    EXPECT_FALSE(node.contains("anyOf"));
  }
  if (node.contains("properties")) {
    EXPECT_EQ(node["type"], "object");
    for (auto& [k, v] : node["properties"].items()) expect_structural(v, path + "." + k);
  }
  if (node.contains("items")) {
    EXPECT_EQ(node["type"], "array");
    expect_structural(node["items"], path + "[]");
  }
}

TEST(TenantCrd, TheSchemaIsStructural) {
  const json root = version0()["schema"]["openAPIV3Schema"];
  expect_structural(root, "");
  // metadata may only be restricted in name and generateName: not at all here.
  EXPECT_EQ(root["properties"]["metadata"], json({{"type", "object"}}));
  // The root's rule (a CEL expression) is the only one that sees metadata.name.
  ASSERT_EQ(root["x-kubernetes-validations"].size(), 1u);
  EXPECT_NE(root["x-kubernetes-validations"][0]["rule"].get<std::string>().find(
                "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')"),
            std::string::npos);
}

// Each pattern of the schema accepts exactly what the coordinator's own rule
// accepts, over samples that probe the rule's edges.
void expect_same_rule(const std::string& pattern, const std::function<bool(const std::string&)>& ok,
                      const std::vector<std::string>& samples) {
  const std::regex re(pattern, std::regex::ECMAScript);
  for (const auto& s : samples)
    EXPECT_EQ(std::regex_match(s, re), ok(s)) << "'" << s << "' against " << pattern;
}

TEST(TenantCrd, ItsPatternsAreTheCoordinatorsRules) {
  const json& props = spec_schema()["properties"];
  expect_same_rule(props["memory"]["pattern"],
                   [](const std::string& s) { return validate_quantity("q", s).ok(); },
                   {"16Gi", "8",     "500m", "1.5",  ".5",   "5.",    "1e3", "1E+3",  "2e-1",
                    "0",    "0.0",   "00",   "0Gi",  "",     "-1",    "+1",  "1.2.3", "Gi",
                    "16GB", "16 Gi", "1e",   "1ee3", "0.05", "100Ki", "3Ei", "3E",    "7P"});
  EXPECT_EQ(props["disk"]["pattern"], props["memory"]["pattern"]);
  EXPECT_EQ(props["cpu"]["pattern"], props["memory"]["pattern"]);
  expect_same_rule(props["gpuResource"]["pattern"],
                   [](const std::string& s) { return validate_resource_name(s).ok(); },
                   {"nvidia.com/GH100_H200", "nvidia.com/AD104GL_L4", "example.com/a", "a/b",
                    "nvidia.com/", "/gpu", "nvidia.com/-x", "nvidia.com/x-", "Nvidia.com/x",
                    "nvidia..com/x", "nvidia.com/a.b_c-d", "gpu", "nvidia.com/a/b"});
  expect_same_rule(props["models"]["items"]["pattern"],
                   [](const std::string& s) { return validate_model_name(s).ok(); },
                   {"llama3.2:1b", "hf.co/org/model:q4", "Llama3", "-x", ".x", "x y", "a",
                    std::string(128, 'a'), std::string(129, 'a'), "", "x;rm"});
  expect_same_rule(
      props["tier"]["pattern"],
      [](const std::string& s) { return !s.empty() && validate_label(kTierLabel, s).ok(); },
      {"gpu-vm", "gpu-k8s-mig", "model-endpoint", "-gpu", "gpu-", "GPU_VM.1", "",
       std::string(63, 'a'), std::string(64, 'a'), "a b"});
  expect_same_rule(props["project"]["pattern"],
                   [](const std::string& s) { return is_dns1123_label(s); },
                   {"team-a", "a", "-a", "a-", "Team", "a.b", "9lives"});
  // The root's name rule: a tenant name that is also a VM name.
  const std::regex name_re("^[a-z]([-a-z0-9]*[a-z0-9])?$");
  for (std::string s : {"alice", "a", "team-a", "9lives", "-a", "a-", "Alice", "a.b", "a_b"}) {
    const bool ok = enroll::validate_tenant_name(s).ok() && validate_vm_name(s).ok();
    EXPECT_EQ(std::regex_match(s, name_re), ok) << s;
  }
}

TEST(TenantResource, ATenantBecomesTheRequestTheCliMakes) {
  auto r = tenant_from_object(full_tenant());
  ASSERT_TRUE(r.ok()) << r.error().message;
  const TenantRequest& q = r->request;
  EXPECT_EQ(q.name, "alice");
  EXPECT_EQ(q.ns, "tenants");
  EXPECT_EQ(q.tier, "gpu-vm");
  ASSERT_TRUE(q.gpus.has_value());
  EXPECT_EQ(*q.gpus, 1);
  EXPECT_EQ(q.gpu_resource, "nvidia.com/GH100_H200");
  EXPECT_EQ(q.cpu, "8") << "an integer cpu reads as the quantity it is";
  EXPECT_EQ(q.memory, "64Gi");
  EXPECT_EQ(q.disk, "200Gi");
  EXPECT_EQ(q.image, "https://cloud-images.ubuntu.com/noble/current/noble.img");
  EXPECT_EQ(q.models, (std::vector<std::string>{"llama3.2:1b", "hf.co/org/model:q4"}));
  EXPECT_EQ(q.ssh_authorized_keys, std::vector<std::string>{kKey});
  EXPECT_EQ(q.ssh_node_port, 30022);
  EXPECT_TRUE(q.password.empty());
  EXPECT_EQ(r->ssh_key_refs, (std::vector<SecretKeyRef>{{"alice-keys", "authorized_keys"}}));
  EXPECT_EQ(r->project, "team-a");
  EXPECT_EQ(r->catalog_version, "2026.12.1");
  EXPECT_EQ(r->generation, 3);
  EXPECT_EQ(r->uid, "u-1");

  // And back: the object a dry run prints reads as the same resource.
  json again = tenant_object(*r);
  EXPECT_FALSE(again.contains("status"));
  auto back = tenant_from_object(again);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->request.to_json(), q.to_json());
  EXPECT_EQ(back->ssh_key_refs, r->ssh_key_refs);
  EXPECT_EQ(back->project, r->project);
  EXPECT_EQ(back->catalog_version, r->catalog_version);
  EXPECT_EQ(again["spec"]["cpu"], "8");
}

TEST(TenantResource, TheLeastTenantIsANameAndATier) {
  json t = {{"apiVersion", "factory.dev/v1alpha1"},
            {"kind", "Tenant"},
            {"metadata", {{"name", "bob"}}},
            {"spec", {{"tier", "model-endpoint"}}}};
  auto r = tenant_from_object(t);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->request.name, "bob");
  EXPECT_EQ(r->request.tier, "model-endpoint");
  EXPECT_FALSE(r->request.gpus.has_value());
  EXPECT_TRUE(r->request.ns.empty());
  EXPECT_TRUE(r->request.ssh_authorized_keys.empty());
  EXPECT_EQ(tenant_object(*r), t);
}

// Every refusal says which field and why, as `factory tenant create` would.
TEST(TenantResource, EveryRefusalNamesItsField) {
  struct Case {
    std::function<void(json&)> edit;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](json& t) { t["apiVersion"] = "factory.dev/v1"; }, "want apiVersion factory.dev/v1alpha1"},
      {[](json& t) { t["kind"] = "VirtualMachine"; }, "kind Tenant"},
      {[](json& t) { t["metadata"].erase("name"); }, "metadata.name: is required"},
      {[](json& t) { t["metadata"]["name"] = "Alice"; }, "metadata.name: invalid tenant name"},
      {[](json& t) { t["metadata"]["name"] = "9lives"; }, "metadata.name:"},
      {[](json& t) { t["metadata"]["name"] = std::string(60, 'a'); }, "metadata.name:"},
      {[](json& t) { t["metadata"]["namespace"] = "Tenants"; }, "metadata.namespace:"},
      {[](json& t) { t.erase("spec"); }, "spec: is required"},
      {[](json& t) { t["spec"] = "gpu-vm"; }, "spec: must be an object"},
      {[](json& t) { t["spec"]["replicas"] = 3; }, "spec: unknown field 'replicas'"},
      {[](json& t) { t["spec"].erase("tier"); }, "spec.tier: is required"},
      {[](json& t) { t["spec"]["tier"] = "gpu vm"; }, "spec.tier:"},
      {[](json& t) { t["spec"]["gpus"] = 17; },
       "spec.gpus: is 17: want a whole number from 0 to 16"},
      {[](json& t) { t["spec"]["gpus"] = 4294967297ULL; }, "spec.gpus: is 4294967297"},
      {[](json& t) { t["spec"]["gpus"] = "1"; }, "spec.gpus: must be"},
      {[](json& t) { t["spec"]["gpuResource"] = "h200"; },
       "spec.gpuResource: invalid GPU resource"},
      {[](json& t) { t["spec"]["cpu"] = 0; }, "spec.cpu: is 0"},
      {[](json& t) { t["spec"]["cpu"] = 1.5; }, "spec.cpu: must be a quantity"},
      {[](json& t) { t["spec"]["memory"] = "64GB"; },
       "spec.memory '64GB' is not a Kubernetes quantity"},
      {[](json& t) { t["spec"]["disk"] = "0"; }, "spec.disk '0' is not a Kubernetes quantity"},
      {[](json& t) { t["spec"]["models"] = {"x;rm -rf /"}; }, "spec.models:"},
      {[](json& t) {
         t["spec"]["models"] = json::array({"a", "b", "c", "d", "e", "f", "g", "h", "i"});
       },
       "spec.models: must be a list of at most 8"},
      {[](json& t) { t["spec"]["sshNodePort"] = 22; },
       "spec.sshNodePort: is 22: want a whole number from 30000 to 32767"},
      {[](json& t) {
         t["spec"]["sshKeys"] = {{{"publicKey", "-----BEGIN OPENSSH PRIVATE KEY-----"}}};
       },
       "spec.sshKeys[0].publicKey: that is a private key"},
      {[](json& t) {
         t["spec"]["sshKeys"] = {
             {{"publicKey", kKey}, {"secretKeyRef", {{"name", "a"}, {"key", "b"}}}}};
       },
       "spec.sshKeys[0]: give exactly one of publicKey and secretKeyRef"},
      {[](json& t) {
         t["spec"]["sshKeys"] = {{{"secretKeyRef", {{"name", "a"}}}}};
       },
       "spec.sshKeys[0].secretKeyRef: must be {name"},
      {[](json& t) {
         t["spec"]["sshKeys"] = {{{"secretKeyRef", {{"name", "Keys!"}, {"key", "k"}}}}};
       },
       "spec.sshKeys[0].secretKeyRef.name: is not a Secret name"},
      {[](json& t) {
         t["spec"]["sshKeys"] = {{{"secretKeyRef", {{"name", "k"}, {"key", "a/b"}}}}};
       },
       "spec.sshKeys[0].secretKeyRef.key: is not a Secret data key"},
      {[](json& t) {
         t["spec"]["sshKeys"] = {{{"publicKey", kKey}, {"comment", "x"}}};
       },
       "spec.sshKeys[0]: unknown field 'comment'"},
      {[](json& t) { t["spec"]["project"] = "Team A"; },
       "spec.project: 'Team A' is not a DNS-1123 label"},
      {[](json& t) { t["spec"]["catalogVersion"] = "v 1"; },
       "spec.catalogVersion: is not a catalog version"},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    json t = full_tenant();
    cases[i].edit(t);
    auto r = tenant_from_object(t);
    ASSERT_FALSE(r.ok()) << "case " << i << " was accepted: " << t.dump();
    EXPECT_EQ(r.error().code, Errc::invalid_argument);
    EXPECT_NE(r.error().message.find(cases[i].field), std::string::npos)
        << "case " << i << ": " << r.error().message;
    EXPECT_EQ(r.error().message.rfind("Tenant ", 0), 0u) << r.error().message;
  }
}

// deploy/kubernetes/tenant-crd.yaml is what `factory install crds` prints;
// after a change to the CRD: factory install crds > deploy/kubernetes/tenant-crd.yaml
TEST(TenantCrd, TheCopyInDeployIsCurrent) {
  auto text = factory::testing::slurp(std::string(FACTORY_SOURCE_DIR) +
                                      "/deploy/kubernetes/tenant-crd.yaml");
  auto doc = parse_yaml(text, "deploy/kubernetes/tenant-crd.yaml");
  ASSERT_TRUE(doc.ok()) << doc.error().message;
  EXPECT_EQ(*doc, tenant_crd())
      << "regenerate it: factory install crds > deploy/kubernetes/tenant-crd.yaml";
}

}  // namespace
}  // namespace factory::tenants
