// The typed tenant record (coordinator/store/tenant_record.hpp): every field
// and every unknown key comes back from its JSON and from the database as
// it went in, and a value of the wrong type is reported, not crashed on.
#include "coordinator/store/tenant_record.hpp"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <string>

#include "coordinator/store/store.hpp"
#include "tests/support/test_support.hpp"

namespace factory::store {
namespace {

using factory::testing::TempDir;
using nlohmann::json;

// A record with every field the coordinator writes set, and a key it does
// not know at every level (a newer coordinator's).
const char* kFullRecord = R"({
  "name": "tenant-1", "tier": "gpu-k8s", "phase": "ready",
  "created_at": "2026-12-01T00:00:00Z", "future_top": {"a": [1, 2]},
  "spec": {
    "tier": "gpu-k8s", "namespace": "tenants", "cpu": "8", "memory": "16Gi", "disk": "100Gi",
    "image": "https://images.example/noble.img", "gpus": 2,
    "gpu_resource": "nvidia.com/AD104GL_L4", "ssh_node_port": 30022, "needs_mig": true,
    "ssh_service": false, "endpoint_port": 11434,
    "labels": {"team": "a", "cost-center": "42"},
    "ssh_authorized_keys": ["ssh-ed25519 AAAA admin"], "models": ["llama3.2:1b", "qwen3:0.6b"],
    "guest_ranges": {
      "avoid": [{"range": "10.42.0.0/16", "source": "host pods"}],
      "pool": {"v4": ["10.0.0.0/8"]},
      "planned": {"cluster-cidr": "10.50.0.0/16", "service-cidr": "10.51.0.0/16",
                  "cluster-dns": "10.51.0.10"},
      "fixed": false, "future_ranges": 1},
    "future_spec": "x"},
  "agent": {
    "agent_id": "0123456789abcdef", "cert_serials": ["0a", "0b"],
    "certificate_expires_at": "2026-12-31T00:00:00Z", "enrolled_at": "2026-12-01T00:01:00Z",
    "hostname": "tenant-1", "version": "1.2.3", "revoked_at": "2026-12-02T00:00:00Z",
    "future_agent": true},
  "status": {
    "kube": {"state": "created", "namespace": "tenants", "started_at": "2026-12-01T00:00:01Z",
             "created_at": "2026-12-01T00:00:09Z", "gpu_resource": "nvidia.com/AD104GL_L4",
             "objects": ["VirtualMachine/tenants/tenant-1"], "bootstrap_token_id": "tok1",
             "error": "none really", "future_kube": null},
    "plan": {
      "hash": "ab12", "tier": "gpu-k8s", "state": "succeeded", "message": "done",
      "failed_step": "", "steps_total": 3, "steps_done": 3, "time": "2026-12-01T01:00:00Z",
      "truncated": true, "future_plan": {"b": 1},
      "steps": {
        "rke2": {
          "state": "failed", "started_at": "2026-12-01T00:10:00Z",
          "time": "2026-12-01T00:20:00Z", "truncated": true, "attempt": 2, "message": "m",
          "output_tail": "tail", "percent": 50.5, "completed": 1, "total": 2,
          "allocatable": 4, "expected": 4,
          "diagnosis": {"code": "rke2_failed", "summary": "s", "fix": "f",
                        "details": {"gpu": 0}, "future_diagnosis": 2},
          "ranges": {"cluster-cidr": "10.50.0.0/16", "around": []},
          "future_step": "y"}}},
    "diagnoses": {
      "gpu_lost": {"kind": "diagnosis", "code": "gpu_lost", "summary": "s", "fix": "f",
                   "details": {"uuid": "GPU-1"}, "time": "2026-12-01T02:00:00Z",
                   "truncated": true, "future_d": 3}},
    "gpu_faults": {
      "GPU-1/xid-79": {"gpu": 0, "uuid": "GPU-1", "serial": "1320", "name": "NVIDIA L4",
                       "pci_bus_id": "00000000:00:06.0", "kind": "xid", "xid": 79,
                       "code": "gpu_xid_79", "summary": "s", "fix": "f",
                       "first_seen": "2026-12-01T03:00:00Z", "future_fault": []}},
    "restart": {"state": "done", "requested_at": "2026-12-01T04:00:00Z",
                "finished_at": "2026-12-01T04:01:00Z", "from_instance": "i-1",
                "avoid_gpus": ["0000:41:00.0"], "gpus_before": ["0000:41:00.0"],
                "gpus_after": ["0000:42:00.0"], "note": "moved", "error": null,
                "future_restart": "z"},
    "health": {"an old copy": true}},
  "endpoint": {"key_sha256": "ff00", "port": 11434, "host": "10.0.0.1",
               "rotated_at": "2026-12-01T00:00:05Z", "url": "https://10.0.0.1:31443",
               "future_endpoint": 4}
})";

