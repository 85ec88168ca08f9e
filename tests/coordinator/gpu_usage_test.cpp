// GPU usage (coordinator/store/gpu_usage.hpp, coordinator/tenants/usage_meter.hpp,
// usage_report.hpp; docs/usage.md). The type's rules on their own, then a VM
// that runs 3,600 s in all, metered through the real stores (SQLite and
// PostgreSQL), with the coordinator killed and restarted in the middle (the
// store reopened, the meter's memory gone), a drain (the VMI stopped, then
// a new one) and a delete (the usage archived with the record). The clock is
// the provider's timestamps and the looks' times, given by the test.
#include "coordinator/store/gpu_usage.hpp"

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <optional>

#include "common/durations.hpp"
#include "coordinator/store/store.hpp"
#include "coordinator/tenants/request.hpp"
#include "coordinator/tenants/usage_meter.hpp"
#include "coordinator/tenants/usage_report.hpp"
#include "tests/support/postgres_server.hpp"
#include "tests/support/test_support.hpp"

namespace factory {
namespace {

using factory::testing::PostgresServer;
using factory::testing::TempDir;
using store::GpuUsage;
using store::UsageObservation;

constexpr std::int64_t T0 = 1796000000;  // 2026-11-29T...
const std::string kModel = "nvidia.com/GH100_H200";

UsageObservation running(std::int64_t now, const std::string& instance, std::int64_t since,
                         int gpus = 1) {
  UsageObservation o;
  o.now = now;
  o.running = true;
  o.instance = instance;
  o.gpu_model = kModel;
  o.gpus = gpus;
  o.running_since = since;
  return o;
}

UsageObservation stopped(std::int64_t now, const std::string& instance = "",
                         std::optional<std::int64_t> at = std::nullopt) {
  UsageObservation o;
  o.now = now;
  o.instance = instance;
  o.gpu_model = kModel;
  o.gpus = 1;
  o.stopped_at = at;
  return o;
}

double seconds(const GpuUsage& u, std::int64_t since = T0 - 86400 * 400,
               std::int64_t until = T0 + 86400 * 400) {
  double s = 0;
  for (const auto& [m, v] : u.gpu_seconds(since, until)) s += v;
  return s;
}

TEST(GpuUsage, AnIntervalStartsWhenTheProviderSaysAndIsKeyedByItsInstance) {
  GpuUsage u;
  EXPECT_EQ(u.observe(running(T0 + 10, "vmi-1", T0)), GpuUsage::Change::changed);
  EXPECT_EQ(u.observe(running(T0 + 25, "vmi-1", T0)), GpuUsage::Change::extended);
  EXPECT_EQ(u.observe(running(T0 + 25, "vmi-1", T0)), GpuUsage::Change::none);
  EXPECT_DOUBLE_EQ(seconds(u), 25);
  // Seen stopped, the provider saying when: closed there.
  EXPECT_EQ(u.observe(stopped(T0 + 60, "vmi-1", T0 + 50)), GpuUsage::Change::changed);
  ASSERT_EQ(u.closed().size(), 1u);
  EXPECT_EQ(u.closed()[0].end, T0 + 50);
  EXPECT_EQ(u.closed()[0].end_source, "provider");
  // A new instance; the old one's time is never counted again, even if the
  // provider's start of the new one is earlier than what was counted.
  u.observe(running(T0 + 100, "vmi-2", T0 + 40));
  EXPECT_EQ(u.open()->start, T0 + 50);
  // Replaced while nobody looked: the old one closed at its last look.
  u.observe(running(T0 + 200, "vmi-3", T0 + 180));
  ASSERT_EQ(u.closed().size(), 2u);
  EXPECT_EQ(u.closed()[1].end, T0 + 100);
  EXPECT_EQ(u.closed()[1].end_source, "last_seen");
  EXPECT_DOUBLE_EQ(seconds(u), 50 + 50 + 20);
  // A window cuts intervals: 30 s of vmi-1's, 10 s of vmi-2's.
  EXPECT_DOUBLE_EQ(seconds(u, T0 + 20, T0 + 60), 40);
}

TEST(GpuUsage, CountsEveryCardAndNothingForAVmWithoutCards) {
  GpuUsage u;
  u.observe(running(T0, "vmi-1", T0, 4));
  u.observe(running(T0 + 100, "vmi-1", T0, 4));
  EXPECT_DOUBLE_EQ(seconds(u), 400);
  GpuUsage none;
  EXPECT_EQ(none.observe(running(T0, "vmi-1", T0, 0)), GpuUsage::Change::none);
  EXPECT_FALSE(none.open());
}

TEST(GpuUsage, RoundTripsThroughJsonAndKeepsUnknownKeys) {
  GpuUsage u;
  u.observe(running(T0 + 5, "vmi-1", T0));
  u.observe(stopped(T0 + 70, "vmi-1", T0 + 60));
  u.observe(running(T0 + 100, "pid:42", T0 + 90));
  u.add_busy(T0 + 100, 12.5);
  auto j = u.to_json();
  j["from_a_newer_coordinator"] = 1;
  auto back = GpuUsage::from_json(j);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->to_json(), j);
  EXPECT_DOUBLE_EQ(seconds(*back), seconds(u));
  EXPECT_DOUBLE_EQ(back->busy_seconds_total(), 12.5);
  auto wrong = GpuUsage::from_json({{"intervals", {{{"instance", 3}}}}});
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.error().message.find("intervals[0].instance"), std::string::npos);
}

