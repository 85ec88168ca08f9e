// A maintenance notice on the wire (contract/maintenance.hpp): what the
// coordinator sends reads back as it was, and what breaks a rule is refused
// with the field named, since the agent puts a notice on the guest's
// terminals and in a file its users read.
#include "contract/maintenance.hpp"

#include <gtest/gtest.h>

#include "common/durations.hpp"
#include "contract/protocol.hpp"

namespace proto = factory::proto;
using nlohmann::json;
using proto::MaintenanceNotice;
using proto::MaintenanceState;

namespace {

json valid_body() {
  return {{"action", "maintenance"},
          {"notice_id", "drain-2026-11-30.a_1"},
          {"state", "scheduled"},
          {"node", "gpu-node-3.example.com"},
          {"deadline", "2026-11-30T09:00:00Z"},
          {"message", "Kernel update on the host.\nBack by 10:00."}};
}

json with(const char* key, json value) {
  json b = valid_body();
  b[key] = std::move(value);
  return b;
}

json without(const char* key) {
  json b = valid_body();
  b.erase(key);
  return b;
}

// The refusal's message, or "accepted".
std::string why(const json& body) {
  auto n = proto::decode_maintenance_notice(body);
  if (n) return "accepted";
  EXPECT_EQ(n.error().code, factory::Errc::invalid_argument) << n.error().message;
  return n.error().message;
}

bool refused_for(const json& body, const std::string& field) {
  const std::string w = why(body);
  return w.rfind("maintenance notice: " + field + ": ", 0) == 0;
}

}  // namespace

TEST(MaintenanceNotice, DecodesWhatTheCoordinatorSends) {
  auto n = proto::decode_maintenance_notice(valid_body());
  ASSERT_TRUE(n.ok()) << n.error().message;
  EXPECT_EQ(n->notice_id, "drain-2026-11-30.a_1");
  EXPECT_EQ(n->state, MaintenanceState::scheduled);
  EXPECT_EQ(n->node, "gpu-node-3.example.com");
  EXPECT_EQ(factory::format_rfc3339(n->deadline), "2026-11-30T09:00:00Z");
  EXPECT_EQ(n->message, "Kernel update on the host.\nBack by 10:00.");
  // to_json() is the command body itself, and reads back the same.
  EXPECT_EQ(n->to_json(), valid_body());
  auto again = proto::decode_maintenance_notice(n->to_json());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *n);
}

TEST(MaintenanceNotice, CancelledAndItsEvent) {
  auto n = proto::decode_maintenance_notice(with("state", "cancelled"));
  ASSERT_TRUE(n.ok()) << n.error().message;
  EXPECT_EQ(n->state, MaintenanceState::cancelled);
  EXPECT_STREQ(proto::state_name(n->state), "cancelled");
  EXPECT_EQ(n->event(), json({{"kind", "maintenance"},
                              {"notice_id", "drain-2026-11-30.a_1"},
                              {"state", "cancelled"},
                              {"node", "gpu-node-3.example.com"},
                              {"deadline", "2026-11-30T09:00:00Z"}}));
  n->state = MaintenanceState::scheduled;
  EXPECT_EQ(n->event()["state"], "received");
}

TEST(MaintenanceNotice, ActionIsOptionalButMustBeMaintenance) {
  EXPECT_EQ(why(without("action")), "accepted");
  EXPECT_TRUE(refused_for(with("action", "retry"), "action")) << why(with("action", "retry"));
  EXPECT_TRUE(refused_for(with("action", 7), "action"));
  EXPECT_EQ(std::string(proto::action::kMaintenance), "maintenance");
}

TEST(MaintenanceNotice, MessageIsOptionalAndUnknownKeysAreIgnored) {
  auto n = proto::decode_maintenance_notice(without("message"));
  ASSERT_TRUE(n.ok()) << n.error().message;
  EXPECT_EQ(n->message, "");
  EXPECT_EQ(why(with("message", nullptr)), "accepted");
  // A newer coordinator may say more.
  EXPECT_EQ(why(with("drain_reason", "kernel")), "accepted");
}

TEST(MaintenanceNotice, RequiredFieldsAreNamedWhenMissingOrOfTheWrongType) {
  for (const char* f : {"notice_id", "state", "node", "deadline"}) {
    EXPECT_TRUE(refused_for(without(f), f)) << f << ": " << why(without(f));
    EXPECT_NE(why(without(f)).find("missing"), std::string::npos);
    EXPECT_TRUE(refused_for(with(f, 42), f)) << f << ": " << why(with(f, 42));
    EXPECT_NE(why(with(f, 42)).find("want a string, got a number"), std::string::npos);
  }
  EXPECT_TRUE(refused_for(with("message", json::array()), "message"));
  EXPECT_NE(why(json::array()).find("want an object, got a list"), std::string::npos);
}