TEST(TenantRecord, EveryFieldAndEveryUnknownKeyRoundTrips) {
  const json in = json::parse(kFullRecord);
  auto rec = TenantRecord::from_json(in);
  ASSERT_TRUE(rec.ok()) << rec.error().message;
  // Typed inside: the known fields are members, the rest kept aside.
  EXPECT_EQ(rec->spec.gpus, 2);
  EXPECT_EQ(rec->spec.needs_mig, true);
  EXPECT_EQ(rec->spec.labels->at("cost-center"), "42");
  EXPECT_EQ(rec->spec.guest_ranges->fixed, false);
  EXPECT_EQ(rec->spec.extra, (json{{"future_spec", "x"}}));
  EXPECT_EQ(rec->agent.cert_serials->size(), 2u);
  EXPECT_EQ(rec->status.plan->steps_done, 3u);
  EXPECT_EQ(rec->status.plan->steps->at("rke2").attempt, 2);
  EXPECT_EQ(rec->status.plan->steps->at("rke2").diagnosis->code, "rke2_failed");
  EXPECT_EQ(rec->status.gpu_faults->at("GPU-1/xid-79").xid, 79);
  EXPECT_EQ(rec->status.restart->gpus_after->front(), "0000:42:00.0");
  EXPECT_TRUE(rec->status.extra.contains("health"));
  EXPECT_TRUE(rec->status.kube->extra.contains("future_kube"));
  // A known key that is null is not a value of its type: kept as it was.
  EXPECT_FALSE(rec->status.restart->error.has_value());
  EXPECT_EQ(rec->status.restart->extra, (json{{"error", nullptr}, {"future_restart", "z"}}));
  ASSERT_TRUE(rec->endpoint.has_value());
  EXPECT_EQ(rec->endpoint->port, 11434);
  EXPECT_EQ(rec->extra, (json{{"future_top", {{"a", {1, 2}}}}}));

  // Out: the same JSON, byte for byte once dumped.
  EXPECT_EQ(rec->to_json().dump(), in.dump());
  // And again from the text: a parsed number is unsigned, a made one signed.
  auto again = TenantRecord::from_json(json::parse(rec->to_json().dump()));
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(*again, *rec);
  // Each part on its own.
  EXPECT_EQ(TenantSpec::from_json(in["spec"])->to_json(), in["spec"]);
  EXPECT_EQ(AgentPresence::from_json(in["agent"])->to_json(), in["agent"]);
  EXPECT_EQ(TenantStatus::from_json(in["status"])->to_json(), in["status"]);
  EXPECT_EQ(EndpointState::from_json(in["endpoint"])->to_json(), in["endpoint"]);
}