TEST(GpuUsage, StaysBoundedFoldingOldIntervalsIntoDaysWithTheSameTotal) {
  GpuUsage u;
  std::int64_t t = T0;
  for (int i = 0; i < 500; ++i) {  // 500 boots of 1,000 s, 200 s apart
    u.observe(running(t + 1, "vmi-" + std::to_string(i), t));
    u.observe(stopped(t + 1010, "vmi-" + std::to_string(i), t + 1000));
    t += 1200;
  }
  EXPECT_EQ(u.closed().size(), GpuUsage::kMaxClosedIntervals);
  EXPECT_NEAR(seconds(u), 500 * 1000, 1e-6);
  EXPECT_LT(u.to_json().dump().size(), 16000u);
  auto back = GpuUsage::from_json(u.to_json());
  ASSERT_TRUE(back.ok());
  EXPECT_NEAR(seconds(*back), 500 * 1000, 1e-6);
}

TEST(GpuUsage, ADeleteClosesAtItsTimeWhenTheLastLookIsFreshElseAtTheLook) {
  GpuUsage a, b;
  a.observe(running(T0 + 10, "vmi-1", T0));
  a.close_for_delete(T0 + 40, 60);
  EXPECT_EQ(a.closed().back().end, T0 + 40);
  EXPECT_EQ(a.closed().back().end_source, "deleted");
  b.observe(running(T0 + 10, "vmi-1", T0));
  b.close_for_delete(T0 + 4000, 60);
  EXPECT_EQ(b.closed().back().end, T0 + 10);
  EXPECT_EQ(b.closed().back().end_source, "last_seen");
}

TEST(UsageQuery, TakesRfc3339OrADurationAgoAndNamesTheBadOne) {
  auto q = tenants::usage_query("24h", "", "", "", T0);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->since, T0 - 86400);
  EXPECT_EQ(q->until, T0);
  auto d = tenants::usage_query("", "", "", "", T0);
  EXPECT_EQ(d->since, T0 - 30 * 86400);
  auto r = tenants::usage_query("2026-12-01T00:00:00Z", "2026-12-02T00:00:00Z", "", "", T0);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->until - r->since, 86400);
  auto bad = tenants::usage_query("yesterday", "", "", "", T0);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("--since"), std::string::npos);
  auto backwards = tenants::usage_query("1h", "2h", "", "", T0);
  ASSERT_FALSE(backwards.ok());
  EXPECT_NE(backwards.error().message.find("must be before"), std::string::npos);
}

// --- projects and quotas ----------------------------------------------------

store::TenantRecord holding(const std::string& name, const std::string& project, int gpus,
                            const std::string& model = kModel) {
  store::TenantRecord t;
  t.name = name;
  t.tier = "gpu-vm";
  if (!project.empty()) t.spec.project = project;
  t.spec.gpus = gpus;
  t.spec.gpu_resource = model;
  return t;
}

