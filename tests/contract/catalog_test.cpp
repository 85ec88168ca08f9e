// The catalog as data: the built-in tiers match the runbook, every ${...} is
// resolved, the plan hash is a stable content address, and an admin's mistakes
// are reported as one line naming the tier, step and key.
#include "contract/catalog.hpp"

#include <gtest/gtest.h>

#include <fstream>

#include "tests/support/test_support.hpp"

namespace cat = factory::catalog;
using nlohmann::json;

namespace {

// A small valid catalog that tests mutate to provoke each error.
const char* kMini = R"(version: 1
tiers:
  - name: mini
    description: A test tier.
    vm:
      cpu: 2
      memory: 4Gi
      disk: 20Gi
      image: https://example.invalid/image.img
      gpus: 1
      gpu_resource: nvidia.com/AD104GL_L4
    versions:
      tool: "1.2"
      models: [a, b]
    settings:
      count: 3
    steps:
      - id: one
        kind: script
        params:
          run: echo ${versions.tool} ${HOME} $${versions.tool}
      - id: model-${item}
        for_each: ${versions.models}
        kind: ollama_model
        params: {model: "${item}"}
      - id: alloc
        kind: wait_allocatable
        timeout: 90s
        retries: 2
        params: {resource: nvidia.com/gpu, count: "${settings.count}"}
)";

std::string replace(std::string s, const std::string& from, const std::string& to) {
  auto pos = s.find(from);
  EXPECT_NE(pos, std::string::npos) << "test bug: '" << from << "' not in the catalog";
  if (pos != std::string::npos) s.replace(pos, from.size(), to);
  return s;
}

std::string error_of(const std::string& yaml) {
  auto c = cat::parse(yaml, "test.yaml");
  EXPECT_FALSE(c.ok()) << "expected an error";
  return c.ok() ? std::string() : c.error().message;
}

const json* step_by_id(const json& plan, const std::string& id) {
  for (auto& s : plan["steps"])
    if (s["id"] == id) return &s;
  return nullptr;
}

}  // namespace

TEST(Catalog, BuiltInValidatesWithTheTwoTiersInOrder) {
  auto c = cat::builtin();
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->source, "built-in");
  EXPECT_EQ(c->names(),
            (std::vector<std::string>{"gpu-vm", "gpu-k8s", "gpu-k8s-mig", "model-endpoint"}));
}

TEST(Catalog, BuiltInIsTheFileInTheSourceTree) {
  // The binary embeds catalog/catalog.yaml at build time; they must not drift.
  EXPECT_EQ(std::string(cat::builtin_yaml()),
            factory::testing::slurp(factory::testing::source_dir() / "catalog" / "catalog.yaml"));
}

TEST(Catalog, GpuVmMatchesTheRunbook) {
  auto c = cat::builtin();
  ASSERT_TRUE(c.ok());
  const cat::Tier* t = c->find("gpu-vm");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->vm.cpu, "8");
  EXPECT_EQ(t->vm.memory, "16Gi");
  EXPECT_EQ(t->vm.disk, "100Gi");
  EXPECT_EQ(t->vm.image,
            "https://cloud-images.ubuntu.com/noble/current/noble-server-cloudimg-amd64.img");
  EXPECT_EQ(t->vm.gpus, 1);
  EXPECT_EQ(t->vm.gpu_resource, "");
  std::vector<std::string> kinds;
  for (auto& s : t->steps) kinds.push_back(s.kind);
  EXPECT_EQ(kinds, (std::vector<std::string>{"gpu_present", "nvidia_driver", "ollama_install",
                                             "ollama_model"}));

  json plan = t->plan();
  EXPECT_EQ(plan["tier"], "gpu-vm");
  const json* drv = step_by_id(plan, "nvidia-driver");
  ASSERT_NE(drv, nullptr);
  const json& p = (*drv)["params"];
  EXPECT_EQ(p["version"], "615.71.09");
  EXPECT_EQ(p["package_version"], "615.71.09-1ubuntu1");
  EXPECT_EQ(p["packages"], json({"nvidia-headless-open", "nvidia-persistenced"}));
  EXPECT_EQ(p["reboot"], true);
  EXPECT_EQ(p["repo"]["kind"], "local");
  EXPECT_NE(
      p["repo"]["url"].get<std::string>().find("nvidia-driver-local-repo-ubuntu2404-615.71.09"),
      std::string::npos);
  EXPECT_EQ((*drv)["timeout_seconds"], 45 * 60);
  const json* ollama = step_by_id(plan, "ollama");
  ASSERT_NE(ollama, nullptr);
  EXPECT_EQ((*ollama)["params"]["version"], "0.40.2");
  const json* model = step_by_id(plan, "model-llama3.2:1b");
  ASSERT_NE(model, nullptr);
  EXPECT_EQ((*model)["kind"], "ollama_model");
  EXPECT_EQ((*model)["params"]["model"], "llama3.2:1b");
}

