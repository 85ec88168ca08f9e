// The status feed across coordinator replicas (issue 26): two stores on one
// real PostgreSQL database, each with its event bus on the store's feed log,
// as two `factory serve` have them. Every event reaches both, with the same
// ids in the same order, once, across a lost connection; a reader resumes
// on the other replica; the agents' presence crosses replicas and goes
// stale when a replica dies without a word. On SQLite there is no log and
// the bus numbers its own events, as before.
#include "coordinator/store/feed_log.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "coordinator/feed/event_bus.hpp"
#include "coordinator/feed/feed_state.hpp"
#include "coordinator/store/store.hpp"
#include "tests/support/postgres_server.hpp"
#include "tests/support/test_support.hpp"

using namespace factory;
using namespace factory::feed;
using namespace std::chrono_literals;
using factory::testing::eventually;
using factory::testing::PostgresServer;
using nlohmann::json;

namespace {

// A reader of /v1/events: every chunk it was given.
struct Reader : EventSink {
  bool write(std::string chunk) override {
    std::lock_guard lk(mu);
    chunks.push_back(std::move(chunk));
    return true;
  }
  void close_with(std::string last) override {
    std::lock_guard lk(mu);
    chunks.push_back(std::move(last));
  }
  // The events' ids, in the order received.
  std::vector<std::uint64_t> ids() {
    std::lock_guard lk(mu);
    std::vector<std::uint64_t> out;
    for (const auto& c : chunks)
      if (c.rfind("id: ", 0) == 0) out.push_back(std::stoull(c.substr(4, c.find('\n') - 4)));
    return out;
  }
  // Each event's data's "n", in the order received.
  std::vector<int> numbers() {
    std::lock_guard lk(mu);
    std::vector<int> out;
    for (const auto& c : chunks) {
      auto at = c.find("\ndata: ");
      if (c.rfind("id: ", 0) != 0 || at == std::string::npos) continue;
      auto d = json::parse(c.substr(at + 7, c.find('\n', at + 7) - at - 7));
      out.push_back(d.value("n", -1));
    }
    return out;
  }
  std::string all() {
    std::lock_guard lk(mu);
    std::string s;
    for (const auto& c : chunks) s += c;
    return s;
  }
  std::mutex mu;
  std::vector<std::string> chunks;
};

class FeedLogTest : public ::testing::Test {
 protected:
  void SetUp() override { conninfo_ = PostgresServer::instance().create_database(); }