TEST(TenantRecord, ATokenOnlyTenantsRecordStaysAsItWas) {
  // What `factory token create` stores: no spec, no agent, no endpoint.
  const json objects = {{"name", "t"},
                        {"tier", ""},
                        {"phase", "pending"},
                        {"created_at", ""},
                        {"spec", json::object()},
                        {"agent", json::object()},
                        {"status", json::object()}};
  auto rec = TenantRecord::from_json(objects);
  ASSERT_TRUE(rec.ok()) << rec.error().message;
  EXPECT_TRUE(rec->spec.empty());
  EXPECT_TRUE(rec->agent.empty());
  EXPECT_TRUE(rec->status.empty());
  EXPECT_FALSE(rec->endpoint.has_value());
  EXPECT_EQ(rec->to_json(), objects);
  // An empty endpoint is none, as it always was (never written).
  json with_empty = objects;
  with_empty["endpoint"] = json::object();
  EXPECT_EQ(TenantRecord::from_json(with_empty)->to_json(), objects);
  // Only name is required: the rest reads as a new record's.
  auto bare = TenantRecord::from_json({{"name", "t"}});
  ASSERT_TRUE(bare.ok()) << bare.error().message;
  EXPECT_EQ(bare->phase, "pending");
  EXPECT_EQ(bare->to_json(), objects);
}

TEST(TenantRecord, IntegersReadWhicheverWayNlohmannHoldsThem) {
  // Made in memory: signed. Parsed from text: unsigned. Both read.
  json made = {{"steps_total", 5}, {"steps_done", std::int64_t{2}}};
  json parsed = json::parse(R"({"steps_total": 5, "steps_done": 2})");
  ASSERT_TRUE(made["steps_total"].is_number_integer() && !made["steps_total"].is_number_unsigned());
  ASSERT_TRUE(parsed["steps_total"].is_number_unsigned());
  for (const json& plan : {made, parsed}) {
    auto st = TenantStatus::from_json({{"plan", plan}});
    ASSERT_TRUE(st.ok()) << st.error().message;
    EXPECT_EQ(st->plan->steps_total, 5u);
    EXPECT_EQ(st->plan->steps_done, 2u);
  }
  // An int field takes an unsigned one in range, too.
  auto spec = TenantSpec::from_json(json::parse(R"({"gpus": 2, "ssh_node_port": 30022})"));
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  EXPECT_EQ(spec->gpus, 2);
  EXPECT_EQ(spec->ssh_node_port, 30022);
  // Out of range is reported, not wrapped.
  auto negative = TenantStatus::from_json({{"plan", {{"steps_done", -1}}}});
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.error().message.find("status.plan.steps_done"), std::string::npos)
      << negative.error().message;
  EXPECT_FALSE(TenantSpec::from_json({{"gpus", 5000000000}}).ok());
}

TEST(TenantRecord, AValueOfTheWrongTypeIsReportedWithItsPath) {
  struct Case {
    json record;
    std::string path;
  };
  const json base = {{"name", "t"}};
  auto with = [&](const json& patch) {
    json j = base;
    j.merge_patch(patch);
    return j;
  };
  const Case cases[] = {
      {with({{"spec", {{"gpus", "2"}}}}), "spec.gpus"},
      {with({{"spec", "gpu-vm"}}), "spec"},
      {with({{"spec", {{"labels", {{"team", 1}}}}}}), "spec.labels.team"},
      {with({{"agent", {{"cert_serials", {"0a", 7}}}}}), "agent.cert_serials[1]"},
      {with({{"status", {{"plan", {{"steps", {{"s1", {{"attempt", "x"}}}}}}}}}}),
       "status.plan.steps.s1.attempt"},
      {with({{"status", {{"gpu_faults", {{"k", {{"first_seen", 3}}}}}}}}),
       "status.gpu_faults.k.first_seen"},
      {with({{"endpoint", {{"port", "443"}}}}), "endpoint.port"},
      {with({{"phase", 3}}), "phase"},
      {json{{"tier", "x"}}, "no name"},
      {json::array(), "record"},
  };
  for (const auto& c : cases) {
    auto r = TenantRecord::from_json(c.record);
    ASSERT_FALSE(r.ok()) << c.record.dump();
    EXPECT_EQ(r.error().code, Errc::invalid_argument);
    EXPECT_NE(r.error().message.find(c.path), std::string::npos)
        << r.error().message << " should name " << c.path;
  }
}