TEST(ProjectQuota, ACreatePastTheLimitIsRefusedWithTheNumbers) {
  const tenants::ProjectGpuQuotas quotas = {{"ml", {{kModel, 4}}}};
  const std::vector<store::TenantRecord> now = {
      holding("a", "ml", 2), holding("b", "ml", 2), holding("c", "other", 8),
      holding("d", "ml", 8, "nvidia.com/AD104GL_L4"), holding("e", "", 8)};
  auto st = tenants::check_gpu_quota(now, "t9", "ml", kModel, 1, quotas);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, Errc::failed_precondition);
  EXPECT_EQ(st.error().message.rfind("project ml: 4 of 4 nvidia.com/GH100_H200 in use; tenant t9 "
                                     "asks for 1 more",
                                     0),
            0u)
      << st.error().message;
  // Its own record is not counted (a create run again), a model or a
  // project not named has no limit, a tenant without a project is default's.
  EXPECT_TRUE(tenants::check_gpu_quota(now, "a", "ml", kModel, 2, quotas).ok());
  EXPECT_TRUE(tenants::check_gpu_quota(now, "t9", "ml", "nvidia.com/AD104GL_L4", 1, quotas).ok());
  EXPECT_TRUE(tenants::check_gpu_quota(now, "t9", "other", kModel, 1, quotas).ok());
  const tenants::ProjectGpuQuotas defaults = {{"default", {{kModel, 8}}}};
  EXPECT_FALSE(tenants::check_gpu_quota(now, "t9", "default", kModel, 1, defaults).ok());
  EXPECT_TRUE(tenants::check_gpu_quota(now, "t9", "ml", kModel, 0, quotas).ok());
}

TEST(ProjectQuota, TheRequestCarriesAProjectByTheNameGrammarDefaultDefault) {
  auto r =
      tenants::TenantRequest::from_json({{"name", "t1"}, {"tier", "gpu-vm"}, {"project", "ml"}});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->project, "ml");
  EXPECT_EQ(r->to_json()["project"], "ml");
  auto bad = tenants::TenantRequest::from_json(
      {{"name", "t1"}, {"tier", "gpu-vm"}, {"project", "ML_team"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("DNS-1123"), std::string::npos);
  tenants::VmSpec v;
  v.name = "t1";
  tenants::TenantRequest plain;
  plain.name = "t1";
  EXPECT_EQ(tenants::stored_spec(v, plain).project, "default");
  EXPECT_EQ(tenants::stored_spec(v, *r).project, "ml");
  // A create run again must ask for the same project.
  EXPECT_FALSE(tenants::same_request(tenants::stored_spec(v, plain), *r).ok());
}

// --- through the stores, with a restart, a drain and a delete ---------------

class MeteredStore : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "postgres")
      conninfo_ = PostgresServer::instance().create_database();
    else
      dir_.emplace("usage");
  }
  std::unique_ptr<store::Store> open() {
    auto s = GetParam() == "postgres" ? store::open_postgres_store(conninfo_)
                                      : store::open_sqlite_store(dir_->path().string());
    EXPECT_TRUE(s.ok()) << (s ? "" : s.error().message);
    return s ? std::move(*s) : nullptr;
  }

 private:
  std::optional<TempDir> dir_;
  std::string conninfo_;
};

INSTANTIATE_TEST_SUITE_P(Backends, MeteredStore, ::testing::Values("sqlite", "postgres"),
                         [](const auto& info) { return info.param; });

store::TenantRecord gpu_tenant(const std::string& name) {
  store::TenantRecord t;
  t.name = name;
  t.tier = "gpu-vm";
  t.phase = "ready";
  t.created_at = "2026-11-29T00:00:00Z";
  t.spec.gpus = 1;
  t.spec.gpu_resource = kModel;
  t.spec.project = "ml";
  return t;
}

// A look every 15 s from `from` to `to` (inclusive of from) at a VM as the
// provider shows it then.
void look(tenants::UsageMeter& m, std::int64_t from, std::int64_t to,
          const std::function<UsageObservation(std::int64_t)>& vm) {
  for (std::int64_t t = from; t <= to; t += 15) ASSERT_TRUE(m.fold("t1", vm(t)).ok());
}

double reported(const nlohmann::json& report, const std::string& name) {
  double s = 0;
  for (const auto& row : report["tenants"])
    if (row["name"] == name) s += row["gpu_seconds"].get<double>();
  return s;
}

