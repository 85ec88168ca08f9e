// What a tier upgrade compares and sends (contract/tier_upgrade.hpp): the
// steps and pins that differ between the plan a tenant runs and its tier's
// plan in a newer catalog (the built-in catalog with the gpu-vm driver pin
// moved, as an admin's catalog file would), and the order the agent reads.
#include <gtest/gtest.h>

#include "contract/catalog.hpp"
#include "contract/protocol.hpp"
#include "contract/tier_upgrade.hpp"

using namespace factory;
using nlohmann::json;

namespace {

// The built-in catalog's text with every `from` replaced by `to`.
std::string builtin_with(const std::string& from, const std::string& to) {
  std::string yaml(catalog::builtin_yaml());
  for (auto at = yaml.find(from); at != std::string::npos; at = yaml.find(from, at + to.size()))
    yaml.replace(at, from.size(), to);
  return yaml;
}

json gpu_vm_plan(const std::string& yaml) {
  auto c = catalog::parse(yaml, "test");
  EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.error().message);
  auto p = catalog::plan_for(*c, "gpu-vm");
  EXPECT_TRUE(p.ok());
  return p.ok() ? *p : json();
}

const catalog::StepChange* change_of(const catalog::PlanDiff& d, const std::string& id) {
  for (const auto& s : d.steps)
    if (s.id == id) return &s;
  return nullptr;
}

}  // namespace

TEST(TierUpgradeDiff, ANewDriverPinChangesTheDriverStepOnlyAndItCanGoBack) {
  const json from = gpu_vm_plan(std::string(catalog::builtin_yaml()));
  const json to = gpu_vm_plan(builtin_with("615.71.09", "620.12.04"));
  auto d = catalog::diff_plans(from, to);
  ASSERT_EQ(d.steps.size(), 1u) << d.to_json().dump(2);
  const auto& s = d.steps[0];
  EXPECT_EQ(s.id, "nvidia-driver");
  EXPECT_EQ(s.kind, "nvidia_driver");
  EXPECT_EQ(s.change, catalog::StepChange::Kind::changed);
  EXPECT_EQ(s.fields,
            (std::vector<std::string>{"params.package_version", "params.repo", "params.version"}));
  EXPECT_TRUE(s.can_go_back);
  EXPECT_EQ(d.to_run(), (std::vector<std::string>{"nvidia-driver"}));
  EXPECT_TRUE(d.sections.empty());
  json pins = d.to_json()["pins"];
  EXPECT_EQ(pins, json::parse(R"J([
    {"what": "NVIDIA driver", "from": "615.71.09", "to": "620.12.04"},
    {"what": "driver packages (nvidia-headless-open nvidia-persistenced)",
     "from": "615.71.09-1ubuntu1", "to": "620.12.04-1ubuntu1"}])J"));
}

TEST(TierUpgradeDiff, TheSamePlanDiffersInNothing) {
  const json p = gpu_vm_plan(std::string(catalog::builtin_yaml()));
  auto d = catalog::diff_plans(p, p);
  EXPECT_TRUE(d.empty());
  EXPECT_TRUE(d.pins.empty());
  EXPECT_TRUE(d.to_run().empty());
}

TEST(TierUpgradeDiff, NewOllamaAndModelsAreStepsThatCannotGoBack) {
  const json from = gpu_vm_plan(std::string(catalog::builtin_yaml()));
  const json to = gpu_vm_plan(builtin_with("ollama: 0.40.2", "ollama: 0.41.0")
                                  .replace(catalog::builtin_yaml().find("models: [llama3.2:1b]"),
                                           std::string("models: [llama3.2:1b]").size(),
                                           "models: [llama3.2:1b, qwen2.5:0.5b]"));
  auto d = catalog::diff_plans(from, to);
  const auto* ollama = change_of(d, "ollama");
  ASSERT_NE(ollama, nullptr) << d.to_json().dump(2);
  EXPECT_EQ(ollama->fields, (std::vector<std::string>{"params.version"}));
  EXPECT_FALSE(ollama->can_go_back);
  const auto* model = change_of(d, "model-qwen2.5:0.5b");
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(model->change, catalog::StepChange::Kind::added);
  EXPECT_EQ(change_of(d, "model-llama3.2:1b"), nullptr) << "unchanged";
  EXPECT_EQ(d.to_run(), (std::vector<std::string>{"ollama", "model-qwen2.5:0.5b"}));
  // A step the new plan no longer has is said, and not run.
  auto back = catalog::diff_plans(to, from);
  const auto* gone = change_of(back, "model-qwen2.5:0.5b");
  ASSERT_NE(gone, nullptr);
  EXPECT_EQ(gone->change, catalog::StepChange::Kind::removed);
  EXPECT_EQ(back.to_run(), (std::vector<std::string>{"ollama"}));
  json model_pin;
  for (const auto& p : back.pins)
    if (p.what == "model qwen2.5") model_pin = p.to_json();
  EXPECT_EQ(model_pin, json({{"what", "model qwen2.5"}, {"from", "0.5b"}, {"to", nullptr}}));
}