TEST(MaintenanceNotice, NoticeIdIsShortAndPlain) {
  EXPECT_EQ(why(with("notice_id", std::string(64, 'a'))), "accepted");
  EXPECT_EQ(why(with("notice_id", "A.b_c-9")), "accepted");
  for (const std::string& bad : {std::string(), std::string(65, 'a'), std::string("a/b"),
                                 std::string("a b"), std::string("ä"), std::string("id\n")})
    EXPECT_TRUE(refused_for(with("notice_id", bad), "notice_id")) << why(with("notice_id", bad));
}

TEST(MaintenanceNotice, StateIsOneOfTwo) {
  for (const char* bad : {"postponed", "Scheduled", ""})
    EXPECT_TRUE(refused_for(with("state", bad), "state")) << bad << ": " << why(with("state", bad));
  EXPECT_NE(why(with("state", "postponed")).find("want scheduled or cancelled, got 'postponed'"),
            std::string::npos);
}

TEST(MaintenanceNotice, NodeIsAHostName) {
  std::string label63(63, 'a');
  std::string longest = label63 + "." + label63 + "." + label63 + "." + std::string(61, 'b');
  ASSERT_EQ(longest.size(), 253u);
  for (const std::string& ok : {std::string("n"), std::string("gpu-host-1"),
                                std::string("GPU-Host1.lab"), longest, std::string("10.0.0.7")})
    EXPECT_EQ(why(with("node", ok)), "accepted") << ok;
  for (const std::string& bad :
       {std::string(), std::string("-node"), std::string("node-"), std::string("node_1"),
        std::string("a..b"), std::string(".a"), std::string("a."), std::string(64, 'a'),
        longest + "c", std::string("node 1"), std::string("node\x1b[2J")})
    EXPECT_TRUE(refused_for(with("node", bad), "node")) << bad << ": " << why(with("node", bad));
}

TEST(MaintenanceNotice, DeadlineIsRfc3339InUtc) {
  auto deadline = [](const std::string& text) {
    auto n = proto::decode_maintenance_notice(with("deadline", text));
    return n ? factory::format_rfc3339(n->deadline) : "refused: " + n.error().message;
  };
  EXPECT_EQ(deadline("2026-11-30T09:00:00Z"), "2026-11-30T09:00:00Z");
  EXPECT_EQ(deadline("2026-11-30T09:00:00z"), "2026-11-30T09:00:00Z");
  // To the second: a fraction is dropped.
  EXPECT_EQ(deadline("2026-11-30T09:00:00.999Z"), "2026-11-30T09:00:00Z");
  for (const char* bad :
       {"tomorrow", "", "2026-11-30", "2026-11-30T09:00:00",
        // An offset would be read as UTC by the time parser: refused rather than misread.
        "2026-11-30T09:00:00+02:00", "2026-11-30T09:00:00+00:00",
        // Days past the month's end, and times that do not exist.
        "2026-02-30T09:00:00Z", "2026-11-30T24:00:00Z", "2026-11-30T09:00:60Z",
        "2026-11-30T09:00:00.Z", "2026-11-30T09:00:00.1234567890Z", "2026-11-30T09:00:00Zjunk",
        "2026-11-30 09:00:00Z", "1969-12-31T23:59:59Z"}) {
    EXPECT_TRUE(refused_for(with("deadline", bad), "deadline"))
        << bad << ": " << why(with("deadline", bad));
  }
  // What is quoted back is shown escaped.
  EXPECT_NE(why(with("deadline", "\x1b[2J")).find("got '\\x1b[2J'"), std::string::npos)
      << why(with("deadline", "\x1b[2J"));
}

TEST(MaintenanceNotice, MessageIsBoundedTextWithLineBreaksOnly) {
  EXPECT_EQ(why(with("message", std::string(512, 'x'))), "accepted");
  EXPECT_TRUE(refused_for(with("message", std::string(513, 'x')), "message"));
  EXPECT_NE(why(with("message", std::string(513, 'x'))).find("513 bytes"), std::string::npos);
  EXPECT_EQ(why(with("message", "line one\nline two\n")), "accepted");
  EXPECT_EQ(why(with("message", "Wartung um 09:00 — bitte speichern")), "accepted");
  for (const std::string& bad :
       {std::string("clear\x1b[2J"), std::string("tab\there"), std::string("cr\r\n"),
        std::string("nul", 4), std::string("del\x7f"),
        std::string("csi\xc2\x9b"
                    "2J"),               // C1 control U+009B
        std::string("rtl\xe2\x80\xae"),  // U+202E, a bidi override
        std::string("bad utf-8 \xff")})
    EXPECT_TRUE(refused_for(with("message", bad), "message")) << why(with("message", bad));
}
