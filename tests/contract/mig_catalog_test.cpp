// The gpu-k8s-mig tier of the built-in catalog and the rule a MIG tier's
// pieces must agree by (contract/catalog.cpp, check_mig_tier), and which cards
// have MIG (contract/mig_cards.hpp).
#include <gtest/gtest.h>

#include "common/yaml_json.hpp"
#include "contract/catalog.hpp"
#include "contract/mig_cards.hpp"

namespace factory {
namespace {

using nlohmann::json;

const catalog::StepDef* step(const catalog::Tier& t, const std::string& id) {
  for (const auto& s : t.steps)
    if (s.id == id) return &s;
  return nullptr;
}

TEST(MigTier, TheBuiltInTierCutsTheH200IntoSevenSmallSlices) {
  auto cat = catalog::builtin();
  ASSERT_TRUE(cat) << cat.error().message;
  auto t = cat->tier("gpu-k8s-mig");
  ASSERT_TRUE(t) << t.error().message;
  const catalog::Tier& tier = **t;
  EXPECT_TRUE(tier_needs_mig(tier));
  EXPECT_FALSE(tier_needs_mig(**cat->tier("gpu-k8s")));
  EXPECT_FALSE(tier_needs_mig(**cat->tier("gpu-vm")));

  const auto* op = step(tier, "gpu-operator");
  ASSERT_NE(op, nullptr);
  const json& v = op->params["values"];
  EXPECT_EQ(v["mig"]["strategy"], "mixed");
  EXPECT_EQ(v["migManager"]["config"]["name"], "custom-mig-config");
  EXPECT_EQ(v["migManager"]["config"]["create"], true);
  EXPECT_EQ(v["migManager"]["env"][0], (json{{"name", "WITH_REBOOT"}, {"value", "true"}}));
  auto cfg = parse_yaml(v["migManager"]["config"]["data"]["config.yaml"].get<std::string>(), "c");
  ASSERT_TRUE(cfg) << cfg.error().message;
  const json& entry = (*cfg)["mig-configs"]["factory-7x1g.18gb"][0];
  EXPECT_EQ(entry["devices"], json::array({0}));
  EXPECT_EQ(entry["mig-enabled"], true);
  EXPECT_EQ(entry["mig-devices"]["1g.18gb"], 7);
  EXPECT_EQ((*cfg)["mig-configs"]["all-disabled"][0]["mig-enabled"], false);

  const auto* label = step(tier, "label-mig-config");
  ASSERT_NE(label, nullptr);
  EXPECT_EQ(label->params["labels"]["nvidia.com/mig.config"], "factory-7x1g.18gb");
  const auto* wait = step(tier, "mig-allocatable");
  ASSERT_NE(wait, nullptr);
  EXPECT_EQ(wait->params["resource"], "nvidia.com/mig-1g.18gb");
  EXPECT_EQ(wait->params["count"], 7);
  ASSERT_TRUE(tier.health);
  EXPECT_EQ(tier.health->k8s_resource, "nvidia.com/mig-1g.18gb");
}

// The built-in tier as YAML with one edit, through the catalog's parser.
Result<catalog::Catalog> edited(const std::string& from, const std::string& to) {
  std::string yaml(catalog::builtin_yaml());
  auto at = yaml.find(from, yaml.find("name: gpu-k8s-mig"));
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) yaml.replace(at, from.size(), to);
  return catalog::parse(yaml, "test");
}

TEST(MigTier, TheCatalogRefusesAConfigThatLeavesAGpuUnsaid) {
  // Two cards, the config naming only GPU 0: GPU 1 must be given mig-enabled: false.
  auto two = edited("      gpus: 1\n      # Any allowlisted card with MIG",
                    "      gpus: 2\n      # Any allowlisted card with MIG");
  ASSERT_FALSE(two);
  EXPECT_NE(two.error().message.find("says nothing about GPU 1: give every GPU left out an entry "
                                     "with mig-enabled: false"),
            std::string::npos)
      << two.error().message;
}

TEST(MigTier, TheCatalogRefusesPiecesThatDisagree) {
  auto count = edited("      mig_count: 7", "      mig_count: 8");
  ASSERT_FALSE(count);
  EXPECT_NE(count.error().message.find("must be a count from 1 to 7"), std::string::npos)
      << count.error().message;
  auto single = edited("              strategy: mixed", "              strategy: single");
  ASSERT_FALSE(single);
  EXPECT_NE(single.error().message.find("mig.strategy: must be mixed"), std::string::npos)
      << single.error().message;
  auto wait = edited("          count: ${settings.mig_count}", "          count: 6");
  ASSERT_FALSE(wait);
  EXPECT_NE(wait.error().message.find("waits for 6 nvidia.com/mig-1g.18gb but config "
                                      "'factory-7x1g.18gb' makes 7"),
            std::string::npos)
      << wait.error().message;
  auto label = edited("            nvidia.com/mig.config: ${settings.mig_config}",
                      "            nvidia.com/mig.config: no-such-config");
  ASSERT_FALSE(label);
  EXPECT_NE(label.error().message.find("has no config 'no-such-config'"), std::string::npos)
      << label.error().message;
  auto name = edited("      mig_profile: 1g.18gb", "      mig_profile: 1g.18GB");
  ASSERT_FALSE(name);
}

TEST(MigCards, OnlyTheMigChipsByPciDeviceId) {
  EXPECT_EQ(mig_chip(0x10de, 0x2335), "GH100");  // H200 SXM 141GB (the real VM's card)
  EXPECT_EQ(mig_chip(0x10de, 0x20b5), "GA100");  // A100 PCIe 80GB
  EXPECT_EQ(mig_chip(0x10de, 0x2901), "GB100");  // B200
  EXPECT_FALSE(mig_chip(0x10de, 0x27b8));        // the runbook's L4
  EXPECT_FALSE(mig_chip(0x8086, 0x2335));
  auto id = parse_pci_selector("10de:2335");
  ASSERT_TRUE(id);
  EXPECT_EQ(id->device, 0x2335u);
  EXPECT_FALSE(parse_pci_selector("10de:233"));
  EXPECT_FALSE(parse_pci_selector("10de-2335"));
  EXPECT_FALSE(parse_pci_selector("zzzz:2335"));
}

}  // namespace
}  // namespace factory