  std::unique_ptr<store::Store> open_store(store::StoreOptions o = {}) {
    auto s = store::open_postgres_store(conninfo_, o);
    if (!s) ADD_FAILURE() << s.error().message;
    return s ? std::move(*s) : nullptr;
  }
  static EventBusOptions bus_on(store::Store& s) {
    EventBusOptions o;
    o.heartbeat = 0ms;  // the tests call heartbeat() themselves
    o.history = 1000;
    o.history_bytes = 1 << 20;
    o.log = s.feed_log();
    return o;
  }
  std::string sql(const std::string& query) {
    return PostgresServer::instance().sql(conninfo_.substr(conninfo_.rfind('=') + 1), query);
  }
  std::string conninfo_;
};

// Publishes `n` events numbered from `first` ("n" in their data).
void publish_numbered(EventBus& bus, int first, int n) {
  for (int i = first; i < first + n; ++i)
    bus.publish("phase", "t" + std::to_string(i % 3), {{"n", i}});
}

bool strictly_increasing(const std::vector<std::uint64_t>& ids) {
  for (std::size_t i = 1; i < ids.size(); ++i)
    if (ids[i] <= ids[i - 1]) return false;
  return true;
}

TEST_F(FeedLogTest, EventsOfTwoReplicasReachBothWithTheSameIdsInOneOrder) {
  auto sa = open_store(), sb = open_store();
  ASSERT_TRUE(sa && sb);
  ASSERT_NE(sa->feed_log(), nullptr);
  ASSERT_NE(sa->feed_log()->origin(), sb->feed_log()->origin());
  EventBus a(bus_on(*sa)), b(bus_on(*sb));
  // Readers get the others' events once their replica follows the log.
  ASSERT_TRUE(eventually([&] { return a.following() && b.following(); }));
  auto ra = std::make_shared<Reader>(), rb = std::make_shared<Reader>();
  ASSERT_NE(a.subscribe(ra, "", std::nullopt).handle, 0u);
  ASSERT_NE(b.subscribe(rb, "", std::nullopt).handle, 0u);
  // Both replicas at once, as two coordinators' agents would.
  std::thread ta([&] { publish_numbered(a, 0, 150); });
  std::thread tb([&] { publish_numbered(b, 1000, 150); });
  ta.join();
  tb.join();
  EXPECT_EQ(a.publish("phase", "t0", {{"n", 5000}}), 0u) << "with a log the database numbers";
  ASSERT_TRUE(eventually([&] { return ra->ids().size() == 301 && rb->ids().size() == 301; }))
      << ra->ids().size() << " " << rb->ids().size();
  EXPECT_EQ(ra->ids(), rb->ids());
  EXPECT_EQ(ra->numbers(), rb->numbers());
  EXPECT_TRUE(strictly_increasing(ra->ids()));
  // Every event of both, once; each replica's in the order it published them.
  auto numbers = ra->numbers();
  EXPECT_EQ(std::set<int>(numbers.begin(), numbers.end()).size(), 301u);
  std::vector<int> of_a, of_b;
  for (int n : numbers) (n >= 1000 && n < 5000 ? of_b : of_a).push_back(n);
  EXPECT_TRUE(std::is_sorted(of_a.begin(), of_a.end()));
  EXPECT_TRUE(std::is_sorted(of_b.begin(), of_b.end()));
  EXPECT_EQ(a.last_id(), ra->ids().back());
  EXPECT_EQ(b.last_id(), ra->ids().back());
  EXPECT_EQ(sql("SELECT count(*) FROM feed_log"), "301");
  EXPECT_EQ(sa->feed_log()->stats().appended, 151u);
  EXPECT_EQ(sb->feed_log()->stats().appended, 150u);
  // Shutdown as the coordinator does it: the log before the bus.
  sa->feed_log()->close();
  a.close();
  b.close();
}

TEST_F(FeedLogTest, AReaderResumesOnTheOtherReplicaWithLastEventId) {
  auto sa = open_store(), sb = open_store();
  ASSERT_TRUE(sa && sb);
  EventBus a(bus_on(*sa)), b(bus_on(*sb));
  auto ra = std::make_shared<Reader>();
  a.subscribe(ra, "", std::nullopt);
  publish_numbered(a, 0, 20);
  ASSERT_TRUE(eventually([&] { return ra->ids().size() == 20; }));
  ASSERT_TRUE(eventually([&] { return b.last_id() == ra->ids().back(); }));
  // The reader had ten, then its replica went: it reconnects to the other.
  const auto seen = ra->ids();
  auto rb = std::make_shared<Reader>();
  auto sub = b.subscribe(rb, "", seen[9]);
  EXPECT_EQ(sub.replayed, 10u);
  EXPECT_EQ(rb->ids(), std::vector<std::uint64_t>(seen.begin() + 10, seen.end()));
  EXPECT_EQ(rb->all().find("event: reset"), std::string::npos) << rb->all();
  // And goes on with what comes next, from either replica.
  b.publish("phase", "t1", {{"n", 100}});
  ASSERT_TRUE(eventually([&] { return rb->ids().size() == 11; }));
  EXPECT_EQ(rb->numbers().back(), 100);
  // Per tenant too.
  auto rt = std::make_shared<Reader>();
  b.subscribe(rt, "t1", seen[9]);
  for (int n : rt->numbers()) EXPECT_EQ(n % 3, 1);
  EXPECT_EQ(rt->ids().size(), 5u) << rt->all();  // 10, 13, 16, 19 and 100
  // An id older than the ring: reset, as without a log.
  auto sc = open_store();
  ASSERT_TRUE(sc);
  EventBusOptions small = bus_on(*sc);
  small.history = 5;
  EventBus c(small);
  ASSERT_TRUE(eventually([&] { return c.last_id() == rb->ids().back(); }));
  auto rc = std::make_shared<Reader>();
  c.subscribe(rc, "", seen[2]);
  EXPECT_NE(rc->all().find("event: reset"), std::string::npos) << rc->all();
  EXPECT_NE(rc->all().find("too_old"), std::string::npos) << rc->all();
}

// A replica that starts later fills its ring from the log: a reader that
// moves to it resumes there too.
TEST_F(FeedLogTest, AReplicaStartedLaterResumesFromTheLogsNewestEvents) {
  auto sa = open_store();
  ASSERT_TRUE(sa);
  EventBus a(bus_on(*sa));
  auto ra = std::make_shared<Reader>();
  a.subscribe(ra, "", std::nullopt);
  publish_numbered(a, 0, 30);
  ASSERT_TRUE(eventually([&] { return ra->ids().size() == 30; }));
  auto sb = open_store();
  ASSERT_TRUE(sb);
  EventBus b(bus_on(*sb));
  // A reader without Last-Event-ID gets only what is new, not the backfill.
  auto fresh = std::make_shared<Reader>();
  b.subscribe(fresh, "", std::nullopt);
  ASSERT_TRUE(eventually([&] { return b.last_id() == ra->ids().back(); }));
  const auto seen = ra->ids();
  auto rb = std::make_shared<Reader>();
  EXPECT_EQ(b.subscribe(rb, "", seen[19]).replayed, 10u);
  EXPECT_EQ(rb->ids(), std::vector<std::uint64_t>(seen.begin() + 20, seen.end()));
  std::this_thread::sleep_for(100ms);
  EXPECT_TRUE(fresh->ids().empty()) << fresh->all();
}

// A Last-Event-ID read on a replica a moment ahead of this one: waited for,
// not reset; one that never comes (another feed's) is reset after the grace.
TEST_F(FeedLogTest, AnIdAheadOfThisReplicaIsWaitedForThenReset) {
  auto sa = open_store(), sb = open_store();
  ASSERT_TRUE(sa && sb);
  // B's log thread is held on the event "held" until the test lets it go:
  // B is behind A by that event.
  std::mutex mu;
  std::condition_variable cv;
  bool hold = true, holding = false;
  EventBusOptions ob = bus_on(*sb);
  ob.ahead_grace = 300ms;
  ob.on_logged = [&](const FeedEvent& e, bool, bool) {
    if (e.tenant != "held") return;
    std::unique_lock lk(mu);
    holding = true;
    cv.notify_all();
    cv.wait(lk, [&] { return !hold; });
  };
  EventBus a(bus_on(*sa)), b(ob);
  auto ra = std::make_shared<Reader>();
  a.subscribe(ra, "", std::nullopt);
  a.publish("phase", "held", {{"n", 1}});
  ASSERT_TRUE(eventually([&] { return ra->ids().size() == 1; }));
  {
    std::unique_lock lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, 10s, [&] { return holding; }));
  }
  const std::uint64_t x = ra->ids()[0];
  ASSERT_LT(b.last_id(), x);
  auto rb = std::make_shared<Reader>();
  ASSERT_NE(b.subscribe(rb, "", x).handle, 0u);
  EXPECT_EQ(rb->all().find("event: reset"), std::string::npos) << rb->all();
  {
    std::lock_guard lk(mu);
    hold = false;
  }
  cv.notify_all();
  a.publish("phase", "t1", {{"n", 2}});
  ASSERT_TRUE(eventually([&] { return rb->ids().size() == 1; })) << rb->all();
  EXPECT_EQ(rb->numbers(), std::vector<int>{2}) << "the held event was the reader's already";
  std::this_thread::sleep_for(400ms);
  b.heartbeat();
  EXPECT_EQ(rb->all().find("event: reset"), std::string::npos) << rb->all();
  // An id no replica will reach.
  auto bogus = std::make_shared<Reader>();
  b.subscribe(bogus, "", 1'000'000'000'000ull);
  b.heartbeat();
  EXPECT_EQ(bogus->all().find("event: reset"), std::string::npos) << "not before the grace";
  std::this_thread::sleep_for(400ms);
  b.heartbeat();
  EXPECT_NE(bogus->all().find("event: reset"), std::string::npos) << bogus->all();
  EXPECT_NE(bogus->all().find("unknown_id"), std::string::npos) << bogus->all();
  // Then it goes on with what comes.
  a.publish("phase", "t1", {{"n", 3}});
  ASSERT_TRUE(eventually([&] { return bogus->ids().size() == 1; })) << bogus->all();
}

