// The agent binary the coordinator serves (coordinator/tenants/agent_binary.hpp)
// and the rollout request's checks (agent_rollout.hpp). The rollout end to
// end is tests/integration/agent_rollout_test.cpp.
#include <gtest/gtest.h>

#include <fstream>
#include <thread>

#include "common/pki.hpp"
#include "coordinator/tenants/agent_binary.hpp"
#include "coordinator/tenants/agent_rollout.hpp"
#include "tests/support/test_support.hpp"

namespace factory::testing {
namespace {

using nlohmann::json;
using namespace factory::tenants;
namespace fs = std::filesystem;

std::string marked(const std::string& version) {
  return "ELF..." + std::string(proto::kAgentVersionMark) + version + std::string(1, '\0') + "..";
}

void write(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << bytes;
}

TEST(ServedAgentBinary, ReadsTheVersionMarkAndSaysWhenThereIsNone) {
  TempDir dir("agent-binary");
  const fs::path p = dir.path() / "factory-agent";
  write(p, marked("0.2.0"));
  AgentBinary bin(p.string());
  auto s = bin.current();
  ASSERT_TRUE(s->readable());
  EXPECT_EQ(s->version, "0.2.0");
  EXPECT_EQ(s->sha256, pki::sha256_hex(marked("0.2.0")));
  EXPECT_EQ(s->size, marked("0.2.0").size());
  EXPECT_EQ(s->cannot_upgrade(), "");
  EXPECT_EQ(s->to_json()["version"], "0.2.0");

  write(p, "an agent from before the mark");
  auto none = bin.refresh();
  EXPECT_TRUE(none->readable());
  EXPECT_EQ(none->version, "");
  EXPECT_EQ(none->cannot_upgrade(),
            "cannot upgrade: " + p.string() + " carries no factory-agent version mark");
  EXPECT_EQ(none->to_json()["no_version"], p.string() + " carries no factory-agent version mark");

  AgentBinary missing((dir.path() / "absent").string());
  EXPECT_FALSE(missing.current()->readable());
  EXPECT_NE(missing.current()->cannot_upgrade().find("is not readable"), std::string::npos);
}

TEST(ServedAgentBinary, IsReadAgainOnlyWhenTheFileChangedAndKeepsTheOrderedOneByHash) {
  TempDir dir("agent-binary");
  const fs::path p = dir.path() / "factory-agent";
  write(p, marked("0.2.0"));
  AgentBinary bin(p.string());
  std::vector<std::string> seen;
  bin.on_change([&](const AgentBinarySnapshot& s) { seen.push_back(s.version); });
  ASSERT_EQ(seen, std::vector<std::string>{"0.2.0"});
  auto first = bin.current();
  EXPECT_EQ(bin.refresh(), first) << "unchanged: the same snapshot, nothing read";
  EXPECT_EQ(seen.size(), 1u);
  // At most one look per kRecheckEvery when asked by an io thread.
  EXPECT_FALSE(bin.refresh_due());
  EXPECT_EQ(bin.refresh_if_due(), first);

  bin.keep_for_orders(first);
  write(p, marked("0.3.0-rc.1"));
  auto second = bin.refresh();
  EXPECT_EQ(second->version, "0.3.0-rc.1");
  EXPECT_EQ(seen.back(), "0.3.0-rc.1");
  // An order out for 0.2.0 still downloads 0.2.0, never the new file.
  EXPECT_EQ(bin.by_sha256(first->sha256), first);
  EXPECT_EQ(bin.by_sha256(second->sha256), second);
  EXPECT_EQ(bin.by_sha256(std::string(64, '0')), nullptr);
}

TEST(UpgradeRequest, ChecksEveryFieldAndNamesIt) {
  auto ok = UpgradeRequest::from_json({{"all", true}, {"max_unavailable", 3}});
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_TRUE(ok->all);
  EXPECT_EQ(ok->max_unavailable, 3);
  EXPECT_EQ(ok->confirm_within_s, 120);
  auto named = UpgradeRequest::from_json({{"tenants", {"a", "b", "a"}}, {"dry_run", true}});
  ASSERT_TRUE(named.ok());
  EXPECT_EQ(named->tenants, (std::vector<std::string>{"a", "b"}));
  auto bad = [](const json& j) {
    auto r = UpgradeRequest::from_json(j);
    EXPECT_FALSE(r.ok()) << j.dump();
    return r.ok() ? std::string() : r.error().message;
  };
  EXPECT_NE(bad(json::object()).find("name the tenants"), std::string::npos);
  EXPECT_NE(bad({{"all", true}, {"tenants", {"a"}}}).find("not both"), std::string::npos);
  EXPECT_NE(bad({{"all", true}, {"max_unavailable", 0}}).find("max_unavailable: want 1 to"),
            std::string::npos);
  EXPECT_NE(bad({{"all", true}, {"confirm_within_s", 5}}).find("confirm_within_s: want 10 to"),
            std::string::npos);
  EXPECT_NE(bad({{"all", true}, {"colour", "red"}}).find("not colour"), std::string::npos);
  EXPECT_NE(bad({{"tenants", {"Bad Name"}}}), "");
}

}  // namespace
}  // namespace factory::testing