void set_stored_text(const std::filesystem::path& dir, const std::string& name,
                     const std::string& text) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir / "factory.db").c_str(), &db), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  ASSERT_EQ(
      sqlite3_prepare_v2(db, "UPDATE tenants SET record = ? WHERE name = ?", -1, &st, nullptr),
      SQLITE_OK);
  sqlite3_bind_text(st, 1, text.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st, 2, name.c_str(), -1, SQLITE_TRANSIENT);
  EXPECT_EQ(sqlite3_step(st), SQLITE_DONE);
  sqlite3_finalize(st);
  sqlite3_close(db);
}

std::string stored_text(const std::filesystem::path& dir, const std::string& name) {
  sqlite3* db = nullptr;
  std::string out;
  if (sqlite3_open((dir / "factory.db").c_str(), &db) != SQLITE_OK) return out;
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db, "SELECT record FROM tenants WHERE name = ?", -1, &st, nullptr) ==
      SQLITE_OK) {
    sqlite3_bind_text(st, 1, name.c_str(), -1, SQLITE_TRANSIENT);
    if (sqlite3_step(st) == SQLITE_ROW)
      out = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return out;
}

TEST(TenantRecord, RoundTripsThroughTheSqliteStoreUnchanged) {
  TempDir dir("tenant-record");
  const json in = json::parse(kFullRecord);
  auto rec = TenantRecord::from_json(in);
  ASSERT_TRUE(rec.ok()) << rec.error().message;
  {
    auto s = open_sqlite_store(dir.path().string());
    ASSERT_TRUE(s.ok()) << s.error().message;
    ASSERT_TRUE((*s)->put_tenant(*rec).ok());
    (*s)->close();
  }
  EXPECT_EQ(json::parse(stored_text(dir.path(), "tenant-1")), in);
  auto s = open_sqlite_store(dir.path().string());
  ASSERT_TRUE(s.ok()) << s.error().message;
  auto back = (*s)->get_tenant("tenant-1");
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(*back, *rec);
  EXPECT_EQ(back->to_json().dump(), in.dump());
  // A change through the store keeps what it does not touch.
  auto changed = (*s)->update_tenant("tenant-1", [](TenantRecord& t) {
    t.phase = "failed";
    return Status{};
  });
  ASSERT_TRUE(changed.ok());
  json want = in;
  want["phase"] = "failed";
  EXPECT_EQ(changed->to_json(), want);
  (*s)->close();
  EXPECT_EQ(json::parse(stored_text(dir.path(), "tenant-1")), want);
}

TEST(TenantRecord, AStoredRecordWithAWrongTypeIsLeftOutNotCrashedOn) {
  TempDir dir("tenant-record");
  {
    auto s = open_sqlite_store(dir.path().string());
    ASSERT_TRUE(s.ok()) << s.error().message;
    for (const char* name : {"good", "bad"}) {
      TenantRecord t;
      t.name = name;
      t.tier = "gpu-vm";
      t.spec.gpus = 1;
      ASSERT_TRUE((*s)->put_tenant(t).ok());
    }
    (*s)->close();
  }
  json bad_text = json::parse(stored_text(dir.path(), "bad"));
  bad_text["spec"]["gpus"] = "two";
  set_stored_text(dir.path(), "bad", bad_text.dump());
  auto bad = TenantRecord::from_json(json::parse(stored_text(dir.path(), "bad")));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("spec.gpus"), std::string::npos) << bad.error().message;
  auto s = open_sqlite_store(dir.path().string());
  ASSERT_TRUE(s.ok()) << s.error().message;
  auto all = (*s)->list_tenants();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].name, "good");
  EXPECT_EQ(all[0].spec.gpus, 1);
}

