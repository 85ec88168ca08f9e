// The embedded store (coordinator/store): a real SQLite database in a temp
// dir, reopened as a restarted coordinator would, fed from several threads
// as the io threads and workers do.
#include "coordinator/store/store.hpp"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "tests/support/test_support.hpp"

namespace factory::store {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using factory::testing::TempDir;

TenantRecord tenant(const std::string& name) {
  TenantRecord t;
  t.name = name;
  t.tier = "gpu-vm";
  t.phase = "pending";
  t.created_at = "2026-12-01T00:00:00Z";
  return t;
}

StoredEvent event(std::uint64_t id, const std::string& agent = "a1",
                  const std::string& kind = "progress") {
  StoredEvent e;
  e.agent_id = agent;
  e.id = id;
  e.received_at = "2026-12-01T00:00:01Z";
  e.event = {{"id", id}, {"kind", kind}};
  return e;
}

// The i-th health sample of a guest with one busy card, a model loaded and
// an Xid not yet acknowledged.
std::shared_ptr<const LatestHealth> health_sample(int i) {
  proto::HealthSample h;
  h.time = "2026-12-01T00:00:00Z";
  h.hostname = "vm-t1";
  h.gpu.source = "nvml";
  h.gpu.driver_version = "580.95.05";
  proto::GpuSample g;
  g.name = "NVIDIA H200";
  g.uuid = "GPU-0108b095-1b2c-4d5e-8f90-a1b2c3d4e5f6";
  g.pci_bus_id = "00000000:00:06.0";
  g.memory_total_mib = 143771;
  g.utilization_percent = i % 101;
  g.power_draw_w = 412.5;
  g.remapped_rows_failure = false;
  g.xids.push_back({79, 2, "2026-12-01T00:00:00Z", "2026-12-01T00:00:00Z"});
  h.gpu.gpus.push_back(g);
  h.ollama = proto::OllamaSection{};
  h.ollama->version = "0.12.3";
  h.ollama->models.push_back({"llama3.2:1b", 2000000000, 2000000000, 100, 4096, ""});
  return std::make_shared<const LatestHealth>(LatestHealth{std::move(h), "2026-12-01T00:00:01Z"});
}

// append_event, waited for.
Result<AppendOutcome> append(Store& s, const std::string& t, StoredEvent e,
                             Projection p = nullptr) {
  std::promise<Result<AppendOutcome>> done;
  s.append_event(t, std::move(e), std::move(p),
                 [&](Result<AppendOutcome> r) { done.set_value(std::move(r)); });
  return done.get_future().get();
}

std::unique_ptr<Store> open(const fs::path& dir, StoreOptions o = {}) {
  auto s = open_sqlite_store(dir.string(), o);
  EXPECT_TRUE(s.ok()) << (s ? "" : s.error().message);
  return s ? std::move(*s) : nullptr;
}

TEST(SqliteStore, TenantsSurviveAReopen) {
  TempDir dir("store");
  {
    auto s = open(dir.path());
    ASSERT_TRUE(s->put_tenant(tenant("t1")).ok());
    ASSERT_TRUE(s->put_tenant(tenant("t2")).ok());
    ASSERT_TRUE(s->delete_tenant("t2").ok());
    auto r = s->update_tenant("t1", [](TenantRecord& t) {
      t.phase = "ready";
      return Status{};
    });
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->phase, "ready");
    EXPECT_EQ(s->update_tenant("nope", [](TenantRecord&) { return Status{}; }).error().code,
              Errc::not_found);
  }
  auto s = open(dir.path());
  auto all = s->list_tenants();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].name, "t1");
  EXPECT_EQ(all[0].phase, "ready");
}

TEST(SqliteStore, EventsAreStoredOnceAndTheirCursorSurvivesAReopen) {
  TempDir dir("store");
  {
    auto s = open(dir.path());
    ASSERT_TRUE(s->put_tenant(tenant("t1")).ok());
    for (std::uint64_t id : {1, 2, 3}) {
      auto r = append(*s, "t1", event(id));
      ASSERT_TRUE(r.ok());
      EXPECT_TRUE(r->stored);
    }
    auto dup = append(*s, "t1", event(2));
    ASSERT_TRUE(dup.ok());
    EXPECT_FALSE(dup->stored);
    // Another agent identity of the tenant (after a re-enrollment) counts apart.
    EXPECT_TRUE(append(*s, "t1", event(1, "a2"))->stored);
    EXPECT_EQ(s->last_event_id("t1", "a1"), 3u);
    EXPECT_EQ(s->stats().events_duplicate, 1u);
  }
  auto s = open(dir.path());
  EXPECT_EQ(s->last_event_id("t1", "a1"), 3u);
  EXPECT_EQ(s->last_event_id("t1", "a2"), 1u);
  EXPECT_EQ(s->event_count("t1"), 4u);
  EXPECT_FALSE(append(*s, "t1", event(3))->stored);
  auto recent = s->recent_events("t1", 10);
  ASSERT_EQ(recent.size(), 4u);
  EXPECT_EQ(recent.front().id, 1u);
  EXPECT_LT(recent.front().seq, recent.back().seq);
  // An event for a tenant that does not exist is refused, not stored.
  auto orphan = append(*s, "ghost", event(1));
  EXPECT_FALSE(orphan.ok());
}