TEST(Catalog, GpuK8sMatchesTheRunbook) {
  auto c = cat::builtin();
  ASSERT_TRUE(c.ok());
  const cat::Tier* t = c->find("gpu-k8s");
  ASSERT_NE(t, nullptr);
  std::vector<std::string> ids, kinds;
  for (auto& s : t->steps) {
    ids.push_back(s.id);
    kinds.push_back(s.kind);
  }
  EXPECT_EQ(kinds, (std::vector<std::string>{"gpu_present", "rke2", "helm_release", "node_label",
                                             "helm_release", "wait_allocatable"}));
  EXPECT_EQ(ids, (std::vector<std::string>{"gpu-present", "rke2", "gpu-operator", "label-gpu-node",
                                           "hami", "gpus-allocatable"}));
  json plan = t->plan();
  const json& rke2 = (*step_by_id(plan, "rke2"))["params"];
  EXPECT_EQ(rke2["version"], "v1.36.4+rke2r1");
  // Chosen per tenant around the host's ranges (contract/cluster_ranges.hpp).
  EXPECT_EQ(rke2["config"], json::object());
  EXPECT_FALSE(rke2.contains("ranges")) << "the coordinator adds the host's, per tenant";
  const json& op = (*step_by_id(plan, "gpu-operator"))["params"];
  EXPECT_EQ(op["version"], "v26.3.2");
  EXPECT_EQ(op["values"]["devicePlugin"]["enabled"], false);
  json env = op["values"]["toolkit"]["env"];
  ASSERT_EQ(env.size(), 4u);
  EXPECT_EQ(env[0], json({{"name", "CONTAINERD_SOCKET"},
                          {"value", "/run/k3s/containerd/containerd.sock"}}));
  EXPECT_EQ(env[3], json({{"name", "CONTAINERD_SET_AS_DEFAULT"}, {"value", "true"}}));
  const json& label = (*step_by_id(plan, "label-gpu-node"))["params"];
  EXPECT_EQ(label["labels"], json({{"gpu", "on"}}));
  const json& hami = (*step_by_id(plan, "hami"))["params"];
  EXPECT_EQ(hami["version"], "2.10.0");
  EXPECT_EQ(hami["values"]["devicePlugin"]["deviceSplitCount"], 10);
  EXPECT_EQ(hami["values"]["devicePlugin"]["deviceListStrategy"], "cdi-annotations");
  EXPECT_EQ(hami["values"]["devicePlugin"]["nvidiaDriverRoot"], "/run/nvidia/driver");
  EXPECT_EQ(hami["values"]["devicePlugin"]["gpuOperatorToolkitReady"]["enabled"], true);
  const json& alloc = (*step_by_id(plan, "gpus-allocatable"))["params"];
  EXPECT_EQ(alloc, json({{"resource", "nvidia.com/gpu"},
                         {"count", 10},
                         {"kubeconfig", "/etc/rancher/rke2/rke2.yaml"}}));
}