// Every connection of the log cut (the listeners' and the writers') while
// events flow: each event still reaches each replica once, in one order.
TEST_F(FeedLogTest, EveryEventArrivesOnceAcrossLostConnections) {
  auto sa = open_store(), sb = open_store();
  ASSERT_TRUE(sa && sb);
  EventBus a(bus_on(*sa)), b(bus_on(*sb));
  ASSERT_TRUE(eventually([&] { return a.following() && b.following(); }));
  auto ra = std::make_shared<Reader>(), rb = std::make_shared<Reader>();
  a.subscribe(ra, "", std::nullopt);
  b.subscribe(rb, "", std::nullopt);
  const std::string listeners =
      "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
      "AND application_name = 'factory-coordinator-feed'";
  ASSERT_TRUE(eventually([&] { return sql(listeners) == "2"; }));
  for (int round = 0; round < 4; ++round) {
    ASSERT_TRUE(eventually([&] { return sql(listeners) == "2"; }));
    publish_numbered(a, round * 100, 50);
    publish_numbered(b, round * 100 + 50, 50);
    std::this_thread::sleep_for(20ms);
    EXPECT_NE(sql("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE "
                  "datname = current_database() AND application_name LIKE "
                  "'factory-coordinator-feed%'"),
              "0");
  }
  ASSERT_TRUE(eventually([&] { return ra->ids().size() >= 400 && rb->ids().size() >= 400; }, 30s))
      << ra->ids().size() << " " << rb->ids().size();
  std::this_thread::sleep_for(300ms);  // anything more would be a duplicate
  EXPECT_EQ(ra->ids().size(), 400u);
  EXPECT_EQ(ra->ids(), rb->ids());
  EXPECT_TRUE(strictly_increasing(ra->ids()));
  auto numbers = rb->numbers();
  EXPECT_EQ(std::set<int>(numbers.begin(), numbers.end()).size(), 400u);
  EXPECT_EQ(sql("SELECT count(*) FROM feed_log"), "400") << "a batch tried again adds nothing";
  EXPECT_GE(sa->feed_log()->stats().reconnects + sb->feed_log()->stats().reconnects, 1u);
}