TEST(SqliteStore, ProjectionChangesTheRecordInTheEventsTransaction) {
  TempDir dir("store");
  auto s = open(dir.path());
  ASSERT_TRUE(s->put_tenant(tenant("t1")).ok());
  auto r = append(*s, "t1", event(1), [](TenantRecord& t) {
    t.phase = "provisioning";
    return true;
  });
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r->record.has_value());
  EXPECT_EQ(r->record->phase, "provisioning");
  EXPECT_EQ(s->get_tenant("t1")->phase, "provisioning");
  // A replay is not projected again.
  bool called = false;
  auto again = append(*s, "t1", event(1), [&](TenantRecord&) { return called = true; });
  EXPECT_FALSE(again->stored);
  EXPECT_FALSE(called);
}

TEST(SqliteStore, NoChangeIsLostBetweenProjectionsAndUpdatesFromOtherThreads) {
  TempDir dir("store");
  auto s = open(dir.path());
  auto t = tenant("t1");
  t.status.extra = {{"events", 0}, {"updates", 0}};
  ASSERT_TRUE(s->put_tenant(t).ok());
  std::atomic<int> answered{0};
  std::thread io([&] {
    for (std::uint64_t id = 1; id <= 2000; ++id)
      s->append_event(
          "t1", event(id),
          [](TenantRecord& r) {
            r.status.extra["events"] = r.status.extra["events"].get<int>() + 1;
            return true;
          },
          [&](Result<AppendOutcome> r) {
            if (r.ok()) ++answered;
          });
  });
  std::thread worker([&] {
    for (int i = 0; i < 200; ++i)
      ASSERT_TRUE(s->update_tenant("t1", [](TenantRecord& r) {
                     r.status.extra["updates"] = r.status.extra["updates"].get<int>() + 1;
                     return Status{};
                   }).ok());
  });
  io.join();
  worker.join();
  ASSERT_TRUE(factory::testing::eventually([&] { return answered == 2000; }));
  auto rec = s->get_tenant("t1");
  EXPECT_EQ(rec->status.extra["events"], 2000);
  EXPECT_EQ(rec->status.extra["updates"], 200);
  // Batched: far fewer transactions (and syncs) than operations.
  EXPECT_LT(s->stats().transactions, 1100u);
}

TEST(SqliteStore, RetentionKeepsTheNewestAndStillRefusesReplaysOfTheOldest) {
  TempDir dir("store");
  StoreOptions o;
  o.max_events_per_tenant = 10;
  auto s = open(dir.path(), o);
  ASSERT_TRUE(s->put_tenant(tenant("t1")).ok());
  ASSERT_TRUE(s->put_tenant(tenant("t2")).ok());
  for (std::uint64_t id = 1; id <= 25; ++id) ASSERT_TRUE(append(*s, "t1", event(id)).ok());
  ASSERT_TRUE(append(*s, "t2", event(1)).ok());
  EXPECT_EQ(s->event_count("t1"), 10u);
  EXPECT_EQ(s->event_count("t2"), 1u);
  auto recent = s->recent_events("t1", 100);
  ASSERT_EQ(recent.size(), 10u);
  EXPECT_EQ(recent.front().id, 16u);
  EXPECT_EQ(s->stats().events_expired, 15u);
  EXPECT_FALSE(append(*s, "t1", event(3))->stored);
}

TEST(SqliteStore, EventsOlderThanTheirAgeAreDroppedAtMaintenance) {
  TempDir dir("store");
  StoreOptions o;
  o.max_event_age = 1s;
  o.maintenance_every = 1s;
  auto s = open(dir.path(), o);
  ASSERT_TRUE(s->put_tenant(tenant("t1")).ok());
  ASSERT_TRUE(append(*s, "t1", event(1)).ok());
  ASSERT_TRUE(factory::testing::eventually([&] { return s->event_count("t1") == 0; }, 6s));
  EXPECT_EQ(s->stats().events_expired, 1u);
  EXPECT_EQ(s->last_event_id("t1", "a1"), 1u);
}