TEST(Catalog, ReferencesForEachAndEscapes) {
  auto c = cat::parse(kMini, "mini.yaml");
  ASSERT_TRUE(c.ok()) << c.error().message;
  const cat::Tier& t = c->tiers.at(0);
  EXPECT_EQ(t.vm.cpu, "2");  // `cpu: 2` becomes the quantity string "2"
  ASSERT_EQ(t.steps.size(), 4u);
  // ${versions.*} is expanded; a shell's ${HOME} is left alone; $${ is a literal ${.
  EXPECT_EQ(t.steps[0].params["run"], "echo 1.2 ${HOME} ${versions.tool}");
  EXPECT_EQ(t.steps[1].id, "model-a");
  EXPECT_EQ(t.steps[2].id, "model-b");
  EXPECT_EQ(t.steps[2].params["model"], "b");
  // A value that is exactly one reference keeps the referenced type.
  EXPECT_EQ(t.steps[3].params["count"], 3);
  EXPECT_EQ(t.steps[3].timeout, std::chrono::seconds(90));
  EXPECT_EQ(t.steps[3].retries, 2);
  EXPECT_EQ(t.steps[0].timeout, std::chrono::minutes(30));  // the documented default
}

TEST(Catalog, PlanHashIsStableAndFollowsContent) {
  auto a = cat::builtin();
  auto b = cat::parse(std::string(cat::builtin_yaml()), "copy");
  ASSERT_TRUE(a.ok() && b.ok());
  auto pa = cat::plan_for(*a, "gpu-vm");
  auto pb = cat::plan_for(*b, "gpu-vm");
  ASSERT_TRUE(pa.ok() && pb.ok());
  EXPECT_EQ(cat::plan_hash(*pa), cat::plan_hash(*pb));
  EXPECT_EQ(cat::plan_hash(*pa).size(), 64u);
  // Key order in the source does not matter: the hash is over canonical JSON.
  json reordered = json::parse(pa->dump());
  EXPECT_EQ(cat::plan_hash(reordered), cat::plan_hash(*pa));
  // Known vector: SHA-256("abc").
  EXPECT_EQ(cat::sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");

  // Changing one pinned version changes the gpu-vm plan's hash and nothing else's.
  std::string changed =
      replace(std::string(cat::builtin_yaml()), "ollama: 0.40.2", "ollama: 0.40.3");
  auto c = cat::parse(changed, "changed");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_NE(cat::plan_hash(*cat::plan_for(*c, "gpu-vm")), cat::plan_hash(*pa));
  EXPECT_EQ(cat::plan_hash(*cat::plan_for(*c, "gpu-k8s")),
            cat::plan_hash(*cat::plan_for(*a, "gpu-k8s")));
  // So does a step's retries (it is part of what the agent runs).
  std::string retries =
      replace(std::string(cat::builtin_yaml()), "timeout: 15m\n        retries: 2",
              "timeout: 15m\n        retries: 3");
  auto d = cat::parse(retries, "retries");
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_NE(cat::plan_hash(*cat::plan_for(*d, "gpu-vm")), cat::plan_hash(*pa));
}

TEST(Catalog, UnknownTierNamesTheKnownOnes) {
  auto c = cat::builtin();
  ASSERT_TRUE(c.ok());
  auto t = c->tier("gpu-xl");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error().message,
            "unknown tier 'gpu-xl' (known: gpu-vm, gpu-k8s, gpu-k8s-mig, model-endpoint)");
  EXPECT_FALSE(cat::plan_for(*c, "x").ok());
}