TEST_F(FeedLogTest, TheLogIsPrunedToItsNewestRows) {
  store::StoreOptions o;
  o.feed_log.keep_rows = 10;
  o.feed_log.prune_every = 1s;
  auto s = open_store(o);
  ASSERT_TRUE(s);
  EventBus a(bus_on(*s));
  auto r = std::make_shared<Reader>();
  a.subscribe(r, "", std::nullopt);
  publish_numbered(a, 0, 50);
  ASSERT_TRUE(eventually([&] { return r->ids().size() == 50; }));
  ASSERT_TRUE(eventually([&] { return sql("SELECT count(*) FROM feed_log") == "10"; }, 5s))
      << sql("SELECT count(*) FROM feed_log");
  EXPECT_EQ(sql("SELECT min(id) FROM feed_log"), std::to_string(r->ids()[40]));
  EXPECT_TRUE(eventually([&] { return s->feed_log()->stats().pruned == 40u; }))
      << s->feed_log()->stats().pruned;
}

// --- presence ------------------------------------------------------------------

AgentPresence agent(const std::string& id) {
  AgentPresence p;
  p.agent_id = id;
  p.version = "1.2.3";
  p.hostname = "guest-" + id;
  p.remote = "10.0.0.7:4000";
  p.connected_since = "2026-01-01T00:00:00Z";
  return p;
}

class FeedPresenceTest : public FeedLogTest {
 protected:
  EventBusOptions opts(store::Store& s, std::chrono::milliseconds ttl = 60s) {
    auto o = bus_on(s);
    o.replica_ttl = ttl;
    return o;
  }
};

