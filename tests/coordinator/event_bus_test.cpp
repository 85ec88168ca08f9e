// The status feed's event bus on its own: ids, the ring Last-Event-ID
// resumes from, the tenant filter, heartbeats, and a slow reader dropped
// with a last event while the others go on.
#include "coordinator/feed/event_bus.hpp"

#include <gtest/gtest.h>

#include <mutex>
#include <nlohmann/json.hpp>

#include "coordinator/feed/feed_state.hpp"
#include "coordinator/feed/tenant_view.hpp"
#include "tests/support/test_support.hpp"

using namespace factory::feed;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

// A reader: takes `room` chunks, then refuses (as a full stream queue does).
struct Reader : EventSink {
  explicit Reader(std::size_t room = 1000000) : room(room) {}
  bool write(std::string chunk) override {
    std::lock_guard lk(mu);
    if (ended || chunks.size() >= room) return false;
    chunks.push_back(std::move(chunk));
    return true;
  }
  void close_with(std::string last) override {
    std::lock_guard lk(mu);
    chunks.push_back(std::move(last));
    ended = true;
  }
  // The events' ids, types and data, in order (comments left out).
  std::vector<std::string> ids() {
    std::lock_guard lk(mu);
    std::vector<std::string> out;
    for (const auto& c : chunks)
      if (c.rfind("id: ", 0) == 0) out.push_back(c.substr(4, c.find('\n') - 4));
    return out;
  }
  std::string all() {
    std::lock_guard lk(mu);
    std::string s;
    for (const auto& c : chunks) s += c;
    return s;
  }
  std::mutex mu;
  std::size_t room;
  std::vector<std::string> chunks;
  bool ended = false;
};

EventBusOptions opts(std::size_t history = 16) {
  EventBusOptions o;
  o.history = history;
  o.heartbeat = 0ms;
  o.first_id = 100;
  // Every reader here is the same anonymous one; the admin's reserve and
  // the per-token caps have a test of their own.
  o.reserved = 0;
  return o;
}

}  // namespace

TEST(EventBus, EventsHaveGrowingIdsTypesAndOneLineOfJson) {
  EventBus bus(opts());
  auto r = std::make_shared<Reader>();
  ASSERT_NE(bus.subscribe(r, "", std::nullopt).handle, 0u);
  EXPECT_EQ(bus.publish("phase", "t1", {{"phase", "ready"}}), 100u);
  EXPECT_EQ(bus.publish("agent", "t2", {{"connected", true}, {"note", "two\nlines"}}), 101u);
  EXPECT_EQ(r->ids(), (std::vector<std::string>{"100", "101"}));
  const std::string all = r->all();
  EXPECT_EQ(all.rfind("retry: 3000\n", 0), 0u) << all;
  const std::string second = r->chunks.back();
  EXPECT_EQ(second.rfind("id: 101\nevent: agent\ndata: {", 0), 0u) << second;
  // One data line: the newline inside the guest's text is escaped.
  auto data_line = second.substr(second.find("data: ") + 6);
  data_line = data_line.substr(0, data_line.find('\n'));
  auto j = json::parse(data_line);
  EXPECT_EQ(j["tenant"], "t2");
  EXPECT_EQ(j["note"], "two\nlines");
  EXPECT_TRUE(j["time"].is_string());
  EXPECT_EQ(second.substr(second.size() - 2), "\n\n");
}

TEST(EventBus, FirstIdOfARunIsItsStartInMicroseconds) {
  EventBusOptions o;
  o.heartbeat = 0ms;
  const auto before = std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  EventBus bus(o);
  EXPECT_GE(bus.publish("phase", "t", json::object()), static_cast<std::uint64_t>(before))
      << "a later run's ids are above an earlier run's";
}

