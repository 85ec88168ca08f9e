// `factory catalog list|show|validate` through the real binary.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "common/yaml_json.hpp"
#include "contract/catalog.hpp"
#include "tests/support/test_support.hpp"

using factory::testing::factory_bin;
using factory::testing::run;
using factory::testing::TempDir;
using nlohmann::json;

namespace {

// Every invocation names a config file that does not exist, so the test never
// depends on /etc/factory on the machine running it.
std::vector<std::string> fac(const TempDir& dir, std::vector<std::string> args) {
  std::vector<std::string> argv = {factory_bin(), "--config", (dir / "absent.yaml").string()};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

const char* kOwnCatalog = R"(version: 1
tiers:
  - name: cpu-box
    description: A VM with a script-installed tool.
    vm: {cpu: "4", memory: 8Gi, disk: 40Gi, image: "https://example.invalid/i.img", gpus: 1}
    versions: {jq: "1.7"}
    steps:
      - id: jq
        kind: script
        params:
          check: command -v jq
          run: apt-get install -y jq=${versions.jq}*
)";

}  // namespace

TEST(CatalogCli, ListJsonShowsEveryBuiltInTier) {
  TempDir dir;
  auto r = run(fac(dir, {"catalog", "list", "-o", "json"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  json doc = json::parse(r.output);
  EXPECT_EQ(doc["source"], "built-in");
  ASSERT_EQ(doc["tiers"].size(), 4u);
  EXPECT_EQ(doc["tiers"][0]["name"], "gpu-vm");
  EXPECT_EQ(doc["tiers"][1]["name"], "gpu-k8s");
  EXPECT_EQ(doc["tiers"][2]["name"], "gpu-k8s-mig");
  EXPECT_EQ(doc["tiers"][3]["name"], "model-endpoint");
  EXPECT_EQ(doc["tiers"][0]["vm"]["memory"], "16Gi");
  EXPECT_EQ(doc["tiers"][0]["versions"]["nvidia_driver"], "615.71.09");
  // The hash the CLI shows is the one the library computes for the plan.
  auto c = factory::catalog::builtin();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(doc["tiers"][1]["plan_hash"], factory::catalog::plan_hash(c->find("gpu-k8s")->plan()));
}

TEST(CatalogCli, ListTableAndYaml) {
  TempDir dir;
  auto t = run(fac(dir, {"catalog", "list"}));
  ASSERT_EQ(t.exit_code, 0) << t.output;
  EXPECT_EQ(t.output.rfind("TIER", 0), 0u) << t.output;
  EXPECT_NE(t.output.find("gpu-vm "), std::string::npos);
  EXPECT_NE(t.output.find("rke2 v1.36.4+rke2r1"), std::string::npos);
  auto y = run(fac(dir, {"catalog", "list", "-o", "yaml"}));
  ASSERT_EQ(y.exit_code, 0) << y.output;
  auto doc = factory::parse_yaml(y.output, "output");
  ASSERT_TRUE(doc.ok()) << doc.error().message;
  EXPECT_EQ((*doc)["tiers"][1]["versions"]["hami"], "2.10.0");
}

TEST(CatalogCli, ShowTierAndItsPlan) {
  TempDir dir;
  auto r = run(fac(dir, {"catalog", "show", "gpu-k8s", "-o", "json"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  json tier = json::parse(r.output);
  EXPECT_EQ(tier["name"], "gpu-k8s");
  EXPECT_EQ(tier["settings"]["split_count"], 10);
  EXPECT_EQ(tier["steps"][1]["params"]["config"], json::object()) << "ranges chosen per tenant";

  auto p = run(fac(dir, {"catalog", "show", "gpu-vm", "--plan", "-o", "json"}));
  ASSERT_EQ(p.exit_code, 0) << p.output;
  json plan = json::parse(p.output);
  EXPECT_EQ(plan["tier"], "gpu-vm");
  EXPECT_EQ(plan["plan_hash"], factory::catalog::plan_hash(plan["plan"]));
  EXPECT_EQ(plan["plan"]["steps"][1]["timeout_seconds"], 2700);

  // YAML is the default for show.
  auto y = run(fac(dir, {"catalog", "show", "gpu-vm"}));
  ASSERT_EQ(y.exit_code, 0) << y.output;
  EXPECT_NE(y.output.find("name: \"gpu-vm\""), std::string::npos) << y.output;
}

TEST(CatalogCli, UnknownTierIsOneClearLine) {
  TempDir dir;
  auto r = run(fac(dir, {"catalog", "show", "gpu-xl"}));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(
      r.output,
      "factory: unknown tier 'gpu-xl' (known: gpu-vm, gpu-k8s, gpu-k8s-mig, model-endpoint)\n");
}

TEST(CatalogCli, OwnCatalogByFlagAndByConfig) {
  TempDir dir;
  std::ofstream(dir / "own.yaml") << kOwnCatalog;
  auto r =
      run(fac(dir, {"catalog", "--catalog", (dir / "own.yaml").string(), "list", "-o", "json"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  json doc = json::parse(r.output);
  EXPECT_EQ(doc["source"], (dir / "own.yaml").string());
  ASSERT_EQ(doc["tiers"].size(), 1u);
  EXPECT_EQ(doc["tiers"][0]["steps"][0]["params"]["run"], "apt-get install -y jq=1.7*");

  // The config's `catalog:` key, relative to the config file's folder.
  std::ofstream(dir / "coordinator.yaml") << "catalog: own.yaml\n";
  auto c = run({factory_bin(), "--config", (dir / "coordinator.yaml").string(), "catalog", "show",
                "cpu-box", "-o", "json"});
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_EQ(json::parse(c.output)["vm"]["cpu"], "4");
  // The flag wins over the config.
  auto b = run({factory_bin(), "--config", (dir / "coordinator.yaml").string(), "catalog",
                "--catalog", (dir / "own.yaml").string(), "show", "gpu-vm"});
  EXPECT_NE(b.exit_code, 0);
  EXPECT_EQ(b.output, "factory: unknown tier 'gpu-vm' (known: cpu-box)\n");
}

TEST(CatalogCli, ValidateReportsTheFirstMistake) {
  TempDir dir;
  std::ofstream(dir / "own.yaml") << kOwnCatalog;
  auto ok = run(fac(dir, {"catalog", "validate", (dir / "own.yaml").string()}));
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_EQ(ok.output, "catalog " + (dir / "own.yaml").string() + ": valid, 1 tier: cpu-box\n");

  std::string broken = kOwnCatalog;
  broken.replace(broken.find("kind: script"), 12, "kind: shell");
  std::ofstream(dir / "broken.yaml") << broken;
  auto bad = run(fac(dir, {"catalog", "validate", (dir / "broken.yaml").string()}));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(bad.output,
            "factory: catalog " + (dir / "broken.yaml").string() +
                ": tier 'cpu-box': step 'jq': unknown step kind 'shell' (known: gpu_present, "
                "apt_packages, nvidia_driver, ollama_install, ollama_model, rke2, helm_release, "
                "node_label, wait_allocatable, mig, script)\n");
}