TEST_F(FeedPresenceTest, AnAgentOnOneReplicaShowsConnectedOnTheOther) {
  auto sa = open_store(), sb = open_store();
  ASSERT_TRUE(sa && sb);
  FeedState a(opts(*sa)), b(opts(*sb));
  ASSERT_TRUE(eventually([&] { return a.bus().following() && b.bus().following(); }));
  b.agent_connected("t1", agent("ag1"));
  ASSERT_TRUE(eventually([&] { return a.presence("t1") && a.presence("t1")->connected; }));
  auto p = *a.presence("t1");
  EXPECT_EQ(p.agent_id, "ag1");
  EXPECT_EQ(p.hostname, "guest-ag1");
  EXPECT_EQ(p.remote, "10.0.0.7:4000");
  EXPECT_EQ(p.connected_since, "2026-01-01T00:00:00Z");
  EXPECT_EQ(p.replica, sb->feed_log()->origin());
  EXPECT_EQ(a.connected_count(), 1u);
  EXPECT_EQ(b.presence("t1")->replica, "") << "its own connection";
  // It stops: both show how.
  b.agent_disconnected("t1", "2026-01-01T01:00:00Z", "stopped", "going down");
  ASSERT_TRUE(eventually([&] { return a.presence("t1")->disconnect == "stopped"; }));
  EXPECT_FALSE(a.presence("t1")->connected);
  EXPECT_EQ(a.presence("t1")->disconnect_detail, "going down");
  EXPECT_EQ(a.presence("t1")->last_seen, "2026-01-01T01:00:00Z");
  EXPECT_EQ(a.connected_count(), 0u);
}

// The agent moves (its replica's connection lingers, then ends): the newer
// connection is the one on show on every replica.
TEST_F(FeedPresenceTest, TheNewerConnectionWinsWhenAnAgentMoves) {
  auto sa = open_store(), sb = open_store(), sc = open_store();
  ASSERT_TRUE(sa && sb && sc);
  FeedState a(opts(*sa)), b(opts(*sb)), c(opts(*sc));
  ASSERT_TRUE(eventually(
      [&] { return a.bus().following() && b.bus().following() && c.bus().following(); }));
  b.agent_connected("t1", agent("ag1"));
  ASSERT_TRUE(eventually([&] {
    return a.presence("t1") && a.presence("t1")->connected && c.presence("t1") &&
           c.presence("t1")->connected;
  }));
  a.agent_connected("t1", agent("ag1"));
  const std::string on_a = sa->feed_log()->origin();
  ASSERT_TRUE(eventually(
      [&] { return b.presence("t1")->replica == on_a && c.presence("t1")->replica == on_a; }));
  // B's old connection ends after: A's is still on show everywhere.
  b.agent_disconnected("t1", "2026-01-01T01:00:00Z", "lost", "timeout");
  // After B's event in the log: once every replica has it, B's is applied.
  a.bus().publish("phase", "sync", {{"phase", "x"}});
  ASSERT_TRUE(eventually(
      [&] { return a.bus().last_id() >= 4 && b.bus().last_id() >= 4 && c.bus().last_id() >= 4; }));
  std::this_thread::sleep_for(300ms);
  EXPECT_TRUE(a.presence("t1")->connected);
  EXPECT_EQ(a.presence("t1")->replica, "");
  EXPECT_TRUE(b.presence("t1")->connected);
  EXPECT_EQ(b.presence("t1")->replica, on_a);
  EXPECT_TRUE(c.presence("t1")->connected);
  EXPECT_EQ(c.presence("t1")->replica, on_a);
}

// The staleness rule: an agent held by another replica is shown connected
// while that replica is heard from (its heartbeat's note), and "lost" once
// it has been silent for replica_ttl (killed: no disconnect ever comes).
TEST_F(FeedPresenceTest, AnAgentOfADeadReplicaGoesLostAfterTheTtl) {
  auto sa = open_store(), sb = open_store();
  ASSERT_TRUE(sa && sb);
  FeedState a(opts(*sa, 600ms)), b(opts(*sb, 600ms));
  ASSERT_TRUE(eventually([&] { return a.bus().following() && b.bus().following(); }));
  b.agent_connected("t1", agent("ag1"));
  ASSERT_TRUE(eventually([&] { return a.presence("t1") && a.presence("t1")->connected; }));
  // Alive: B's heartbeats, for twice the ttl.
  for (int i = 0; i < 12; ++i) {
    b.bus().heartbeat();
    std::this_thread::sleep_for(100ms);
    ASSERT_TRUE(a.presence("t1")->connected) << "at " << i * 100 << " ms";
  }
  // Dead: nothing more from B (its log closed, as a process killed says nothing).
  sb->feed_log()->close();
  ASSERT_TRUE(eventually([&] { return !a.presence("t1")->connected; }, 3s));
  EXPECT_EQ(a.presence("t1")->disconnect, "lost");
  EXPECT_NE(a.presence("t1")->disconnect_detail.find("has not been heard from"), std::string::npos);
  EXPECT_EQ(a.connected_count(), 0u);
  EXPECT_FALSE(a.all().at("t1").connected);
  // The agent reconnects, here: connected again.
  a.agent_connected("t1", agent("ag1"));
  EXPECT_TRUE(a.presence("t1")->connected);
  EXPECT_EQ(a.presence("t1")->replica, "");
}