TEST(TierUpgradeDiff, APlanUnknownToTheCoordinatorMakesEveryStepNew) {
  const json to = gpu_vm_plan(std::string(catalog::builtin_yaml()));
  auto d = catalog::diff_plans(nullptr, to);
  EXPECT_EQ(d.to_run().size(), to["steps"].size());
  for (const auto& s : d.steps) EXPECT_EQ(s.change, catalog::StepChange::Kind::added) << s.id;
}

TEST(TierUpgradeOrder, RoundTripsAndIsCheckedAgainstItsPlan) {
  const json from = gpu_vm_plan(std::string(catalog::builtin_yaml()));
  const json to = gpu_vm_plan(builtin_with("615.71.09", "620.12.04"));
  proto::TierUpgradeOrder o;
  o.upgrade_id = "tier-0a1b2c";
  o.from_hash = catalog::plan_hash(from);
  o.to_hash = catalog::plan_hash(to);
  o.plan = to;
  o.steps = {"nvidia-driver"};
  json body = o.to_json();
  EXPECT_EQ(body["action"], "tier_upgrade");
  auto back = proto::decode_tier_upgrade_order(body);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->upgrade_id, o.upgrade_id);
  EXPECT_EQ(back->steps, o.steps);
  EXPECT_EQ(back->plan, to);

  auto refused = [&](json b, const std::string& says) {
    auto r = proto::decode_tier_upgrade_order(b);
    ASSERT_FALSE(r.ok()) << b.dump();
    EXPECT_EQ(r.error().code, Errc::invalid_argument);
    EXPECT_NE(r.error().message.find(says), std::string::npos) << r.error().message;
    EXPECT_EQ(r.error().message.find('\n'), std::string::npos);
  };
  json b = body;
  b["to_hash"] = o.from_hash;
  refused(b, "tier upgrade: plan: hashes to " + o.to_hash + ", not to_hash");
  b = body;
  b["steps"] = {"nvidia-driver", "rm -rf /"};
  refused(b, "tier upgrade: steps: the plan has no step 'rm -rf /'");
  b = body;
  b["upgrade_id"] = "tier/../x";
  refused(b, "tier upgrade: upgrade_id: want 1 to 64 characters");
  b = body;
  b["from_hash"] = "ABC";
  refused(b, "tier upgrade: from_hash: want 64 lower-case hex digits");
  b = body;
  b["action"] = "retry";
  refused(b, "tier upgrade: action");
  b = body;
  b.erase("plan");
  refused(b, "tier upgrade: plan: missing");
}

TEST(TierUpgradeOrder, OnlyTheDriverKindCanGoBack) {
  EXPECT_TRUE(catalog::step_kind_can_go_back("nvidia_driver"));
  for (const auto& kind : catalog::step_kinds())
    if (kind != "nvidia_driver") {
      EXPECT_FALSE(catalog::step_kind_can_go_back(kind)) << kind;
    }
}

TEST(TierUpgradeOrder, TheAgentNamesTheFeatureInItsHello) {
  bool named = false;
  for (auto f : proto::kAgentFeatures) named = named || f == proto::kFeatureTierUpgrade;
  EXPECT_TRUE(named);
}