TEST(EventBus, LastEventIdResumesAfterItWithoutRepeatingAndFiltersByTenant) {
  EventBus bus(opts());
  for (int i = 0; i < 5; ++i) bus.publish("health", i % 2 ? "t2" : "t1", {{"i", i}});
  // ids 100..104; a reader that saw 101 gets 102..104 and nothing twice.
  auto r = std::make_shared<Reader>();
  auto s = bus.subscribe(r, "", 101);
  EXPECT_EQ(s.replayed, 3u);
  bus.publish("health", "t1", {{"i", 5}});
  EXPECT_EQ(r->ids(), (std::vector<std::string>{"102", "103", "104", "105"}));
  // ?tenant=t2: only its events, replayed and live.
  auto t2 = std::make_shared<Reader>();
  bus.subscribe(t2, "t2", 99);
  bus.publish("health", "t2", {{"i", 6}});
  bus.publish("health", "t1", {{"i", 7}});
  EXPECT_EQ(t2->ids(), (std::vector<std::string>{"101", "103", "106"}));
  // Up to date: nothing replayed, no reset.
  auto now = std::make_shared<Reader>();
  EXPECT_EQ(bus.subscribe(now, "", bus.last_id()).replayed, 0u);
  EXPECT_EQ(now->all().find("event: reset"), std::string::npos);
}

TEST(EventBus, AnIdTheRingNoLongerHoldsGetsAResetNotAGap) {
  EventBus bus(opts(4));
  for (int i = 0; i < 10; ++i) bus.publish("health", "t1", {{"i", i}});  // 100..109, ring 106..109
  auto old = std::make_shared<Reader>();
  bus.subscribe(old, "", 102);
  EXPECT_NE(old->all().find("event: reset\ndata: {"), std::string::npos) << old->all();
  EXPECT_NE(old->all().find("\"too_old\""), std::string::npos);
  EXPECT_TRUE(old->ids().empty()) << "a reset reader reloads the state instead";
  bus.publish("health", "t1", json::object());
  EXPECT_EQ(old->ids(), (std::vector<std::string>{"110"}));
  // The oldest the ring holds minus one is still a resume.
  auto edge = std::make_shared<Reader>();
  EXPECT_EQ(bus.subscribe(edge, "", 106).replayed, 4u);  // 107..110
  // An id from the future (another coordinator's run): reset as well.
  auto future = std::make_shared<Reader>();
  bus.subscribe(future, "", 999999);
  EXPECT_NE(future->all().find("\"unknown_id\""), std::string::npos);
}

TEST(EventBus, TheRingIsBoundedInBytesToo) {
  EventBusOptions o = opts(1000);
  o.history_bytes = 2000;
  EventBus bus(o);
  for (int i = 0; i < 20; ++i) bus.publish("health", "t1", {{"pad", std::string(300, 'x')}});
  // 100..119 published; about five of ~380 bytes fit in 2000.
  auto r = std::make_shared<Reader>();
  bus.subscribe(r, "", 110);
  EXPECT_NE(r->all().find("event: reset"), std::string::npos) << "110 is no longer held";
  auto late = std::make_shared<Reader>();
  auto s = bus.subscribe(late, "", 115);
  EXPECT_EQ(s.replayed, 4u);
  EXPECT_EQ(late->all().find("event: reset"), std::string::npos);
}

// The history's byte bound counts each event's text; the string holding it
// must not be larger. Built piece by piece it was up to twice its text (a
// thousand 1 KB health events held ~2 MB for a 1 MB bound), which the
// coordinator's memory per agent showed (issue 24).
TEST(EventBus, AnEventsTextIsHeldWithoutSlack) {
  FeedEvent e{1733300000000001, "health", "t1", "{\"pad\":\"" + std::string(1000, 'x') + "\"}"};
  const std::string sse = format_sse(e);
  EXPECT_EQ(sse, "id: 1733300000000001\nevent: health\ndata: " + e.data + "\n\n");
  EXPECT_EQ(sse.capacity(), sse.size());
}