TEST(Catalog, ErrorsNameTheTierStepAndKey) {
  std::string m = kMini;
  EXPECT_EQ(
      error_of(replace(m, "kind: wait_allocatable", "kind: wait_alocatable")),
      "catalog test.yaml: tier 'mini': step 'alloc': unknown step kind 'wait_alocatable' (known: "
      "gpu_present, apt_packages, nvidia_driver, ollama_install, ollama_model, rke2, helm_release, "
      "node_label, wait_allocatable, mig, script)");
  EXPECT_EQ(error_of(replace(m, "{resource: nvidia.com/gpu, ", "{resourse: nvidia.com/gpu, ")),
            "catalog test.yaml: tier 'mini': step 'alloc': params: unknown key 'resourse' (known: "
            "resource, "
            "count, kubeconfig)");
  EXPECT_EQ(error_of(replace(m, "run: echo", "runn: echo")),
            "catalog test.yaml: tier 'mini': step 'one': params: unknown key 'runn' (known: check, "
            "run, verify, "
            "reboot, env)");
  EXPECT_EQ(error_of(replace(m, "${settings.count}", "${settings.cuont}")),
            "catalog test.yaml: tier 'mini': step 'alloc': params.count: unknown reference "
            "${settings.cuont} "
            "(known: settings.count)");
  EXPECT_EQ(error_of(replace(m, "tool: \"1.2\"", "tool: 1.2")),
            "catalog test.yaml: tier 'mini': versions.tool: YAML reads 1.2 as a number: quote the "
            "version "
            "(\"1.2\") so it is kept exactly as written");
  EXPECT_EQ(error_of(replace(m, "id: alloc", "id: one")),
            "catalog test.yaml: tier 'mini': step 'one': duplicate step id (ids must be unique in "
            "a tier)");
  EXPECT_EQ(error_of(replace(m, "memory: 4Gi", "memory: 4 gigs")),
            "catalog test.yaml: tier 'mini': vm.memory: '4 gigs' is not a Kubernetes quantity "
            "(e.g. 8, 500m, 16Gi)");
  EXPECT_EQ(error_of(replace(m, "gpus: 1", "gpus: 0")),
            "catalog test.yaml: tier 'mini': vm.gpus: must be a whole number from 1 to 16");
  EXPECT_EQ(error_of(replace(m, "timeout: 90s", "timeout: 90x")),
            "catalog test.yaml: tier 'mini': step 'alloc': timeout: invalid duration unit in '90x' "
            "(use s, m, h or d)");
  EXPECT_EQ(
      error_of(replace(m, "retries: 2", "retries: -1")),
      "catalog test.yaml: tier 'mini': step 'alloc': retries: must be a whole number from 0 to 10");
  EXPECT_EQ(error_of(replace(m, "    description: A test tier.\n", "")),
            "catalog test.yaml: tier 'mini': description: required");
  EXPECT_EQ(error_of(replace(m, "name: mini", "name: Mini_Tier")),
            "catalog test.yaml: tier 'Mini_Tier': name: must be a DNS-1123 label (lower-case "
            "letters, digits "
            "and '-', at most 63)");
  EXPECT_EQ(error_of(replace(m, "    settings:", "    setings:")),
            "catalog test.yaml: tier 'mini': unknown key 'setings' (known: name, description, "
            "cost, vm, versions, "
            "settings, steps, health, access, endpoint)");
  EXPECT_EQ(error_of(replace(m, "version: 1", "version: 2")),
            "catalog test.yaml: unsupported catalog version 2 (this factory reads version 1)");
  EXPECT_NE(error_of("version: 1\ntiers: [\n").find("catalog test.yaml: invalid YAML at line"),
            std::string::npos);
  EXPECT_EQ(error_of(replace(m, "for_each: ${versions.models}", "for_each: ${versions.tool}")),
            "catalog test.yaml: tier 'mini': step 'model-${item}': for_each: must be a non-empty "
            "list (or a "
            "reference to one), got a string");
  // A list can stand alone as a value but not inside text.
  EXPECT_EQ(error_of(replace(m, "run: echo ${versions.tool}", "run: echo ${versions.models}")),
            "catalog test.yaml: tier 'mini': step 'one': params.run: ${versions.models} is a list: "
            "it can only be "
            "used as the whole value, not inside text");
  // Two tiers with one name.
  std::string twice = m + std::string(m).substr(std::string(m).find("  - name: mini"));
  EXPECT_EQ(error_of(twice), "catalog test.yaml: tier 'mini' is defined twice");
}