// Issue 28: an endpoint's named keys and its usage per key, in the record.
TEST(TenantRecord, AnEndpointsNamedKeysAndUsageRoundTrip) {
  const json in = json::parse(R"({
    "key_sha256": "ff00", "port": 8443,
    "keys": [{"name": "ci", "sha256": "aa", "created_at": "2026-12-01T00:00:00Z", "rpm": 60,
              "future_key": 1},
             {"name": "app", "sha256": "bb", "created_at": "2026-12-01T00:00:01Z", "tpm": 20000}],
    "usage": {"total": {"ci": [3, 1, 30, 40]},
              "hourly": [{"start": 1796083200, "keys": {"ci": [3, 1, 30, 40]}}],
              "daily": []}
  })");
  auto e = EndpointState::from_json(in);
  ASSERT_TRUE(e.ok()) << e.error().message;
  ASSERT_EQ(e->keys->size(), 2u);
  EXPECT_EQ((*e->keys)[0].rpm, 60);
  EXPECT_EQ((*e->keys)[1].tpm, 20000);
  EXPECT_EQ((*e->keys)[0].extra, (json{{"future_key", 1}}));
  EXPECT_EQ(e->usage->totals_since_creation().at("ci").completion_tokens, 40u);
  EXPECT_EQ(e->to_json(), in);
  // A record without them stays without them.
  auto old = EndpointState::from_json(json{{"key_sha256", "ff00"}});
  EXPECT_FALSE(old->keys.has_value());
  EXPECT_FALSE(old->usage.has_value());
  EXPECT_EQ(old->to_json(), (json{{"key_sha256", "ff00"}}));
  // Usage that is not its shape is an error naming it.
  auto bad = EndpointState::from_json(json{{"usage", {{"total", {{"ci", {1, 2}}}}}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("usage"), std::string::npos) << bad.error().message;
}

TEST(EndpointUsage, HourlyBucketsTotalsAndFoldingIntoDays) {
  using std::chrono::hours;
  using std::chrono::system_clock;
  const auto t0 = system_clock::time_point(std::chrono::seconds(1796083200));  // on the hour
  EndpointUsage u;
  ASSERT_TRUE(u.add("default", {1, 0, 10, 20}, t0 + std::chrono::minutes(5)).ok());
  ASSERT_TRUE(u.add("default", {2, 1, 5, 5}, t0 + std::chrono::minutes(50)).ok());
  ASSERT_TRUE(u.add("ci", {4, 0, 40, 80}, t0 + hours(1)).ok());
  EXPECT_EQ(u.hourly().size(), 2u);
  auto all = u.totals(t0, t0 + hours(2));
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0], (KeyTotals{"ci", 4, 0, 40, 80}));
  EXPECT_EQ(all[1], (KeyTotals{"default", 3, 1, 15, 25}));
  // [since, until): the bucket starting at t0 + 1h is out of [t0, t0 + 1h).
  auto first = u.totals(t0, t0 + hours(1));
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].key, "default");
  // 40 days later the old hours are folded into their day, totals kept.
  ASSERT_TRUE(u.add("ci", {1, 0, 1, 1}, t0 + hours(24 * 40)).ok());
  EXPECT_EQ(u.hourly().size(), 1u);
  ASSERT_EQ(u.daily().size(), 1u);
  auto folded = u.totals(t0 - hours(24), t0 + hours(24));
  ASSERT_EQ(folded.size(), 2u);
  EXPECT_EQ(folded[1], (KeyTotals{"default", 3, 1, 15, 25}));
  EXPECT_EQ(u.totals_since_creation().at("ci").requests, 5u);
  auto again = EndpointUsage::from_json(u.to_json());
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(*again, u);
  // Bounded: no more than kMaxKeys names, whatever is reported.
  for (std::size_t i = 0; u.totals_since_creation().size() < EndpointUsage::kMaxKeys; i++)
    ASSERT_TRUE(u.add("k" + std::to_string(i), {1, 0, 0, 0}, t0 + hours(24 * 40)).ok());
  EXPECT_FALSE(u.add("one-too-many", {1, 0, 0, 0}, t0 + hours(24 * 40)).ok());
  // And days past kMaxDaily are dropped, oldest first.
  EndpointUsage years;
  for (int d = 0; d < 800; d++)
    ASSERT_TRUE(years.add("default", {1, 0, 0, 0}, t0 + hours(24 * d)).ok());
  EXPECT_LE(years.daily().size(), EndpointUsage::kMaxDaily);
  EXPECT_LE(years.hourly().size(), static_cast<std::size_t>(EndpointUsage::kHourlyDays) * 24 + 48);
  EXPECT_EQ(years.totals_since_creation().at("default").requests, 800u);
}

}  // namespace
}  // namespace factory::store