// A replica started after an agent connected elsewhere learns of it from
// that replica's next heartbeat note.
TEST_F(FeedPresenceTest, AReplicaStartedLaterLearnsOfAgentsFromTheNotes) {
  auto sb = open_store();
  ASSERT_TRUE(sb);
  FeedState b(opts(*sb));
  b.agent_connected("t1", agent("ag1"));
  b.agent_connected("t2", agent("ag2"));
  b.agent_disconnected("t2", "2026-01-01T01:00:00Z", "stopped", "");
  ASSERT_TRUE(eventually([&] { return b.bus().last_id() >= 3; }));
  auto sa = open_store();
  ASSERT_TRUE(sa);
  FeedState a(opts(*sa));
  ASSERT_TRUE(eventually([&] { return a.bus().last_id() >= 3; }));
  EXPECT_FALSE(a.presence("t1")) << "the backfill says nothing of now";
  b.bus().heartbeat();
  ASSERT_TRUE(eventually([&] { return a.presence("t1") && a.presence("t1")->connected; }));
  EXPECT_EQ(a.presence("t1")->agent_id, "ag1");
  EXPECT_EQ(a.presence("t1")->replica, sb->feed_log()->origin());
  EXPECT_FALSE(a.presence("t2")) << "not connected anywhere";
}

// Rows the replicas did not write as they should (a field of another type,
// a note that is not one): read, taken as absent, never thrown on.
TEST_F(FeedPresenceTest, RowsOfTheWrongShapeAreIgnoredNotThrownOn) {
  auto sa = open_store();
  ASSERT_TRUE(sa);
  FeedState a(opts(*sa));
  ASSERT_TRUE(eventually([&] { return a.bus().following(); }));
  sql("INSERT INTO feed_log(origin, origin_seq, type, tenant, data, appended_unix) VALUES "
      "('x', 1, 'agent', 't1', '{\"connected\":\"yes\",\"agent_id\":5}', 0), "
      "('x', 2, 'replica', '', '{\"agents\":[1,2]}', 0), "
      "('x', 3, 'replica', '', '{\"agents\":{\"t3\":5}}', 0), "
      "('x', 4, 'agent', 't4', 'not json', 0), "
      "('x', 5, 'agent', 't2', '{\"connected\":true,\"agent_id\":[1],\"time\":7}', 0); "
      "SELECT pg_notify('factory_feed', '')");
  ASSERT_TRUE(eventually([&] { return a.bus().last_id() >= 5; }));
  EXPECT_FALSE(a.presence("t1"));
  ASSERT_TRUE(a.presence("t2"));
  EXPECT_TRUE(a.presence("t2")->connected);
  EXPECT_EQ(a.presence("t2")->agent_id, "") << "a field of another type is absent";
  EXPECT_FALSE(a.presence("t3"));
  EXPECT_FALSE(a.presence("t4"));
}

// --- SQLite: no log, the bus as it was -----------------------------------------

TEST(FeedLogSqlite, TheEmbeddedStoreHasNoLogAndTheBusNumbersItsOwnEvents) {
  factory::testing::TempDir dir("feedlog");
  auto s = store::open_sqlite_store(dir.path().string());
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_EQ((*s)->feed_log(), nullptr);
  EventBusOptions o;
  o.heartbeat = 0ms;
  o.first_id = 500;
  o.log = (*s)->feed_log();
  FeedState state(o);
  EXPECT_FALSE(state.bus().logged());
  EXPECT_TRUE(state.bus().following());
  auto r = std::make_shared<Reader>();
  state.bus().subscribe(r, "", std::nullopt);
  EXPECT_EQ(state.bus().publish("phase", "t1", {{"n", 1}}), 500u);
  state.agent_connected("t1", agent("ag1"));
  EXPECT_EQ(r->ids(), (std::vector<std::uint64_t>{500, 501})) << "delivered at once";
  EXPECT_EQ(state.presence("t1")->replica, "");
  state.bus().heartbeat();  // no note: nothing but the comment line
  EXPECT_EQ(r->ids().size(), 2u);
  (*s)->close();
}

}  // namespace