TEST(Catalog, Rke2RangesMustNotClashWithTheHostCluster) {
  // A catalog that fixes the ranges instead of having them chosen.
  std::string k8s =
      replace(std::string(cat::builtin_yaml()), "          config: {}\n",
              "          config:\n            cluster-cidr: ${settings.cluster_cidr}\n"
              "            service-cidr: ${settings.service_cidr}\n"
              "            cluster-dns: ${settings.cluster_dns}\n");
  k8s = replace(k8s, "      split_count:",
                "      cluster_cidr: 10.52.0.0/16\n      service_cidr: 10.53.0.0/16\n"
                "      cluster_dns: 10.53.0.10\n      split_count:");
  auto fixed = cat::parse(k8s, "test.yaml");
  ASSERT_TRUE(fixed.ok()) << fixed.error().message;
  // RKE2's default service range: the runbook's DNS clash.
  EXPECT_EQ(error_of(replace(k8s, "service_cidr: 10.53.0.0/16", "service_cidr: 10.43.0.0/16")),
            "catalog test.yaml: tier 'gpu-k8s': step 'rke2': params.config.service-cidr: "
            "10.43.0.0/16 overlaps "
            "10.43.0.0/16, a range of the host cluster (RKE2/k3s default): the guest's DNS would "
            "clash with the "
            "host's; pick e.g. 10.52.0.0/16 and 10.53.0.0/16");
  EXPECT_EQ(error_of(replace(k8s, "cluster_dns: 10.53.0.10", "cluster_dns: 10.54.0.10")),
            "catalog test.yaml: tier 'gpu-k8s': step 'rke2': params.config.cluster-dns: 10.54.0.10 "
            "is outside "
            "service-cidr 10.53.0.0/16");
  EXPECT_EQ(error_of(replace(k8s, "cluster_cidr: 10.52.0.0/16", "cluster_cidr: 10.53.0.0/17")),
            "catalog test.yaml: tier 'gpu-k8s': step 'rke2': params.config: cluster-cidr "
            "10.53.0.0/17 overlaps "
            "service-cidr 10.53.0.0/16");
}

TEST(Catalog, StepKindParamsAreChecked) {
  std::string vm = std::string(cat::builtin_yaml());
  EXPECT_EQ(error_of(replace(vm, "kind: local", "kind: lokal")),
            "catalog test.yaml: tier 'gpu-vm': step 'nvidia-driver': params.repo.kind: must be "
            "local or network, "
            "got 'lokal'");
  EXPECT_EQ(
      error_of(
          replace(vm, "          packages: [nvidia-headless-open, nvidia-persistenced]\n", "")),
      "catalog test.yaml: tier 'gpu-vm': step 'nvidia-driver': params.packages: required for a "
      "nvidia_driver step");
  EXPECT_EQ(error_of(replace(vm, "vendor: \"10de\"", "vendor: 10de0")),
            "catalog test.yaml: tier 'gpu-vm': step 'gpu-present': params.vendor: must be a "
            "4-digit PCI vendor ID "
            "like \"10de\" (quote it)");
  EXPECT_EQ(error_of(replace(vm, "install_url: https://ollama.com/install.sh",
                             "install_url: http://ollama.com/install.sh")),
            "catalog test.yaml: tier 'gpu-vm': step 'ollama': params.install_url: must be an "
            "https:// URL, got "
            "'http://ollama.com/install.sh'");
  EXPECT_EQ(error_of(replace(vm, "wait_timeout: 20m", "wait_timeout: soon")),
            "catalog test.yaml: tier 'gpu-k8s': step 'gpu-operator': params.wait_timeout: invalid "
            "duration 'soon' "
            "(use e.g. 90s, 30m, 1h, 7d)");
  EXPECT_EQ(error_of(replace(vm, "gpu: \"on\"", "gpu: true")),
            "catalog test.yaml: tier 'gpu-k8s': step 'label-gpu-node': params.labels.gpu: must be "
            "a string (quote "
            "it), got a boolean");
}