TEST_P(MeteredStore, AVmRunning3600sCounts3600sAcrossAKillADrainAndADelete) {
  // The VM (VMI vmi-1) runs from T0. The coordinator looks every 15 s.
  auto vm1 = [](std::int64_t t) { return running(t, "vmi-1", T0); };
  {
    auto s = open();
    ASSERT_TRUE(s->put_tenant(gpu_tenant("t1")).ok());
    tenants::UsageMeter m(*s);
    look(m, T0 + 7, T0 + 1000, vm1);
    // kill -9: nothing more is written; what the meter held is gone.
  }
  // Down 500 s while the VM runs on; back, it finds the same VMI.
  {
    auto s = open();
    tenants::UsageMeter m(*s);
    look(m, T0 + 1500, T0 + 1995, vm1);
    // A drain stops it at T0 + 2000: the VMI Succeeded, virt-controller's
    // timestamp says when; then it is gone.
    ASSERT_TRUE(m.fold("t1", stopped(T0 + 2010, "vmi-1", T0 + 2000)).ok());
    look(m, T0 + 2025, T0 + 2595, [](std::int64_t t) { return stopped(t); });
    // Undrained: a new VMI, Running from T0 + 2600.
    look(m, T0 + 2605, T0 + 4195, [](std::int64_t t) { return running(t, "vmi-2", T0 + 2600); });
    auto mid = tenants::usage_report(s->list_tenants(), s->archived_usage(),
                                     {T0 - 3600, T0 + 4195, "", ""});
    // The open interval's last look is written once a minute.
    EXPECT_NEAR(reported(mid, "t1"), 2000 + 1595, 60);
    EXPECT_EQ(mid["tenants"][0]["project"], "ml");
    EXPECT_EQ(mid["tenants"][0]["gpu_model"], kModel);
    EXPECT_TRUE(mid["tenants"][0]["keys"].is_array());
    // Deleted at T0 + 4200: closed then, archived with the record.
    ASSERT_TRUE(m.close_for_delete("t1", T0 + 4200).ok());
    ASSERT_TRUE(s->delete_tenant("t1").ok());
  }
  auto s = open();
  EXPECT_TRUE(s->list_tenants().empty());
  auto archived = s->archived_usage();
  ASSERT_EQ(archived.size(), 1u);
  EXPECT_EQ(archived[0].project, "ml");
  auto report = tenants::usage_report(s->list_tenants(), archived, {T0 - 3600, T0 + 86400, "", ""});
  const double counted = reported(report, "t1");
  std::printf("gpu_seconds counted: %.0f of 3600 (restart, drain, delete)\n", counted);
  EXPECT_NEAR(counted, 3600, 36);  // ± 1 %
  EXPECT_EQ(report["tenants"][0]["deleted_at"].is_string(), true);
  // A window before it ran holds none of it: not listed.
  auto before = tenants::usage_report({}, archived, {T0 - 7200, T0 - 3600, "", ""});
  EXPECT_TRUE(before["tenants"].empty());
  // Filters.
  EXPECT_TRUE(
      tenants::usage_report({}, archived, {T0, T0 + 86400, "", "other"})["tenants"].empty());
  EXPECT_EQ(tenants::usage_report({}, archived, {T0, T0 + 86400, "t1", "ml"})["tenants"].size(),
            1u);
}

// A deleted model endpoint's keys' counts are archived with its delete, as
// its GPU time is, and reported for the windows they fall in.
TEST_P(MeteredStore, ADeletedEndpointsKeyCountsAreArchivedAndReported) {
  const auto at = std::chrono::system_clock::from_time_t(T0 + 100);
  {
    auto s = open();
    store::TenantRecord t = gpu_tenant("t5");
    t.tier = "model-endpoint";
    t.endpoint.emplace();
    t.endpoint->usage.emplace();
    ASSERT_TRUE(t.endpoint->usage->add("default", {4, 1, 60, 220}, at).ok());
    ASSERT_TRUE(t.endpoint->usage->add("ci", {2, 0, 10, 30}, at).ok());
    ASSERT_TRUE(s->put_tenant(t).ok());
    ASSERT_TRUE(s->delete_tenant("t5").ok());
  }
  auto s = open();
  auto archived = s->archived_usage();
  ASSERT_EQ(archived.size(), 1u);
  ASSERT_TRUE(archived[0].endpoint_usage);
  // Kept in hourly buckets: the window holds the hour of T0 + 100.
  auto report = tenants::usage_report({}, archived, {T0 - 3600, T0 + 3600, "", ""});
  ASSERT_EQ(report["tenants"].size(), 1u) << report.dump(2);
  const auto& row = report["tenants"][0];
  EXPECT_TRUE(row["deleted_at"].is_string());
  std::map<std::string, std::uint64_t> completion;
  for (const auto& k : row["keys"])
    completion[k["name"].get<std::string>()] = k["completion_tokens"].get<std::uint64_t>();
  EXPECT_EQ(completion, (std::map<std::string, std::uint64_t>{{"ci", 30}, {"default", 220}}));
  // Outside the window: nothing of it, so not listed.
  EXPECT_TRUE(
      tenants::usage_report({}, archived, {T0 + 7200, T0 + 9000, "", ""})["tenants"].empty());
}

