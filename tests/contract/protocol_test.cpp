#include "contract/protocol.hpp"

#include <gtest/gtest.h>

#include "common/backoff.hpp"
#include "common/durations.hpp"

namespace proto = factory::proto;

TEST(Protocol, RoundTrip) {
  proto::Envelope e;
  e.type = "event";
  e.seq = 7;
  e.ack = 3;
  e.body = {{"id", 42}, {"kind", "progress"}};
  auto p = proto::parse(proto::serialize(e));
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_EQ(p->type, "event");
  EXPECT_EQ(p->seq, 7u);
  EXPECT_EQ(*p->ack, 3u);
  EXPECT_EQ(p->body["id"], 42);
}

// serialize() writes the envelope field by field: the bytes are those of
// the envelope as one JSON object dumped whole (what it did before), with
// and without an ack, with a type that needs escaping, with an empty body;
// and a body holding bytes that are not UTF-8 is written with U+FFFD, not
// an exception on the sender's thread.
TEST(Protocol, SerializesAsTheEnvelopeObjectWould) {
  auto whole = [](const proto::Envelope& e) {
    nlohmann::json j = {{"v", e.v}, {"type", e.type}, {"seq", e.seq}, {"body", e.body}};
    if (e.ack) j["ack"] = *e.ack;
    return j.dump();
  };
  proto::Envelope e;
  e.type = "ack";
  e.seq = 18446744073709551615ull;
  e.body = {{"event_id", 9}, {"nested", {{"b", {1, 2}}, {"a", "x\"y"}}}};
  EXPECT_EQ(proto::serialize(e), whole(e));
  e.ack = 0;
  EXPECT_EQ(proto::serialize(e), whole(e));
  e.type = "odd\"type\n";
  e.body = nlohmann::json();
  EXPECT_EQ(proto::serialize(e), whole(e));
  e.body = nlohmann::json::object();
  EXPECT_EQ(proto::serialize(e), whole(e));

  e.body = {{"message", std::string("bad \xff byte")}};
  std::string text;
  ASSERT_NO_THROW(text = proto::serialize(e));
  auto back = proto::parse(text);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->body["message"], "bad \xef\xbf\xbd byte");
}

TEST(Protocol, RejectsWithReasons) {
  auto why = [](const std::string& f) {
    auto p = proto::parse(f);
    return p.ok() ? std::string("accepted") : p.error().message;
  };
  EXPECT_EQ(why("{"), "frame is not valid JSON");
  EXPECT_EQ(why("[1]"), "frame is not a JSON object");
  EXPECT_NE(why(R"({"type":"x","seq":1})").find("no protocol version"), std::string::npos);
  EXPECT_NE(why(R"({"v":2,"type":"x","seq":1})").find("unsupported protocol version 2"),
            std::string::npos);
  EXPECT_NE(why(R"({"v":1,"seq":1})").find("no 'type'"), std::string::npos);
  EXPECT_NE(why(R"({"v":1,"type":"x","seq":-1})").find("no sequence number"), std::string::npos);
  EXPECT_NE(why(R"({"v":1,"type":"x","seq":1,"body":[]})").find("not an object"),
            std::string::npos);
  std::string big =
      R"({"v":1,"type":"event","seq":1,"body":{"pad":")" + std::string(70000, 'x') + "\"}}";
  EXPECT_NE(why(big).find("65536-byte cap for type 'event'"), std::string::npos);
  // Plans may be larger than other frames.
  std::string plan =
      R"({"v":1,"type":"plan","seq":1,"body":{"pad":")" + std::string(70000, 'x') + "\"}}";
  EXPECT_EQ(why(plan), "accepted");
  // Enroll frames, what strangers send, are smaller.
  std::string enroll =
      R"({"v":1,"type":"enroll","seq":1,"body":{"csr":")" + std::string(9000, 'x') + "\"}}";
  EXPECT_NE(why(enroll).find("8192-byte cap for type 'enroll'"), std::string::npos);
}

TEST(Protocol, UnknownTypesParse) {
  // Forward compatibility: the receiver decides to ignore them.
  auto p = proto::parse(R"({"v":1,"type":"from-the-future","seq":1,"body":{"x":1},"extra":true})");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->type, "from-the-future");
}

TEST(Backoff, CappedExponentialWithFullJitter) {
  factory::Backoff b(std::chrono::milliseconds(500), std::chrono::minutes(2), 42);
  std::chrono::milliseconds prev_ceiling{0};
  for (int i = 0; i < 20; ++i) {
    auto ceiling = b.ceiling();
    auto d = b.next();
    EXPECT_LE(d, ceiling);
    EXPECT_GE(d.count(), 0);
    EXPECT_GE(ceiling, prev_ceiling);
    EXPECT_LE(ceiling, std::chrono::minutes(2)) << "capped in minutes, never hours";
    prev_ceiling = ceiling;
  }
  EXPECT_EQ(prev_ceiling, std::chrono::minutes(2));
  b.reset();
  EXPECT_EQ(b.ceiling(), std::chrono::milliseconds(500));
}

TEST(Durations, ParseAndFormat) {
  EXPECT_EQ(factory::parse_duration("1h30m")->count(), 5400);
  EXPECT_EQ(factory::parse_duration("90s")->count(), 90);
  EXPECT_EQ(factory::parse_duration("7d")->count(), 7 * 86400);
  EXPECT_FALSE(factory::parse_duration("1x").ok());
  EXPECT_FALSE(factory::parse_duration("").ok());
  EXPECT_FALSE(factory::parse_duration("1h30").ok());
  EXPECT_EQ(factory::format_duration(std::chrono::seconds(5400)), "1h30m");
  auto t = factory::parse_rfc3339("2026-11-30T09:00:00Z");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(factory::format_rfc3339(*t), "2026-11-30T09:00:00Z");
}

// What an agent sends as a time is untrusted: a year past 2262 overflowed
// the nanosecond time_point (UBSan under the agent_messages fuzz target).
TEST(Durations, TimestampsOutOfRangeAreRefusedNotOverflowed) {
  EXPECT_FALSE(factory::parse_rfc3339("4052-12-01T16:29:35Z").ok());
  EXPECT_FALSE(factory::parse_rfc3339("1969-12-31T23:59:59Z").ok());
  EXPECT_FALSE(factory::parse_rfc3339("2026-13-01T00:00:00Z").ok());
  EXPECT_FALSE(factory::parse_rfc3339("2026-12-01T24:00:00Z").ok());
  EXPECT_TRUE(factory::parse_rfc3339("2200-01-01T00:00:00Z").ok());
}
