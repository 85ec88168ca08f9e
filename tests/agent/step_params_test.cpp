// Each step kind's params are written once (contract/step_params.hpp) and read
// by both sides: the catalog validates with the table, and every step kind
// builds itself from what the table normalized. The built-in catalog (and a
// small one for the kinds it does not use) walked through both.
#include "contract/step_params.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "agent/plan/step.hpp"
#include "agent/steps/builtin.hpp"
#include "contract/catalog.hpp"

namespace factory::testing {
namespace {

using nlohmann::json;

// The kinds the built-in catalog does not use, as an admin would write them.
const char* kOtherKinds = R"yaml(version: 1
tiers:
  - name: others
    description: The kinds the built-in tiers do not use.
    vm: {cpu: "2", memory: 2Gi, disk: 10Gi, image: "https://example.invalid/i.img", gpus: 1}
    steps:
      - id: tools
        kind: apt_packages
        params: {packages: [jq, "curl=8.5.0-2ubuntu10"]}
      - id: script
        kind: script
        params: {run: "true"}
      - id: mig
        kind: mig
        params: {gpu: 0, instances: {"3g.71gb": 1, "1g.18gb": 4}}
)yaml";

agent::StepRegistry builtin_registry() {
  agent::StepRegistry reg;
  agent::register_builtin_steps(reg);
  return reg;
}

std::vector<catalog::Tier> tiers_to_walk() {
  std::vector<catalog::Tier> out;
  for (auto cat : {catalog::builtin(), catalog::parse(kOtherKinds, "others.yaml")}) {
    EXPECT_TRUE(cat) << cat.error().message;
    if (cat) out.insert(out.end(), cat->tiers.begin(), cat->tiers.end());
  }
  return out;
}

agent::StepSpec spec_of(const catalog::StepDef& s, json params) {
  agent::StepSpec spec;
  spec.id = s.id;
  spec.kind = s.kind;
  spec.params = std::move(params);
  spec.timeout = s.timeout;
  spec.retries = s.retries;
  return spec;
}

TEST(StepParams, TheSchemasKindsAreExactlyTheAgentsBuiltInKinds) {
  auto registered = builtin_registry().kinds();
  std::vector<std::string> schema = catalog::step_kinds();
  std::sort(registered.begin(), registered.end());
  std::sort(schema.begin(), schema.end());
  EXPECT_EQ(registered, schema);
}

TEST(StepParams, EveryCatalogStepValidatesAndIsBuiltFromItsNormalizedParams) {
  auto reg = builtin_registry();
  std::set<std::string> walked;
  for (const auto& tier : tiers_to_walk()) {
    for (const auto& s : tier.steps) {
      SCOPED_TRACE("tier " + tier.name + ", step " + s.id);
      walked.insert(s.kind);
      const catalog::StepKindSchema* schema = catalog::find_step_kind(s.kind);
      ASSERT_NE(schema, nullptr);
      auto n = catalog::normalize_step_params(s.kind, s.params, "step '" + s.id + "'");
      ASSERT_TRUE(n) << n.error().message;
      // Every default is there for the step to read, and the defaults
      // themselves pass the table's rules.
      for (const auto& p : schema->params) {
        if (!p.default_value.is_null()) {
          EXPECT_TRUE(n->contains(p.name)) << p.name;
        }
      }
      auto again = catalog::normalize_step_params(s.kind, *n, "step '" + s.id + "'");
      ASSERT_TRUE(again) << again.error().message;
      EXPECT_EQ(*again, *n);
      // The catalog keeps the plan's params as written.
      for (auto& [key, value] : s.params.items()) {
        EXPECT_EQ((*n)[key], value) << key;
      }

      auto built = reg.create(spec_of(s, *n));
      EXPECT_TRUE(built) << built.error().message;
      auto as_sent = reg.create(spec_of(s, s.params));
      EXPECT_TRUE(as_sent) << as_sent.error().message;
    }
  }
  std::set<std::string> all(catalog::step_kinds().begin(), catalog::step_kinds().end());
  EXPECT_EQ(walked, all) << "a kind no catalog above uses is not walked";
}

const catalog::StepDef& catalog_step(const catalog::Catalog& cat, const std::string& tier,
                                     const std::string& id) {
  auto t = cat.tier(tier);
  EXPECT_TRUE(t);
  for (const auto& s : (*t)->steps)
    if (s.id == id) return s;
  throw std::runtime_error("no step " + id);
}

TEST(StepParams, TheAgentRefusesWhatTheCatalogRefusesInTheSameWords) {
  auto cat = catalog::builtin();
  ASSERT_TRUE(cat) << cat.error().message;
  auto reg = builtin_registry();
  struct Case {
    std::string tier, id;
    std::function<void(json&)> spoil;
    std::string error;  // after "step '<id>': "
  };
  std::vector<Case> cases = {
      {"gpu-vm", "nvidia-driver", [](json& p) { p.erase("packages"); },
       "params.packages: required for a nvidia_driver step"},
      {"gpu-vm", "nvidia-driver", [](json& p) { p["repo"]["kind"] = "lokal"; },
       "params.repo.kind: must be local or network, got 'lokal'"},
      {"gpu-vm", "nvidia-driver",
       [](json& p) { p["repo"]["url"] = "https://example.invalid/x.tar"; },
       "params.repo.url: must name a .deb package, got 'https://example.invalid/x.tar'"},
      {"gpu-vm", "gpu-present", [](json& p) { p["vendor"] = "nvidia"; },
       "params.vendor: must be a 4-digit PCI vendor ID like \"10de\" (quote it)"},
      {"gpu-vm", "ollama", [](json& p) { p["install_url"] = "http://ollama.com/install.sh"; },
       "params.install_url: must be an https:// URL, got 'http://ollama.com/install.sh'"},
      {"gpu-k8s", "gpu-operator", [](json& p) { p["wait_timeout"] = "soon"; },
       "params.wait_timeout: invalid duration 'soon' (use e.g. 90s, 30m, 1h, 7d)"},
      {"gpu-k8s", "rke2",
       [](json& p) {
         p["config"] = {{"cluster-cidr", "10.52.0.0/16"},
                        {"service-cidr", "10.53.0.0/16"},
                        {"cluster-dns", "10.54.0.10"}};
       },
       "params.config.cluster-dns: 10.54.0.10 is outside service-cidr 10.53.0.0/16"},
      {"gpu-k8s", "rke2",
       [](json& p) {
         p["config"] = {{"cluster-cidr", "10.52.0.0/16"}};
       },
       "params.config: set all of cluster-cidr, service-cidr and cluster-dns, or none (they "
       "are then chosen around the host cluster's ranges)"},
      {"gpu-k8s", "rke2",
       [](json& p) {
         p["ranges"] = {{"avoid", {{{"range", "10.42.0.0/33"}, {"source", "x"}}}}};
       },
       "params.ranges.avoid[0].range: invalid prefix length in '10.42.0.0/33' (0 to 32)"},
      {"gpu-k8s", "rke2",
       [](json& p) {
         p["ranges"] = {{"pool", {{"blocks", {"fd00::/48"}}}}};
       },
       "params.ranges.pool.blocks[0]: fd00::/48 is IPv6: the guest cluster is IPv4 only (RKE2 "
       "single-stack)"},
      {"gpu-k8s", "gpus-allocatable", [](json& p) { p["count"] = 0; },
       "params.count: must be at least 1"},
      {"gpu-k8s", "label-gpu-node", [](json& p) { p["nodes"] = json::array(); },
       "params.nodes: must be all or a list of node names"},
  };
  for (const auto& c : cases) {
    const auto& s = catalog_step(*cat, c.tier, c.id);
    json params = s.params;
    c.spoil(params);
    std::string want = "step '" + c.id + "': " + c.error;
    auto checked = catalog::validate_catalog_step_params(s.kind, params, "step '" + c.id + "'");
    ASSERT_FALSE(checked) << want;
    EXPECT_EQ(checked.error().message, want);
    auto built = reg.create(spec_of(s, params));
    ASSERT_FALSE(built) << want;
    EXPECT_EQ(built.error().message, want);
  }
}

TEST(StepParams, TheCatalogAloneRefusesTheHostClustersLikelyRanges) {
  // The catalog cannot see the host; the agent checks the guest's real DNS
  // server when the step runs (steps_k8s_rke2_test).
  auto cat = catalog::builtin();
  ASSERT_TRUE(cat) << cat.error().message;
  const auto& s = catalog_step(*cat, "gpu-k8s", "rke2");
  json params = s.params;
  params["config"] = {{"cluster-cidr", "10.42.0.0/16"},
                      {"service-cidr", "10.43.0.0/16"},
                      {"cluster-dns", "10.43.0.10"}};
  auto checked = catalog::validate_catalog_step_params(s.kind, params, "step 'rke2'");
  ASSERT_FALSE(checked);
  EXPECT_NE(checked.error().message.find("a range of the host cluster"), std::string::npos)
      << checked.error().message;
  EXPECT_TRUE(builtin_registry().create(spec_of(s, params)));
}

TEST(StepParams, DefaultsAreFilledInWhereTheParamsLeaveThemOut) {
  auto n = catalog::normalize_step_params(
      "nvidia_driver",
      {{"version", "615.71.09"},
       {"package_version", "615.71.09-1ubuntu1"},
       {"packages", {"nvidia-headless-open"}},
       {"repo",
        {{"kind", "network"}, {"url", "https://example.invalid/cuda-keyring_1.1-1_all.deb"}}}},
      "step 'drv'");
  ASSERT_TRUE(n) << n.error().message;
  EXPECT_EQ((*n)["repo"]["cache_dir"], "/var/cache/factory");
  EXPECT_EQ((*n)["prerequisites"], json({"ca-certificates", "curl"}));
  EXPECT_EQ((*n)["kernel_headers"], true);
  EXPECT_EQ((*n)["reboot"], true);

  auto script = catalog::normalize_step_params("script", {{"run", "true"}}, "step 's'");
  ASSERT_TRUE(script) << script.error().message;
  EXPECT_FALSE(script->contains("check"));  // no default: without one, run runs every time
  EXPECT_EQ((*script)["reboot"], false);
  EXPECT_EQ((*script)["env"], json::object());
}

}  // namespace
}  // namespace factory::testing
