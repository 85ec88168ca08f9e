// The coordinator's decoders of agent messages (coordinator/agents/messages.hpp),
// the projection that sees only what they kept, and the per-tenant quotas
// (coordinator/agents/quota.hpp): what a hostile guest sends is typed,
// bounded, dropped field by field and counted, never kept.
#include <gtest/gtest.h>

#include "coordinator/agents/messages.hpp"
#include "coordinator/agents/projection.hpp"
#include "coordinator/agents/quota.hpp"

namespace factory::coordinator {
namespace {

using nlohmann::json;

const std::string kEscapes = "\x1b[2J\x1b]0;owned\x07\r\n";

std::vector<std::string> reasons_of(const Rejections& r) {
  std::vector<std::string> out;
  for (const auto& x : r) out.push_back(x.field + ":" + reason_name(x.reason));
  return out;
}

bool rejected(const Rejections& r, const std::string& field, RejectReason why) {
  for (const auto& x : r)
    if (x.field == field && x.reason == why) return true;
  return false;
}

TEST(AgentMessages, HelloKeepsWellFormedNamesAndDropsTheRest) {
  auto ok = decode_hello(
      {{"agent_id", "0123abcd0123abcd"}, {"agent_version", "0.1.0"}, {"hostname", "tenant-1"}});
  ASSERT_TRUE(ok.value);
  EXPECT_TRUE(ok.rejected.empty()) << ::testing::PrintToString(reasons_of(ok.rejected));
  EXPECT_EQ(ok.value->hostname, "tenant-1");
  EXPECT_EQ(ok.value->agent_version, "0.1.0");

  auto bad = decode_hello({{"agent_version", "0.1\x1b[2J" + kEscapes},
                           {"hostname", "evil\r\nhost"},
                           {"agent_id", 42},
                           {"shell", "rm -rf /"}});
  ASSERT_TRUE(bad.value) << "a hello with bad fields still says hello";
  EXPECT_EQ(bad.value->agent_version, "");
  EXPECT_EQ(bad.value->hostname, "");
  EXPECT_EQ(bad.value->agent_id, "");
  EXPECT_TRUE(rejected(bad.rejected, "agent_version", RejectReason::bad_format));
  EXPECT_TRUE(rejected(bad.rejected, "hostname", RejectReason::bad_format));
  EXPECT_TRUE(rejected(bad.rejected, "agent_id", RejectReason::wrong_type));
  EXPECT_TRUE(rejected(bad.rejected, "shell", RejectReason::unknown_field));

  auto long_host = decode_hello({{"hostname", std::string(300, 'a')}});
  EXPECT_TRUE(rejected(long_host.rejected, "hostname", RejectReason::too_long));
  auto long_label = decode_hello({{"hostname", std::string(64, 'a') + ".example"}});
  EXPECT_TRUE(rejected(long_label.rejected, "hostname", RejectReason::bad_format));
  auto claim = decode_hello({{"tenant", "other"}});
  ASSERT_TRUE(claim.value->tenant);
  EXPECT_EQ(*claim.value->tenant, "other") << "kept, to be compared with the certificate";
}

TEST(AgentMessages, HeartbeatCountsAreRangeChecked) {
  auto hb = decode_heartbeat({{"pending_events", 3},
                              {"dropped_events", -1},
                              {"steps_done", 5000},
                              {"steps_total", "7"},
                              {"plan_hash", "zz"},
                              {"plan_state", "running"}});
  ASSERT_TRUE(hb.value);
  EXPECT_EQ(hb.value->pending_events, 3u);
  EXPECT_EQ(hb.value->dropped_events, 0u);
  EXPECT_FALSE(hb.value->steps_done);
  EXPECT_FALSE(hb.value->steps_total);
  EXPECT_FALSE(hb.value->plan_hash);
  EXPECT_EQ(hb.value->plan_state, "running");
  EXPECT_TRUE(rejected(hb.rejected, "dropped_events", RejectReason::out_of_range));
  EXPECT_TRUE(rejected(hb.rejected, "steps_done", RejectReason::out_of_range));
  EXPECT_TRUE(rejected(hb.rejected, "steps_total", RejectReason::wrong_type));
  EXPECT_TRUE(rejected(hb.rejected, "plan_hash", RejectReason::bad_format));
}

TEST(AgentMessages, EnrollAndRenewNeedTheirFieldsWithinLimits) {
  auto e = decode_enroll({{"token", "abc.def"}, {"csr", "PEM"}, {"hostname", "h\x1b"}});
  ASSERT_TRUE(e.value);
  EXPECT_EQ(e.value->hostname, "");
  EXPECT_TRUE(rejected(e.rejected, "hostname", RejectReason::bad_format));
  auto no_token = decode_enroll({{"csr", "PEM"}});
  EXPECT_FALSE(no_token.value);
  EXPECT_NE(no_token.refusal.find("enroll needs 'token'"), std::string::npos);
  EXPECT_TRUE(rejected(no_token.rejected, "token", RejectReason::missing));
  auto huge = decode_enroll({{"token", std::string(1000, 'x')}, {"csr", "PEM"}});
  EXPECT_FALSE(huge.value);
  EXPECT_TRUE(rejected(huge.rejected, "token", RejectReason::too_long));
  EXPECT_FALSE(decode_renew({{"csr", 5}}).value);
  EXPECT_TRUE(decode_renew({{"csr", "PEM"}}).value);
}

TEST(AgentMessages, AnEventNeedsAnIdAndAKind) {
  for (const json& body :
       {json::object(), json{{"id", 0}, {"kind", "log"}}, json{{"id", -3}, {"kind", "log"}},
        json{{"id", "7"}, {"kind", "log"}}, json{{"id", 7}}, json{{"id", 7}, {"kind", 9}},
        json{{"id", 7}, {"kind", "bad kind\x1b"}}, json::array()}) {
    auto d = decode_event(body);
    EXPECT_FALSE(d.value) << body.dump();
    EXPECT_FALSE(d.refusal.empty());
    EXPECT_FALSE(d.rejected.empty()) << body.dump();
  }
}

TEST(AgentMessages, TheGuestClustersRangesAreTypedAndEveryRangeMustRead) {
  json ranges = {{"cluster-cidr", "10.54.0.0/16"},
                 {"service-cidr", "10.55.0.0/16"},
                 {"cluster-dns", "10.55.0.10"},
                 {"around",
                  {{{"range", "10.52.0.0/24"}, {"source", "host node utho spec.podCIDRs"}},
                   {{"range", "fd00:10:43::a"}, {"source", "guest DNS server"}}}}};
  json body = {{"id", 3}, {"kind", "progress"}, {"step", "rke2"}, {"ranges", ranges}};
  auto d = decode_event(body);
  ASSERT_TRUE(d.value) << d.refusal;
  EXPECT_TRUE(d.rejected.empty()) << ::testing::PrintToString(reasons_of(d.rejected));
  EXPECT_EQ(d.value->to_json(), body);

  json bad = ranges;
  bad["cluster-cidr"] = "10.54.0.0/33";
  bad["around"][0]["range"] = "\x1b[2J";
  bad["around"][1]["owner"] = "someone";
  bad["extra"] = 1;
  auto h = decode_event({{"id", 4}, {"kind", "progress"}, {"step", "rke2"}, {"ranges", bad}});
  ASSERT_TRUE(h.value);
  EXPECT_FALSE(h.value->to_json().contains("ranges")) << "a report with a bad range is not shown";
  EXPECT_TRUE(rejected(h.rejected, "ranges.cluster-cidr", RejectReason::bad_format));
  EXPECT_TRUE(rejected(h.rejected, "ranges.around.range", RejectReason::bad_format));
  EXPECT_TRUE(rejected(h.rejected, "ranges.around.owner", RejectReason::unknown_field));
  EXPECT_TRUE(rejected(h.rejected, "ranges.extra", RejectReason::unknown_field));
  auto m = decode_event({{"id", 5},
                         {"kind", "progress"},
                         {"step", "rke2"},
                         {"ranges", {{"cluster-dns", "1.2.3.4"}}}});
  EXPECT_TRUE(rejected(m.rejected, "ranges.cluster-cidr", RejectReason::missing));
}

TEST(AgentMessages, ProgressEventsAreTypedAndBounded) {
  json body = {{"id", 12},
               {"kind", "progress"},
               {"time", "2026-12-01T10:00:00Z"},
               {"plan_hash", "abcdef0123"},
               {"step", "ollama-model"},
               {"state", "progress"},
               {"attempt", 1},
               {"percent", 42},
               {"completed", 10},
               {"total", 20},
               {"message", "pulling " + kEscapes},
               {"diagnosis", {{"code", "gpu_missing"}, {"summary", "no GPU"}, {"fix", "pass it"}}}};
  auto d = decode_event(body);
  ASSERT_TRUE(d.value) << d.refusal;
  EXPECT_TRUE(d.rejected.empty()) << ::testing::PrintToString(reasons_of(d.rejected));
  // Free text keeps its bytes (it is escaped where it is shown); the stored
  // form is exactly what was decoded.
  EXPECT_EQ(d.value->to_json(), body);

  json hostile = {{"id", 13},
                  {"kind", "progress"},
                  {"time", "yesterday"},
                  {"step", "gpu\x1b[2J"},
                  {"state", "pwned"},
                  {"percent", 1e300},
                  {"attempt", 4294967297.5},
                  {"message", std::string(100000, 'x')},
                  {"diagnosis", {{"code", "ok"}, {"summary", json::array()}, {"extra", 1}}},
                  {"tenant", "other-tenant"}};
  auto h = decode_event(hostile);
  ASSERT_TRUE(h.value) << "the id and kind are good: stored, without the bad fields";
  json kept = h.value->to_json();
  EXPECT_EQ(kept, (json{{"id", 13}, {"kind", "progress"}})) << kept.dump();
  for (auto [f, r] : std::vector<std::pair<std::string, RejectReason>>{
           {"time", RejectReason::bad_format},
           {"step", RejectReason::bad_format},
           {"state", RejectReason::unknown_value},
           {"percent", RejectReason::out_of_range},
           {"attempt", RejectReason::wrong_type},
           {"message", RejectReason::too_long},
           {"diagnosis.summary", RejectReason::wrong_type},
           {"diagnosis.extra", RejectReason::unknown_field},
           {"tenant", RejectReason::unknown_field}})
    EXPECT_TRUE(rejected(h.rejected, f, r))
        << f << " in " << ::testing::PrintToString(reasons_of(h.rejected));
}

TEST(AgentMessages, PlanLogAndDiagnosisEvents) {
  auto plan = decode_event({{"id", 1},
                            {"kind", "plan"},
                            {"plan_hash", "ab"},
                            {"tier", "gpu-vm"},
                            {"state", "succeeded"},
                            {"steps_total", 3},
                            {"steps_done", 3}});
  ASSERT_TRUE(plan.value);
  EXPECT_TRUE(plan.rejected.empty());
  ASSERT_TRUE(std::holds_alternative<PlanEvent>(plan.value->body));

  auto log = decode_event({{"id", 2}, {"kind", "log"}, {"level", "loud"}, {"message", "hi"}});
  ASSERT_TRUE(log.value);
  EXPECT_TRUE(rejected(log.rejected, "level", RejectReason::unknown_value));
  EXPECT_EQ(log.value->to_json(), (json{{"id", 2}, {"kind", "log"}, {"message", "hi"}}));

  auto diag = decode_event({{"id", 3},
                            {"kind", "diagnosis"},
                            {"code", "dns_clash"},
                            {"summary", "s"},
                            {"fix", "f"},
                            {"details", {{"cidr", "10.43.0.0/16"}}},
                            {"junk", true}});
  ASSERT_TRUE(diag.value);
  EXPECT_TRUE(rejected(diag.rejected, "junk", RejectReason::unknown_field));
  ASSERT_TRUE(std::holds_alternative<DiagnosisEvent>(diag.value->body));
  EXPECT_EQ(std::get<DiagnosisEvent>(diag.value->body).diagnosis.details["cidr"], "10.43.0.0/16");
}

TEST(AgentMessages, FreeFormJsonIsBoundedInDepthWidthAndStrings) {
  json deep = "leaf";
  for (int i = 0; i < 20; ++i) deep = json{{"d", deep}};
  json wide = json::array();
  for (int i = 0; i < 500; ++i) wide.push_back(i);
  auto h = decode_event({{"id", 5},
                         {"kind", "health"},
                         {"gpu", {{"gpus", json::array({"not-an-object", {{"name", "L4"}}})}}},
                         {"deep", deep},
                         {"wide", wide},
                         {"big", std::string(10000, 'b')},
                         {"bad key\x1b", 1}});
  ASSERT_TRUE(h.value);
  json kept = h.value->to_json();
  EXPECT_EQ(kept["gpu"]["gpus"][0], "not-an-object") << "shape is the printer's business";
  EXPECT_EQ(kept["wide"].size(), limits::kItems);
  EXPECT_FALSE(kept.contains("big"));
  EXPECT_TRUE(rejected(h.rejected, "big", RejectReason::too_long));
  EXPECT_TRUE(rejected(h.rejected, "wide", RejectReason::too_many));
  EXPECT_TRUE(rejected(h.rejected, "(key)", RejectReason::bad_format));
  int depth = 0;
  for (const json* at = &kept["deep"]; at->is_object() && at->contains("d"); at = &(*at)["d"])
    ++depth;
  EXPECT_LT(depth, limits::kDepth);
  // A kind this coordinator does not know is kept the same way.
  auto other = decode_event({{"id", 6}, {"kind", "synthetic"}, {"n", 6}});
  ASSERT_TRUE(other.value);
  EXPECT_EQ(other.value->to_json(), (json{{"id", 6}, {"kind", "synthetic"}, {"n", 6}}));
}

TEST(AgentMessages, RejectionsPerMessageAreCappedButCountedInFull) {
  json body = {{"id", 1}, {"kind", "plan"}};
  for (int i = 0; i < 5000; ++i) body["k" + std::to_string(i)] = i;
  auto d = decode_event(body);
  ASSERT_TRUE(d.value);
  // The list a log line is made from stays short; the metric counts every one.
  EXPECT_EQ(d.rejected.kept().size(), Rejections::kKept);
  EXPECT_EQ(d.rejected.count(RejectReason::unknown_field), 5000u);
  EXPECT_EQ(d.rejected.total(), 5000u);
}

TEST(AgentProjection, SeesOnlyDecodedFieldsAndStaysBounded) {
  store::TenantRecord t;
  t.phase = "enrolled";
  auto ev = decode_event({{"id", 1},
                          {"kind", "progress"},
                          {"step", "s1"},
                          {"state", "started"},
                          {"message", "m"},
                          {"evil", "x"}});
  ASSERT_TRUE(ev.value);
  EXPECT_TRUE(project_event(t, *ev.value));
  EXPECT_EQ(t.phase, "provisioning");
  EXPECT_EQ(t.status.to_json()["plan"]["steps"]["s1"],
            (json{{"state", "started"}, {"message", "m"}}));
  for (std::size_t i = 0; i < kMaxProjectedSteps + 50; ++i) {
    auto e = decode_event({{"id", 2 + i}, {"kind", "progress"}, {"step", "x" + std::to_string(i)}});
    project_event(t, *e.value);
  }
  EXPECT_EQ(t.status.to_json()["plan"]["steps"].size(), kMaxProjectedSteps);
  auto done = decode_event({{"id", 999}, {"kind", "plan"}, {"state", "succeeded"}});
  EXPECT_TRUE(project_event(t, *done.value));
  EXPECT_EQ(t.phase, "ready");
}

// Issue 23, point 3: fifty step ids with 15 KB tails made a record of
// 750 KB, rewritten and copied on every event. A step keeps the last 4 KiB
// of its output; the event in the history keeps the whole tail.
TEST(StatusProjection, AStepKeepsTheLastBytesOfItsOutputOnACharacter) {
  store::TenantRecord t;
  t.name = "t1";
  // 4,098 bytes: the cut falls between the two bytes of the é.
  std::string tail = "x\xc3\xa9" + std::string(kProjectedTailBytes - 4, 'a') + "END";
  auto e = decode_event({{"id", 1}, {"kind", "progress"}, {"step", "s"}, {"output_tail", tail}});
  ASSERT_TRUE(e.value);
  ASSERT_EQ(*std::get<ProgressEvent>(e.value->body).output_tail, tail) << "decoded whole";
  EXPECT_TRUE(project_event(t, *e.value));
  const std::string kept = t.status.to_json()["plan"]["steps"]["s"]["output_tail"];
  EXPECT_EQ(kept.size(), kProjectedTailBytes - 1);
  EXPECT_EQ(kept.substr(kept.size() - 3), "END");
  EXPECT_NE(static_cast<unsigned char>(kept[0]) & 0xC0, 0x80) << "never half a character";
  EXPECT_EQ(last_bytes("short"), "short");
  EXPECT_EQ(last_bytes("\xc3\xa9xyz", 4), "xyz") << "the é would be cut: left out whole";
}

TEST(TenantQuotas, EventsPerSecondWithABurst) {
  QuotaOptions o;
  o.events_per_second = 10;
  o.event_burst = 20;
  TenantQuotas q(o);
  auto t0 = TenantQuotas::Clock::now();
  for (int i = 0; i < 20; ++i) EXPECT_FALSE(q.admit("t1", 0, t0)) << i;
  auto no = q.admit("t1", 0, t0);
  ASSERT_TRUE(no);
  EXPECT_EQ(no->quota, "events_per_second");
  EXPECT_GE(no->retry_after, std::chrono::seconds(1));
  EXPECT_NE(no->message.find("over quota"), std::string::npos) << no->message;
  // Others are unaffected.
  EXPECT_FALSE(q.admit("t2", 0, t0));
  // Throttled until the retry time, even at hello.
  EXPECT_TRUE(q.throttled("t1", t0 + std::chrono::milliseconds(100)));
  auto later = t0 + no->retry_after;
  EXPECT_FALSE(q.throttled("t1", later));
  EXPECT_FALSE(q.admit("t1", 0, later));
}

TEST(TenantQuotas, BytesPerDayIsADaysAllowanceRefilledOverTheDay) {
  QuotaOptions o;
  o.bytes_per_day = 1 << 20;
  TenantQuotas q(o);
  auto t0 = TenantQuotas::Clock::now();
  for (int i = 0; i < 16; ++i) EXPECT_FALSE(q.admit("t1", 64 * 1024, t0)) << i;
  auto no = q.admit("t1", 64 * 1024, t0);
  ASSERT_TRUE(no);
  EXPECT_EQ(no->quota, "bytes_per_day");
  // One 64 KiB event's worth comes back in 64Ki / (1Mi / 86400 s) = 5400 s.
  EXPECT_GE(no->retry_after, std::chrono::seconds(5400));
  EXPECT_LE(no->retry_after, std::chrono::seconds(5401));
  EXPECT_TRUE(q.admit("t1", 100, t0 + std::chrono::seconds(10))) << "still throttled";
  EXPECT_FALSE(q.admit("t1", 64 * 1024, t0 + std::chrono::seconds(5402)));
  EXPECT_FALSE(q.admit("t2", 64 * 1024, t0));
  q.forget("t1");
  EXPECT_FALSE(q.admit("t1", 64 * 1024, t0 + std::chrono::seconds(5403)));
}

// An agent's report of its upgrade: read by the contract's decoder, kept
// only for the order its own tenant's journal holds.
store::TenantRecord upgrading(const std::string& id, const std::string& state) {
  store::TenantRecord t;
  t.name = "t1";
  store::AgentUpgradeJournal j;
  j.state = state;
  j.upgrade_id = id;
  j.from_version = "0.1.0";
  j.to_version = "0.2.0";
  t.status.agent_upgrade = j;
  return t;
}

AgentEvent upgrade_event(const json& fields) {
  json body = {{"id", 7}, {"kind", "agent_upgrade"}};
  for (auto& [k, v] : fields.items()) body[k] = v;
  auto d = decode_event(body);
  EXPECT_TRUE(d.value) << d.refusal;
  return d.value ? *d.value : AgentEvent{};
}

TEST(AgentUpgradeEvents, ARollbackIsKeptWithItsReasonForTheOrderTheJournalHolds) {
  auto ev = upgrade_event({{"upgrade_id", "up-1-0"},
                           {"state", "rolled_back"},
                           {"from_version", "0.1.0"},
                           {"to_version", "0.2.0"},
                           {"reason", "no health report within 120 s"}});
  ASSERT_TRUE(std::holds_alternative<AgentUpgradeReport>(ev.body));
  EXPECT_EQ(ev.to_json()["state"], "rolled_back");
  EXPECT_EQ(ev.to_json()["kind"], "agent_upgrade");
  auto t = upgrading("up-1-0", "sent");
  EXPECT_TRUE(project_event(t, ev));
  EXPECT_EQ(t.status.agent_upgrade->state, "rolled_back");
  EXPECT_EQ(t.status.agent_upgrade->reason, "no health report within 120 s");
  EXPECT_TRUE(t.status.agent_upgrade->done_at);
  // Its outcome is its outcome: a second word on it changes nothing.
  EXPECT_FALSE(project_event(t, upgrade_event({{"upgrade_id", "up-1-0"}, {"state", "upgraded"}})));
  EXPECT_EQ(t.status.agent_upgrade->state, "rolled_back");
}

TEST(AgentUpgradeEvents, AnotherUpgradeIdChangesNothing) {
  auto t = upgrading("up-1-0", "sent");
  const auto before = t;
  EXPECT_FALSE(project_event(t, upgrade_event({{"upgrade_id", "up-1-1"}, {"state", "refused"}})));
  EXPECT_EQ(t, before);
  store::TenantRecord none;
  none.name = "t2";
  EXPECT_FALSE(
      project_event(none, upgrade_event({{"upgrade_id", "up-1-0"}, {"state", "upgraded"}})));
  EXPECT_FALSE(none.status.agent_upgrade);
}

TEST(AgentUpgradeEvents, InstallingThenUpgradedAndAnUpgradeToAnotherVersionFails) {
  auto t = upgrading("up-1-0", "sent");
  EXPECT_TRUE(project_event(t, upgrade_event({{"upgrade_id", "up-1-0"}, {"state", "installing"}})));
  EXPECT_EQ(t.status.agent_upgrade->state, "installing");
  EXPECT_TRUE(project_event(
      t,
      upgrade_event({{"upgrade_id", "up-1-0"}, {"state", "upgraded"}, {"to_version", "0.2.0"}})));
  EXPECT_EQ(t.status.agent_upgrade->state, "upgraded");
  auto u = upgrading("up-1-0", "installing");
  EXPECT_TRUE(project_event(
      u, upgrade_event({{"upgrade_id", "up-1-0"}, {"state", "upgraded"}, {"to_version", "9.9"}})));
  EXPECT_EQ(u.status.agent_upgrade->state, "failed");
  EXPECT_NE(u.status.agent_upgrade->reason->find("9.9"), std::string::npos);
}

TEST(AgentUpgradeEvents, AReasonWithEscapesIsRejectedAndStoredAsIdAndKindOnly) {
  auto d = decode_event({{"id", 8},
                         {"kind", "agent_upgrade"},
                         {"upgrade_id", "up-1-0"},
                         {"state", "rolled_back"},
                         {"reason", kEscapes}});
  ASSERT_TRUE(d.value) << d.refusal;
  EXPECT_TRUE(std::holds_alternative<std::monostate>(d.value->body));
  EXPECT_EQ(::testing::PrintToString(reasons_of(d.rejected)), "{ \"reason:bad_format\" }");
  EXPECT_EQ(d.value->to_json(), json({{"id", 8}, {"kind", "agent_upgrade"}}));
  auto t = upgrading("up-1-0", "sent");
  EXPECT_FALSE(project_event(t, *d.value));
}

// Issue 28: an endpoint_usage event is read by the contract's reader (the
// key by its grammar, each count bounded) and counted only under a key of
// the sender's own tenant.
TEST(EndpointUsageEvents, AreBoundedAndCountedOnlyUnderTheTenantsOwnKeys) {
  auto decode = [](const json& fields) {
    json body = {{"id", 9}, {"kind", "endpoint_usage"}};
    for (auto& [k, v] : fields.items()) body[k] = v;
    return decode_event(body);
  };
  const json good = {{"key", "ci"},
                     {"requests", 4},
                     {"errors", 1},
                     {"prompt_tokens", 40},
                     {"completion_tokens", 90}};
  auto d = decode(good);
  ASSERT_TRUE(d.value) << d.refusal;
  ASSERT_TRUE(std::holds_alternative<EndpointUsageReport>(d.value->body));
  EXPECT_TRUE(d.rejected.empty());
  EXPECT_EQ(d.value->to_json()["prompt_tokens"], 40);
  EXPECT_EQ(d.value->to_json()["kind"], "endpoint_usage");

  // Each bad field: stored as id and kind only, the reason counted.
  struct Bad {
    json fields;
    std::string field;
    RejectReason why;
  };
  for (const auto& b : std::vector<Bad>{
           {{{"key", "Bad Key" + kEscapes}}, "key", RejectReason::bad_format},
           {{{"key", std::string(200, 'a')}}, "key", RejectReason::too_long},
           {{{"requests", -1}}, "requests", RejectReason::out_of_range},
           {{{"prompt_tokens", std::uint64_t{1000000000000000}}},
            "prompt_tokens",
            RejectReason::out_of_range},
           {{{"completion_tokens", "9"}}, "completion_tokens", RejectReason::wrong_type},
           {{{"errors", 5}}, "errors", RejectReason::out_of_range},  // more errors than requests
           {{{"extra", 1}}, "extra", RejectReason::unknown_field},
       }) {
    json f = good;
    for (auto& [k, v] : b.fields.items()) f[k] = v;
    auto bad = decode(f);
    ASSERT_TRUE(bad.value) << bad.refusal;
    EXPECT_TRUE(rejected(bad.rejected, b.field, b.why))
        << b.fields.dump() << ": " << ::testing::PrintToString(reasons_of(bad.rejected));
    if (b.field != "extra") {
      EXPECT_TRUE(std::holds_alternative<std::monostate>(bad.value->body)) << b.fields.dump();
    }
  }
  json missing = good;
  missing.erase("completion_tokens");
  auto m = decode(missing);
  EXPECT_TRUE(rejected(m.rejected, "completion_tokens", RejectReason::missing));

  // The projection: only under default, a named key of the tenant's, or one
  // it had; never into a tenant without an endpoint.
  store::TenantRecord t;
  t.name = "t5";
  EXPECT_FALSE(project_event(t, *d.value)) << "no endpoint";
  t.endpoint.emplace();
  EXPECT_FALSE(project_event(t, *d.value)) << "no key named ci";
  store::EndpointKey ci;
  ci.name = "ci";
  ci.sha256 = std::string(64, 'a');
  t.endpoint->keys = std::vector<store::EndpointKey>{ci};
  EXPECT_TRUE(project_event(t, *d.value));
  EXPECT_TRUE(project_event(t, *d.value)) << "a second event counts again (the store dedups by id)";
  auto totals = t.endpoint->usage->totals_since_creation();
  EXPECT_EQ(totals.at("ci").requests, 8u);
  EXPECT_EQ(totals.at("ci").completion_tokens, 180u);
  json def = good;
  def["key"] = "default";
  EXPECT_TRUE(project_event(t, *decode(def).value));
  // Revoked since: its name is in the usage, so its last report still counts.
  t.endpoint->keys->clear();
  EXPECT_TRUE(project_event(t, *d.value));
  EXPECT_TRUE(endpoint_key_known(t, "ci"));
  EXPECT_TRUE(endpoint_key_known(t, "default"));
  EXPECT_FALSE(endpoint_key_known(t, "someone-elses"));
  json other = good;
  other["key"] = "someone-elses";
  EXPECT_FALSE(project_event(t, *decode(other).value));
  EXPECT_FALSE(t.endpoint->usage->totals_since_creation().contains("someone-elses"));
}

}  // namespace
}  // namespace factory::coordinator