// Helm is pinned by version and sha256; a pin that could not be checked is refused.
TEST(Catalog, HelmsPinIsChecked) {
  std::string vm = std::string(cat::builtin_yaml());
  EXPECT_EQ(error_of(replace(vm, "helm: v3.19.0", "helm: latest")),
            "catalog test.yaml: tier 'gpu-k8s': step 'gpu-operator': params.helm_version: must be "
            "a Helm release like v3.19.0, got 'latest'");
  EXPECT_EQ(error_of(replace(vm, "amd64: a7f81ce0", "amd64: A7F81CE0")),
            "catalog test.yaml: tier 'gpu-k8s': step 'gpu-operator': params.helm_sha256.amd64: "
            "must be 64 lowercase hex digits (the release's .sha256sum)");
  EXPECT_EQ(error_of(replace(vm, "        arm64: 440cf7", "        riscv: 440cf7")),
            "catalog test.yaml: tier 'gpu-k8s': step 'gpu-operator': params.helm_sha256.riscv: is "
            "not an architecture: use amd64 or arm64");
  // The one way Helm used to come in (a script from Helm's main branch) is gone.
  EXPECT_NE(error_of(replace(vm, "          helm_version: ${versions.helm}\n",
                             "          helm_installer: https://get.helm.sh/x\n")),
            "");
}

TEST(Catalog, LoadFileAndLoadDefault) {
  factory::testing::TempDir dir;
  auto path = dir / "mine.yaml";
  std::ofstream(path) << kMini;
  auto c = cat::load(path.string());
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->source, path.string());
  EXPECT_EQ(c->names(), std::vector<std::string>{"mini"});
  auto d = cat::load("");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->source, "built-in");
  auto missing = cat::load((dir / "nope.yaml").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("catalog: "), std::string::npos);
}

TEST(Catalog, ShowDocumentCarriesThePlanHash) {
  auto c = cat::builtin();
  ASSERT_TRUE(c.ok());
  json doc = c->find("gpu-k8s")->to_json();
  EXPECT_EQ(doc["plan_hash"], cat::plan_hash(c->find("gpu-k8s")->plan()));
  EXPECT_EQ(doc["steps"][1]["timeout"], "20m");
  EXPECT_EQ(doc["versions"]["hami"], "2.10.0");
  EXPECT_EQ(doc["vm"]["gpus"], 1);
}

// Which health collectors run is the tier's to say, carried in its plan.
TEST(Catalog, HealthSectionIsCarriedInThePlan) {
  auto c = cat::builtin();
  ASSERT_TRUE(c) << c.error().message;
  json vm = c->find("gpu-vm")->plan();
  EXPECT_EQ(vm["health"], json({{"ollama", true}, {"k8s", nullptr}}));
  json k8s = c->find("gpu-k8s")->plan();
  EXPECT_EQ(
      k8s["health"],
      json({{"ollama", false},
            {"k8s",
             {{"resource", "nvidia.com/gpu"}, {"kubeconfig", "/etc/rancher/rke2/rke2.yaml"}}}}))
      << "${settings.kubeconfig} is resolved";
  // `catalog show` shows it too.
  EXPECT_EQ(c->find("gpu-vm")->to_json()["health"], vm["health"]);

  // A tier without one reports the GPU only, and its plan (and hash) does not change.
  auto mini = cat::parse(kMini, "test.yaml");
  ASSERT_TRUE(mini) << mini.error().message;
  EXPECT_FALSE(mini->find("mini")->plan().contains("health"));
  auto with = cat::parse(replace(kMini, "    steps:\n", "    health: {k8s: true}\n    steps:\n"),
                         "test.yaml");
  ASSERT_TRUE(with) << with.error().message;
  EXPECT_EQ(with->find("mini")->plan()["health"]["k8s"]["resource"], "nvidia.com/gpu");
  EXPECT_NE(cat::plan_hash(with->find("mini")->plan()), cat::plan_hash(mini->find("mini")->plan()));
}