TEST(EventBus, ASlowReaderIsDroppedWithALastEventAndTheOthersGoOn) {
  EventBus bus(opts());
  auto slow = std::make_shared<Reader>(3);  // the retry line and two events
  auto fast = std::make_shared<Reader>();
  bus.subscribe(slow, "", std::nullopt);
  bus.subscribe(fast, "", std::nullopt);
  for (int i = 0; i < 5; ++i) bus.publish("health", "t1", {{"i", i}});
  EXPECT_TRUE(slow->ended);
  EXPECT_EQ(slow->ids(), (std::vector<std::string>{"100", "101"}));
  const std::string last = slow->chunks.back();
  EXPECT_EQ(last.rfind("event: dropped\ndata: ", 0), 0u) << last;
  EXPECT_EQ(last.find("id:"), std::string::npos) << "the reader resumes after its last real event";
  EXPECT_NE(last.find("\"last_event_id\":\"101\""), std::string::npos) << last;
  EXPECT_EQ(fast->ids().size(), 5u);
  EXPECT_EQ(bus.stats().dropped_slow, 1u);
  EXPECT_EQ(bus.stats().subscribers, 1u);
  // It reconnects with the id it got last and misses nothing.
  auto again = std::make_shared<Reader>();
  bus.subscribe(again, "", 101);
  EXPECT_EQ(again->ids(), (std::vector<std::string>{"102", "103", "104"}));
}

TEST(EventBus, HeartbeatsAreCommentsOnTheBussOwnThread) {
  EventBusOptions o = opts();
  o.heartbeat = 50ms;
  EventBus bus(o);
  auto r = std::make_shared<Reader>();
  bus.subscribe(r, "", std::nullopt);
  ASSERT_TRUE(factory::testing::eventually(
      [&] { return r->all().find(": heartbeat ") != std::string::npos; }, 5s));
  EXPECT_TRUE(r->ids().empty()) << "a heartbeat is not an event";
}

TEST(EventBus, SubscribersAreBoundedAndCloseEndsEveryStream) {
  EventBusOptions o = opts();
  o.max_subscribers = 2;
  EventBus bus(o);
  auto a = std::make_shared<Reader>(), b = std::make_shared<Reader>(),
       c = std::make_shared<Reader>();
  EXPECT_NE(bus.subscribe(a, "", std::nullopt).handle, 0u);
  auto hb = bus.subscribe(b, "", std::nullopt).handle;
  EXPECT_EQ(bus.subscribe(c, "", std::nullopt).handle, 0u);
  bus.unsubscribe(hb);
  EXPECT_NE(bus.subscribe(c, "", std::nullopt).handle, 0u);
  bus.close();
  EXPECT_TRUE(a->ended);
  EXPECT_TRUE(c->ended);
}

// Issue 23, point 5: 256 readers held with one read-only token made the
// admin's own request 503. Readers are counted per token, and the last
// places are the admin's.
TEST(EventBus, AReadOnlyTokenCannotTakeTheAdminsPlacesOrEveryPlace) {
  EventBusOptions o = opts();
  o.max_subscribers = 20;
  o.reserved = 4;
  o.max_per_principal = 6;
  EventBus bus(o);
  std::vector<std::shared_ptr<Reader>> held;
  auto reader = [&](const std::string& principal) {
    held.push_back(std::make_shared<Reader>());
    return bus.subscribe(held.back(), "", std::nullopt, {principal, principal == "admin"});
  };
  for (int i = 0; i < 6; ++i) ASSERT_NE(reader("read-only:ro-a").handle, 0u);
  auto capped = reader("read-only:ro-a");
  EXPECT_EQ(capped.handle, 0u);
  EXPECT_NE(capped.refusal.find("at most 6 per token"), std::string::npos) << capped.refusal;
  for (int i = 0; i < 6; ++i) ASSERT_NE(reader("read-only:ro-b").handle, 0u);
  for (int i = 0; i < 4; ++i) ASSERT_NE(reader("read-only:ro-c").handle, 0u);
  // 16 read-only readers: what is left is the admin's.
  auto reserved = reader("read-only:ro-d");
  EXPECT_EQ(reserved.handle, 0u);
  EXPECT_NE(reserved.refusal.find("kept for the admin token"), std::string::npos)
      << reserved.refusal;
  EXPECT_EQ(bus.refusal({"read-only:ro-d", false}), reserved.refusal);
  EXPECT_EQ(bus.refusal({"admin", true}), "");
  for (int i = 0; i < 4; ++i) EXPECT_NE(reader("admin").handle, 0u) << i;
  EXPECT_EQ(reader("admin").handle, 0u) << "every place is taken now";
  // A read-only reader that leaves gives its place back to read-only readers.
  bus.unsubscribe(1);
  EXPECT_EQ(bus.refusal({"read-only:ro-d", false}), "");
  EXPECT_EQ(bus.stats().subscribers, 19u);
}

