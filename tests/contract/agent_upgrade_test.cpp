// The agent upgrade's order and report (contract/agent_upgrade.hpp): what
// the agent accepts before it downloads and runs a binary, what the
// coordinator accepts before it shows a guest's words, and how the version
// is read out of a binary's bytes.
#include "contract/agent_upgrade.hpp"

#include <gtest/gtest.h>

#include <string>

namespace factory::proto {
namespace {

using nlohmann::json;

AgentUpgradeOrder good_order() {
  AgentUpgradeOrder o;
  o.upgrade_id = "up-20261205-1";
  o.version = "0.2.0-rc.1+build.7";
  o.sha256 = std::string(64, 'a');
  o.url = "https://10.0.2.2:8443/v1/agent/binary";
  o.size = 12 * 1024 * 1024;
  o.confirm_within_s = 120;
  return o;
}

TEST(AgentUpgradeOrder, RoundTripsThroughItsCommandBody) {
  auto o = good_order();
  json body = o.to_json();
  EXPECT_EQ(body["action"], "upgrade");
  auto back = decode_agent_upgrade_order(body);
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(*back, o);
}

TEST(AgentUpgradeOrder, ConfirmWithinDefaultsToTwoMinutes) {
  json body = good_order().to_json();
  body.erase("confirm_within_s");
  auto back = decode_agent_upgrade_order(body);
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(back->confirm_within_s, 120);
}

TEST(AgentUpgradeOrder, EachBadFieldIsRefusedByName) {
  struct Case {
    const char* field;
    json value;
  };
  const Case cases[] = {
      {"upgrade_id", ""},
      {"upgrade_id", "a/b"},
      {"upgrade_id", std::string(65, 'x')},
      {"version", "-1"},
      {"version", "1.0 beta"},
      {"version", "1.0\x1b[31m"},
      {"version", std::string(65, '1')},
      {"sha256", std::string(64, 'A')},
      {"sha256", std::string(63, 'a')},
      {"url", "http://10.0.2.2:8443/v1/agent/binary"},
      {"url", "https://host/a b"},
      {"url", "https://host/" + std::string(2048, 'a')},
      {"size", 0},
      {"size", -5},
      {"size", 300.5},
      {"size", json::number_unsigned_t(257) * 1024 * 1024},
      {"confirm_within_s", 9},
      {"confirm_within_s", 3601},
      {"confirm_within_s", "120"},
      {"action", "maintenance"},
  };
  for (const auto& c : cases) {
    json body = good_order().to_json();
    body[c.field] = c.value;
    auto r = decode_agent_upgrade_order(body);
    ASSERT_FALSE(r) << c.field << " = " << c.value.dump();
    EXPECT_EQ(r.error().code, Errc::invalid_argument);
    EXPECT_NE(r.error().message.find(std::string("agent upgrade: ") + c.field), std::string::npos)
        << r.error().message;
  }
  for (const char* field : {"upgrade_id", "version", "sha256", "url", "size"}) {
    json body = good_order().to_json();
    body.erase(field);
    auto r = decode_agent_upgrade_order(body);
    ASSERT_FALSE(r) << field;
    EXPECT_NE(r.error().message.find("missing"), std::string::npos) << r.error().message;
  }
  EXPECT_FALSE(decode_agent_upgrade_order(json::array()));
}

TEST(AgentUpgradeOrder, KeysItDoesNotKnowAreIgnored) {
  json body = good_order().to_json();
  body["signature"] = "from a newer coordinator";
  EXPECT_TRUE(decode_agent_upgrade_order(body));
}

TEST(AgentUpgradeEvent, RoundTripsEveryState) {
  for (auto s : {AgentUpgradeState::installing, AgentUpgradeState::refused,
                 AgentUpgradeState::upgraded, AgentUpgradeState::rolled_back}) {
    AgentUpgradeEvent e{"up-1", s, "0.1.0", "0.1.1", "exited with status 1 at start, 3 times"};
    json body = e.to_json();
    EXPECT_EQ(body["kind"], "agent_upgrade");
    auto back = decode_agent_upgrade_event(body);
    ASSERT_TRUE(back) << back.error().message;
    EXPECT_EQ(*back, e);
  }
}

TEST(AgentUpgradeEvent, AGuestsWordsAreRefusedWhenTheyCouldNotBeShown) {
  AgentUpgradeEvent e{"up-1", AgentUpgradeState::rolled_back, "0.1.0", "0.1.1", "x"};
  json body = e.to_json();
  body["reason"] = "done\x1b]0;owned\x07";
  EXPECT_FALSE(decode_agent_upgrade_event(body));
  body["reason"] = std::string(513, 'r');
  EXPECT_FALSE(decode_agent_upgrade_event(body));
  body = e.to_json();
  body["state"] = "exploded";
  EXPECT_FALSE(decode_agent_upgrade_event(body));
  body = e.to_json();
  body["to_version"] = "1.0\n2.0";
  EXPECT_FALSE(decode_agent_upgrade_event(body));
  body = e.to_json();
  body["kind"] = "maintenance";
  EXPECT_FALSE(decode_agent_upgrade_event(body));
  // An unknown version is said with an empty one.
  body = e.to_json();
  body["from_version"] = "";
  EXPECT_TRUE(decode_agent_upgrade_event(body));
}

std::string binary_with(const std::string& tail) {
  std::string bytes =
      "\x7f"
      "ELF....";
  // The needle itself, as every binary that links the decoder carries it.
  bytes += std::string(kAgentVersionMark) + std::string(1, '\0') + "....";
  bytes += std::string(kAgentVersionMark) + tail;
  bytes += std::string(8, '\0') + "rest";
  return bytes;
}

TEST(AgentBinaryVersion, IsReadAfterTheMarkPastTheDecodersOwnNeedle) {
  auto v = agent_binary_version(binary_with("0.1.0"));
  ASSERT_TRUE(v) << v.error().message;
  EXPECT_EQ(*v, "0.1.0");
  v = agent_binary_version(binary_with("0.1.1+restamped"));
  ASSERT_TRUE(v) << v.error().message;
  EXPECT_EQ(*v, "0.1.1+restamped");
}

TEST(AgentBinaryVersion, NoMarkOrABadOneIsSaid) {
  auto none = agent_binary_version("#!/bin/sh\nexit 1\n");
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code, Errc::not_found);
  auto bad = agent_binary_version(binary_with("0.1\x1b[0m"));
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, Errc::invalid_argument);
  auto unterminated = agent_binary_version(std::string(kAgentVersionMark) + "0.1.0");
  EXPECT_FALSE(unterminated);
}

}  // namespace
}  // namespace factory::proto