TEST(Catalog, HealthSectionErrorsNameTheKey) {
  auto with = [](const std::string& section) {
    return replace(kMini, "    steps:\n", "    health: " + section + "\n    steps:\n");
  };
  EXPECT_EQ(
      error_of(with("{olama: true}")),
      "catalog test.yaml: tier 'mini': health: unknown key 'olama' (known: ollama, k8s, probe)");
  EXPECT_EQ(error_of(with("{ollama: yes please}")),
            "catalog test.yaml: tier 'mini': health.ollama: must be true or false");
  EXPECT_EQ(error_of(with("{k8s: {resource: gpus}}")),
            "catalog test.yaml: tier 'mini': health.k8s.resource: 'gpus' is not a resource name "
            "like nvidia.com/gpu");
  EXPECT_EQ(error_of(with("{k8s: {kubeconfig: rke2.yaml}}")),
            "catalog test.yaml: tier 'mini': health.k8s.kubeconfig: must be an absolute path in "
            "the guest");
  EXPECT_EQ(error_of(with("{k8s: 3}")),
            "catalog test.yaml: tier 'mini': health.k8s: must be true, false or a map with "
            "resource and kubeconfig");
  EXPECT_EQ(error_of(with("{k8s: {kubeconfig: \"${settings.kube}\"}}")),
            "catalog test.yaml: tier 'mini': health.k8s.kubeconfig: unknown reference "
            "${settings.kube} (known: settings.count)");
}

// The runbook's third customer: gpu-vm's own steps (the YAML alias keeps
// them one list), no login, an endpoint on 8443, and a health probe; the
// other tiers' plans are as they were (no probe key, no endpoint key).
TEST(Catalog, ModelEndpointIsGpuVmsGuestBehindAKey) {
  auto c = cat::builtin();
  ASSERT_TRUE(c.ok()) << c.error().message;
  const cat::Tier* me = c->find("model-endpoint");
  const cat::Tier* vm = c->find("gpu-vm");
  ASSERT_NE(me, nullptr);
  ASSERT_NE(vm, nullptr);
  EXPECT_FALSE(me->access.login);
  EXPECT_TRUE(vm->access.login);
  ASSERT_TRUE(me->endpoint.has_value());
  EXPECT_EQ(me->endpoint->port, 8443);
  EXPECT_FALSE(vm->endpoint.has_value());
  json mp = me->plan(), vp = vm->plan();
  EXPECT_EQ(mp["steps"], vp["steps"]) << "the same guest as gpu-vm";
  EXPECT_EQ(mp["endpoint"], (json{{"port", 8443}}));
  EXPECT_EQ(mp["health"]["probe"]["every_seconds"], 300);
  EXPECT_EQ(mp["health"]["probe"]["model"], "llama3.2:1b");
  EXPECT_FALSE(vp.contains("endpoint"));
  EXPECT_FALSE(vp["health"].contains("probe")) << "the probe is off on gpu-vm unless asked for";
  EXPECT_NE(me->cost.find("no customer access"), std::string::npos) << me->cost;
}

TEST(Catalog, EndpointAccessAndProbeAreChecked) {
  const std::string base = R"(version: 1
tiers:
  - name: t
    description: d
    vm: {cpu: "1", memory: 1Gi, disk: 1Gi, image: "https://x.example/i.img", gpus: 1}
    access: {login: false}
    endpoint: {port: 8443}
    health:
      ollama: true
      probe: {every: 5m, model: "llama3.2:1b"}
    steps:
      - id: one
        kind: script
        params: {run: "true"}
)";
  auto ok = cat::parse(base, "test.yaml");
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(ok->tiers[0].health->probe_prompt, "Say OK.") << "a default prompt";
  EXPECT_NE(error_of(replace(base, "port: 8443", "port: 80")).find("endpoint.port"),
            std::string::npos);
  EXPECT_NE(error_of(replace(base, "login: false", "login: no-thanks")).find("access.login"),
            std::string::npos);
  EXPECT_NE(error_of(replace(base, "every: 5m", "every: 5s")).find("at least 30s"),
            std::string::npos);
  EXPECT_NE(error_of(replace(base, "ollama: true", "ollama: false")).find("needs health.ollama"),
            std::string::npos);
  EXPECT_NE(error_of(replace(base, "endpoint: {port: 8443}", "endpoint: {port: 8443, tls: off}"))
                .find("tls"),
            std::string::npos);
}