TEST(SqliteStore, HealthIsKeptInMemoryAndSavedCoalesced) {
  TempDir dir("store");
  {
    StoreOptions o;
    o.health_flush = 3600s;  // only close() saves it here
    auto s = open(dir.path(), o);
    ASSERT_TRUE(s->put_tenant(tenant("t1")).ok());
    for (int i = 0; i < 1000; ++i) s->put_health("t1", health_sample(i));
    EXPECT_EQ(s->get_health("t1")->sample.gpu.gpus[0].utilization_percent, 999 % 101);
    EXPECT_EQ(s->stats().transactions, 1u);  // the put_tenant alone
  }
  auto s = open(dir.path());
  auto saved = s->get_health("t1");
  ASSERT_TRUE(saved);
  // Read back whole: every figure, and when the coordinator took it in.
  EXPECT_EQ(saved->to_json(), health_sample(999)->to_json());
  ASSERT_TRUE(s->delete_tenant("t1").ok());
  EXPECT_FALSE(s->get_health("t1"));
}

TEST(SqliteStore, DatabaseFilesArePrivate) {
  TempDir dir("store");
  auto s = open(dir.path());
  ASSERT_TRUE(s->put_tenant(tenant("t1")).ok());
  for (auto f : {"factory.db", "factory.db-wal"}) {
    struct stat st {};
    ASSERT_EQ(::stat((dir.path() / f).c_str(), &st), 0) << f;
    EXPECT_EQ(st.st_mode & 0777, 0600u) << f;
  }
}

TEST(SqliteStore, AWaitingCallFromAStoreCallbackIsRefusedNotADeadlock) {
  TempDir dir("store");
  auto s = open(dir.path());
  ASSERT_TRUE(s->put_tenant(tenant("t1")).ok());
  std::promise<Status> inner;
  s->append_event("t1", event(1), nullptr,
                  [&](Result<AppendOutcome>) { inner.set_value(s->put_tenant(tenant("t2"))); });
  auto st = inner.get_future().get();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, Errc::internal);
}

TEST(SqliteStore, AnUnreadableRecordIsLeftOutAndTheRestLoads) {
  TempDir dir("store");
  {
    auto s = open(dir.path());
    ASSERT_TRUE(s->put_tenant(tenant("good")).ok());
    ASSERT_TRUE(s->put_tenant(tenant("bad")).ok());
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir.path() / "factory.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "UPDATE tenants SET record = '{not json' WHERE name = 'bad'", nullptr,
                         nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  auto s = open(dir.path());
  auto all = s->list_tenants();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].name, "good");
}

TEST(SqliteStore, ImportsTheFileStoreSkippingACorruptRecordInTheMiddle) {
  TempDir dir("store");
  fs::create_directories(dir.path() / "tenants");
  fs::create_directories(dir.path() / "events");
  std::ofstream(dir.path() / "tenants" / "t1.json") << tenant("t1").to_json().dump();
  std::ofstream(dir.path() / "events" / "t1.jsonl")
      << R"({"agent_id":"a1","id":1,"received_at":"2026-11-30T10:00:00Z","event":{"kind":"progress"}})"
      << "\n{\"agent_id\":\"a1\",\"id\":2,\"rec"
      << "\n"  // torn in the middle by a bad disk
      << R"({"agent_id":"a1","id":3,"received_at":"2026-11-30T10:00:02Z","event":{"kind":"plan"}})"
      << "\n";
  auto s = open(dir.path());
  ASSERT_TRUE(s->get_tenant("t1").has_value());
  EXPECT_EQ(s->event_count("t1"), 2u);
  EXPECT_EQ(s->last_event_id("t1", "a1"), 3u);
  EXPECT_TRUE(fs::exists(dir.path() / "tenants.imported"));
  EXPECT_FALSE(fs::exists(dir.path() / "events"));
}

TEST(SqliteStore, ANewerSchemaIsRefusedWithTheFix) {
  TempDir dir("store");
  { auto s = open(dir.path()); }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir.path() / "factory.db").c_str(), &db), SQLITE_OK);
  sqlite3_exec(db, "UPDATE meta SET value = '99' WHERE key = 'schema'", nullptr, nullptr, nullptr);
  sqlite3_close(db);
  auto s = open_sqlite_store(dir.path().string());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("newer Factory"), std::string::npos);
}

}  // namespace
}  // namespace factory::store