// What the agents module reports becomes the feed's events.
TEST(FeedStateEvents, ConnectsDisconnectsHealthProgressAndPhaseChanges) {
  FeedState st(opts());
  auto r = std::make_shared<Reader>();
  st.bus().subscribe(r, "", std::nullopt);
  AgentPresence p;
  p.agent_id = "a1";
  p.version = "1.0";
  st.agent_connected("t1", p);
  factory::store::LatestHealth health;
  health.sample.gpu.diagnoses.push_back({"no_gpu", "none", "", json::object()});
  health.sample.ollama.emplace();
  health.sample.ollama->diagnoses.push_back({"ollama_down", "s", "f", json{{"port", 11434}}});
  health.received_at = "2026-12-01T00:00:00Z";
  st.health_changed("t1", health);
  factory::store::TenantRecord rec;
  rec.name = "t1";
  rec.phase = "provisioning";
  rec.status.plan.emplace();
  rec.status.plan->steps_done = 1;
  rec.status.plan->steps_total = 3;
  rec.status.plan->steps = std::map<std::string, factory::store::PlanStep>{{"a", {}}};
  st.event_stored("t1", {{"kind", "progress"}, {"id", 7}, {"step", "a"}, {"state", "succeeded"}},
                  &rec);
  st.event_stored("t1", {{"kind", "progress"}, {"id", 8}, {"step", "b"}, {"state", "started"}},
                  &rec);
  rec.phase = "ready";
  st.event_stored("t1", {{"kind", "plan"}, {"id", 9}, {"state", "succeeded"}}, &rec);
  st.event_stored("t1", {{"kind", "diagnosis"}, {"id", 10}, {"code", "x"}}, nullptr);
  st.agent_disconnected("t1", "2026-12-01T00:00:00Z", "stopped", "stopping");
  std::vector<std::string> types;
  std::vector<json> data;
  for (const auto& c : r->chunks) {
    if (c.rfind("id: ", 0) != 0) continue;
    auto ev = c.find("event: ") + 7;
    types.push_back(c.substr(ev, c.find('\n', ev) - ev));
    auto d = c.find("data: ") + 6;
    data.push_back(json::parse(c.substr(d, c.find('\n', d) - d)));
  }
  EXPECT_EQ(types, (std::vector<std::string>{"agent", "health", "progress", "phase", "progress",
                                             "plan", "phase", "diagnosis", "agent"}));
  EXPECT_EQ(data[0]["connected"], true);
  EXPECT_EQ(data[0]["agent_id"], "a1");
  EXPECT_EQ(data[1]["diagnoses"][0]["code"], "no_gpu");
  EXPECT_EQ(data[1]["diagnoses"][0]["source"], "health");
  // Written straight to bytes, the health event is the value the tree form
  // gives: the sample with received_at, and active_diagnoses() of it.
  json tree = {{"health", health.to_json()},
               {"diagnoses", active_diagnoses(factory::store::TenantStatus{}, health.to_json())},
               {"tenant", "t1"},
               {"time", data[1]["time"]}};
  EXPECT_EQ(data[1], tree);
  EXPECT_EQ(data[1]["health"]["received_at"], "2026-12-01T00:00:00Z");
  EXPECT_EQ(data[2]["step"], "a");
  EXPECT_EQ(data[2]["plan"]["steps_done"], 1);
  EXPECT_FALSE(data[2]["plan"].contains("steps"));
  EXPECT_FALSE(data[2].contains("id")) << "the agent's event id is not the feed's";
  EXPECT_EQ(data[3]["phase"], "provisioning");
  EXPECT_EQ(data[6]["phase"], "ready");
  EXPECT_EQ(data[8]["connected"], false);
  EXPECT_EQ(data[8]["state"], "stopped");
}