// Gone while the coordinator was down, and the provider cannot say when
// (a QEMU process, a VMI deleted): closed at the last look written, which is
// at most a write period before the coordinator went down.
TEST_P(MeteredStore, AVmGoneWhileTheCoordinatorWasDownIsClosedAtItsLastLookWritten) {
  {
    auto s = open();
    ASSERT_TRUE(s->put_tenant(gpu_tenant("t1")).ok());
    tenants::UsageMeter m(*s);
    look(m, T0 + 7, T0 + 1000, [](std::int64_t t) { return running(t, "pid:77", T0); });
  }
  // It stopped at T0 + 1200 while nobody looked.
  auto s = open();
  tenants::UsageMeter m(*s);
  ASSERT_TRUE(m.fold("t1", stopped(T0 + 1500)).ok());
  auto u = s->get_tenant("t1")->status.gpu_usage;
  ASSERT_TRUE(u);
  ASSERT_EQ(u->closed().size(), 1u);
  EXPECT_EQ(u->closed()[0].end_source, "last_seen");
  EXPECT_GE(seconds(*u), 1000 - tenants::UsageMeterOptions{}.write_every);
  EXPECT_LE(seconds(*u), 1000);
}

// Gone between two looks of a running coordinator, no stop time given: closed
// at the latest look that saw it, written or not.
TEST_P(MeteredStore, AVmGoneBetweenLooksIsClosedAtTheLatestLookNotTheLatestWrite) {
  auto s = open();
  ASSERT_TRUE(s->put_tenant(gpu_tenant("t1")).ok());
  tenants::UsageMeter m(*s);
  look(m, T0 + 7, T0 + 97, [](std::int64_t t) { return running(t, "pid:9", T0); });
  ASSERT_TRUE(m.fold("t1", stopped(T0 + 112)).ok());
  auto u = s->get_tenant("t1")->status.gpu_usage;
  ASSERT_EQ(u->closed().size(), 1u);
  EXPECT_EQ(u->closed()[0].end, T0 + 97);
  EXPECT_EQ(u->closed()[0].end_source, "last_seen");
}

TEST_P(MeteredStore, WritesAreCoalescedAndBusyTimeIsCreditedOnlyFromFreshSamples) {
  auto s = open();
  ASSERT_TRUE(s->put_tenant(gpu_tenant("t1")).ok());
  proto::HealthSample h;
  proto::GpuSample g;
  g.utilization_percent = 50;
  h.gpu.gpus = {g, g};  // two cards at 50 %: one busy GPU
  const auto at = [](std::int64_t t) { return format_rfc3339(Clock::from_time_t(t)); };
  tenants::UsageMeter m(*s);
  const auto before = s->stats().transactions;
  // 10 minutes of looks, a fresh sample at each.
  for (std::int64_t t = T0; t <= T0 + 600; t += 15) {
    s->put_health("t1", std::make_shared<const store::LatestHealth>(store::LatestHealth{h, at(t)}));
    ASSERT_TRUE(m.fold("t1", running(t, "vmi-1", T0, 2)).ok());
  }
  // Not one write per look (41 looks): the opening, then one a minute.
  EXPECT_LE(s->stats().transactions - before, 15u);
  auto u = s->get_tenant("t1")->status.gpu_usage;
  EXPECT_NEAR(u->busy_seconds_total(), 600 - 60, 61);  // the last minute may be unwritten
  // The guest goes quiet: its last sample (T0 + 600) speaks for 90 s more
  // (sample_fresh), then nothing more is credited.
  for (std::int64_t t = T0 + 615; t <= T0 + 1200; t += 15)
    ASSERT_TRUE(m.fold("t1", running(t, "vmi-1", T0, 2)).ok());
  EXPECT_NEAR(s->get_tenant("t1")->status.gpu_usage->busy_seconds_total(), 690, 0.5);
}

}  // namespace
}  // namespace factory
