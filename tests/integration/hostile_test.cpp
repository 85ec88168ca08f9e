// Issue 10: the tenant is not trusted. A client of our own speaks for an
// enrolled agent (what a customer with root in its VM can do with the
// agent's key) and sends what a hostile or broken guest would: terminal
// escapes in every string, wrong types, shapes no printer expects, floods.
// The real `factory serve` must keep none of it raw, print none of it raw,
// count what it dropped, throttle the flood, and serve every other tenant as
// before. docs/threat-model.md names these tests.
#include <gtest/gtest.h>

#include <set>
#include <sstream>
#include <thread>

#include "common/net/http_client.hpp"
#include "common/yaml_json.hpp"
#include "tests/integration/own_agent.hpp"

using namespace factory::testing;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

// ESC [2J clears the screen, OSC 0 retitles the terminal, the bidi override
// reverses what follows, CR LF forges a new line, and U+009B is an 8-bit CSI.
const std::string kEvil =
    "\x1b[2J\x1b]0;owned\x07\r\nfake line \xe2\x80\xae"
    "gnp.exe \xc2\x9b"
    "31m\x7f";

AgentOptions named(const std::string& name, std::vector<std::string> extra = {}) {
  AgentOptions o;
  o.state_dir_name = name;
  o.extra_args = std::move(extra);
  return o;
}

struct Http {
  int status = 0;
  std::string body;
};

Http api(CoordinatorHarness& h, const std::string& method, const std::string& path,
         const std::string& body = "", bool with_token = true) {
  factory::net::HttpClient c({.ca_pem = slurp(h.state_dir() / "ca.crt")});
  factory::net::HttpRequest req;
  req.method = method;
  req.url = "https://127.0.0.1:" + std::to_string(h.api_port()) + path;
  req.body = body;
  if (!body.empty()) req.headers["Content-Type"] = "application/json";
  if (with_token) req.headers["Authorization"] = "Bearer " + h.admin_token();
  auto r = c.request(req);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? Http{r->status, r->body} : Http{};
}

std::uint64_t metric(const std::string& text, const std::string& series) {
  auto at = text.find("\n" + series + " ");
  if (at == std::string::npos) return 0;
  return std::stoull(text.substr(at + series.size() + 2));
}

std::size_t count(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (auto at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// promtool accepts it: nothing it cannot parse, no lint but the ones it also
// raises on dcgm-exporter's own names (promtool_complaints says which).
void expect_promtool_valid(const std::string& text) {
  EXPECT_EQ(promtool_complaints(text), "") << text;
}

}  // namespace

TEST(Hostile, EscapesAndBadShapesFromAGuestNeverReachTheAdminRaw) {
  TempDir dir("hostile");
  CoordinatorHarness h(dir.path());
  h.start();
  // A well-behaved tenant beside the hostile one.
  AgentProcess good(h, h.create_token("good"), named("good"));
  ASSERT_TRUE(eventually([&] { return h.agent_connected("good"); }, 10s)) << good.log();

  OwnAgent evil(h, "evil", {{"hostname", "host" + kEvil}, {"agent_version", "0.1" + kEvil}});
  ASSERT_TRUE(evil.enrolled());
  auto s = evil.session(
      {{"agent_version", kEvil}, {"hostname", kEvil + ".example"}, {"agent_id", "zz" + kEvil}});
  ASSERT_TRUE(s) << ::testing::PrintToString(evil.errors());

  const json diagnosis = {{"code", "gpu_not_on_pci_bus"}, {"summary", kEvil}, {"fix", kEvil}};
  const std::vector<json> events = {
      {{"id", 1},
       {"kind", "progress"},
       {"step", "gpu-present"},
       {"state", "failed"},
       {"message", "step says " + kEvil},
       {"output_tail", kEvil + "\nmore " + kEvil},
       {"diagnosis", diagnosis},
       // An agent changes only its own tenant: this is an unknown field.
       {"tenant", "good"}},
      {{"id", 2},
       {"kind", "plan"},
       {"state", "failed"},
       {"failed_step", "gpu-present"},
       {"tier", "gpu" + kEvil},
       {"message", kEvil},
       {"steps_total", 3},
       {"steps_done", "one"}},
      {{"id", 3}, {"kind", "diagnosis"}, {"code", "dns" + kEvil}, {"summary", kEvil}},
      {{"id", 4}, {"kind", "diagnosis"}, {"code", "dns_clash"}, {"summary", kEvil}, {"fix", kEvil}},
      // The health report that made `factory status` exit 70.
      {{"id", 5},
       {"kind", "health"},
       {"gpu",
        {{"gpus", json::array({"not-an-object", {{"name", kEvil}, {"memory_total_mib", "x"}}})},
         {"driver_version", kEvil}}},
       {"ollama", {{"models", json::array({{{"name", kEvil}, {"gpu_percent", "lots"}}, 7})}}},
       {"k8s", {{"allocatable", 1e300}, {"resource", kEvil}}}},
      {{"id", 6}, {"kind", "log"}, {"level", "error"}, {"message", kEvil}},
      // Wrong types: refused whole (id) or stored without the bad fields.
      {{"id", "7"}, {"kind", "progress"}},
      {{"id", 8}, {"kind", json::array({"x"})}},
      {{"id", 9}, {"kind", "progress"}, {"step", 5}, {"state", json::array({kEvil})}},
      {{"id", 10}, {"kind", kEvil}},
  };
  for (const auto& e : events) ASSERT_TRUE(evil.send(*s, "event", e));
  ASSERT_TRUE(
      evil.send(*s, "heartbeat",
                {{"pending_events", "many"}, {"dropped_events", -5}, {"plan_state", kEvil}}));
  // The health report as the frame of its own it is becoming: ignored today,
  // decoded by its reader tomorrow; either way nothing of it may print raw.
  ASSERT_TRUE(evil.send(*s, "health", events[4]));
  ASSERT_TRUE(evil.send(*s, "tele" + kEvil, {{"to", kEvil}}));
  ASSERT_TRUE(evil.send(*s, "error", {{"code", kEvil}, {"message", kEvil}}));
  ASSERT_TRUE(evil.send(*s, "error", {{"message", 42}}));
  evil.drain(*s);
  EXPECT_EQ(evil.close_reason(), "") << "no frame of it made the session fail";
  const auto acked = evil.acked_events();
  EXPECT_TRUE(acked.count(9)) << "stored without its bad fields";
  EXPECT_FALSE(acked.count(7)) << "an event without a numeric id is refused";
  bool refused_id = false;
  for (const auto& e : evil.errors()) refused_id |= e.rfind("bad_event: ", 0) == 0;
  EXPECT_TRUE(refused_id) << ::testing::PrintToString(evil.errors());
  // It leaves with an escape in its close reason.
  std::string close_payload = "\x03\xe8" + kEvil;
  (void)s->ws_send(factory::net::ws::Opcode::close, close_payload);
  EXPECT_TRUE(s->wait_closed(5s));
  ASSERT_TRUE(eventually([&] { return !h.agent_connected("evil"); }, 5s));

  // The admin's commands: exit 0, nothing a terminal would act on, the other
  // tenant shown as ever.
  for (const std::vector<std::string>& cmd : {std::vector<std::string>{"status"},
                                              {"tenant", "show", "evil"},
                                              {"tenant", "list"},
                                              {"tenant", "show", "good"}}) {
    auto r = h.factory(cmd);
    SCOPED_TRACE(::testing::PrintToString(cmd));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(control_characters_in(r.output), "") << r.output;
    EXPECT_EQ(count(r.output, "owned"), count(r.output, "\\x1b]0;owned")) << "shown only escaped:\n"
                                                                          << r.output;
  }
  auto status = h.factory({"status"});
  EXPECT_NE(status.output.find("evil"), std::string::npos) << status.output;
  bool good_row = false;
  for (const auto& line : lines_of(status.output))
    if (line.rfind("good ", 0) == 0) good_row = line.find(" yes ") != std::string::npos;
  EXPECT_TRUE(good_row) << status.output;
  auto show = h.factory({"tenant", "show", "evil"});
  EXPECT_NE(show.output.find("step says \\x1b[2J"), std::string::npos) << show.output;
  EXPECT_NE(show.output.find("\\u202egnp.exe"), std::string::npos) << show.output;
  EXPECT_NE(show.output.find("dns_clash: \\x1b[2J"), std::string::npos) << show.output;

  // JSON stays exact and valid: the free text as sent, the names dropped.
  auto j = h.factory({"status", "-o", "json"});
  ASSERT_EQ(j.exit_code, 0) << j.output;
  auto doc = json::parse(j.output, nullptr, false);
  ASSERT_FALSE(doc.is_discarded()) << j.output;
  EXPECT_EQ(j.output.find('\x1b'), std::string::npos) << "JSON escapes control characters";
  json evil_doc, good_doc;
  for (const auto& t : doc["tenants"]) (t["name"] == "evil" ? evil_doc : good_doc) = t;
  ASSERT_TRUE(evil_doc.is_object()) << doc.dump(2);
  EXPECT_EQ(evil_doc["agent"]["version"], "") << "a version with escapes is no version";
  EXPECT_EQ(evil_doc["agent"]["hostname"], "");
  EXPECT_EQ(evil_doc["plan"]["steps"]["gpu-present"]["message"], "step says " + kEvil);
  EXPECT_FALSE(evil_doc["plan"]["steps"]["gpu-present"].contains("tenant"));
  EXPECT_FALSE(evil_doc["plan"].contains("tier"));
  EXPECT_EQ(evil_doc["diagnoses"]["dns_clash"]["summary"], kEvil);
  EXPECT_EQ(evil_doc["diagnoses"].size(), 1u) << "a code with escapes is no code";
  // Its health report, whatever was kept of it, did not stop `status` above.
  EXPECT_TRUE(!evil_doc.contains("health") || evil_doc["health"].is_object());
  EXPECT_EQ(evil_doc["phase"], "failed");
  EXPECT_EQ(good_doc["agent"]["connected"], true);
  EXPECT_EQ(good_doc["agent"]["version"], FACTORY_VERSION);
  EXPECT_FALSE(good_doc.contains("plan")) << "nothing of evil's reached good: " << good_doc.dump();
  auto y = h.factory({"tenant", "show", "evil", "-o", "yaml"});
  EXPECT_EQ(y.exit_code, 0) << y.output;
  auto back = factory::parse_yaml(y.output, "tenant show -o yaml");
  ASSERT_TRUE(back.ok()) << y.output;
  EXPECT_EQ((*back)["plan"]["steps"]["gpu-present"]["message"], "step says " + kEvil);

  // The coordinator's log: the escapes appear only escaped.
  const std::string log = h.log();
  EXPECT_EQ(control_characters_in(log), "") << log;
  EXPECT_NE(log.find("tele\\x1b[2J"), std::string::npos) << log;

  // What was dropped is counted, per tenant and reason, in valid Prometheus text.
  auto m = api(h, "GET", "/metrics");
  ASSERT_EQ(m.status, 200) << m.body;
  expect_promtool_valid(m.body);
  EXPECT_GE(metric(m.body,
                   "factory_agent_messages_rejected_total{tenant=\"evil\",reason=\"bad_format\"}"),
            5u)
      << m.body;
  EXPECT_GE(metric(m.body,
                   "factory_agent_messages_rejected_total{tenant=\"evil\",reason=\"wrong_type\"}"),
            3u)
      << m.body;
  EXPECT_GE(
      metric(m.body,
             "factory_agent_messages_rejected_total{tenant=\"evil\",reason=\"unknown_field\"}"),
      1u)
      << m.body;
  EXPECT_GE(
      metric(m.body, "factory_agent_messages_rejected_total{tenant=\"\",reason=\"bad_format\"}"),
      2u)
      << "the enroll frame's hostname and version: " << m.body;
  EXPECT_EQ(m.body.find("tenant=\"good\",reason"), std::string::npos) << m.body;
}

TEST(Hostile, MetricsTakeTheBearerTokenUnlessOpened) {
  TempDir dir("hostile-metrics");
  CoordinatorHarness h(dir.path());
  h.start();
  h.create_token("t1");
  auto anon = api(h, "GET", "/metrics", "", /*with_token=*/false);
  EXPECT_EQ(anon.status, 401) << anon.body;
  EXPECT_EQ(anon.body.find("t1"), std::string::npos) << "no tenant name to a stranger";
  auto with = api(h, "GET", "/metrics");
  EXPECT_EQ(with.status, 200);
  EXPECT_NE(with.body.find("factory_tenant_agent_connected{tenant=\"t1\"} 0"), std::string::npos);
  h.stop();

  TempDir open_dir("hostile-metrics-open");
  CoordinatorHarness o(open_dir.path(), "", "", "  metrics_public: true\n");
  o.start();
  EXPECT_EQ(api(o, "GET", "/metrics", "", false).status, 200);
  EXPECT_EQ(api(o, "GET", "/v1/tenants", "", false).status, 401) << "only /metrics is opened";
}

TEST(Hostile, AFloodingTenantIsThrottledAndToldWhyOthersAreNot) {
  TempDir dir("hostile-quota");
  CoordinatorHarness h(dir.path(), "", "  quota:\n    events_per_second: 4\n    event_burst: 40\n");
  h.start();
  // The steady agent sends an event a second and a heartbeat: within its quota.
  AgentProcess steady(h, h.create_token("steady"),
                      named("steady", {"--synthetic-events", "10", "--synthetic-rate", "1"}));
  ASSERT_TRUE(eventually([&] { return h.agent_connected("steady"); }, 10s)) << steady.log();

  OwnAgent flood(h, "flood");
  ASSERT_TRUE(flood.enrolled());
  auto s = flood.session();
  ASSERT_TRUE(s);
  for (uint64_t id = 1; id <= 200; ++id)
    if (!flood.send(*s, "event", {{"id", id}, {"kind", "synthetic"}, {"n", id}})) break;
  flood.drain(*s);
  std::string over;
  for (const auto& e : flood.errors())
    if (e.rfind("over_quota: ", 0) == 0) over = e;
  EXPECT_NE(over.find("more than 4 messages/s (burst 40"), std::string::npos)
      << ::testing::PrintToString(flood.errors());
  EXPECT_NE(over.find("reconnect in "), std::string::npos) << over;
  EXPECT_EQ(flood.close_reason(), "over quota");
  EXPECT_TRUE(s->wait_closed(3s));
  // What it got in before the refusal is stored (the writer commits it a
  // moment later); nothing after.
  EXPECT_TRUE(eventually([&] { return h.stored_events("flood").size() >= 30; }, 5s))
      << h.stored_events("flood").size();
  std::this_thread::sleep_for(500ms);
  EXPECT_LE(h.stored_events("flood").size(), 45u) << "the burst (less the hello), then nothing";
  // Back at once: refused at its hello while the throttle lasts (the time
  // half a burst takes to come back: 5 s).
  EXPECT_FALSE(flood.session());
  bool told = false;
  for (const auto& e : flood.errors()) told |= e.rfind("over_quota: ", 0) == 0;
  EXPECT_TRUE(told);

  // The other tenant did not notice.
  ASSERT_TRUE(eventually([&] { return h.stored_events("steady").size() >= 10; }, 20s))
      << steady.log();
  EXPECT_TRUE(h.agent_connected("steady"));
  EXPECT_EQ(steady.log().find("over_quota"), std::string::npos);
  auto m = api(h, "GET", "/metrics");
  expect_promtool_valid(m.body);
  EXPECT_GE(
      metric(m.body,
             "factory_agent_quota_refusals_total{tenant=\"flood\",quota=\"events_per_second\"}"),
      2u)
      << m.body;
  EXPECT_EQ(m.body.find("tenant=\"steady\",quota"), std::string::npos) << m.body;
  // Later it may come back.
  std::this_thread::sleep_for(6s);
  EXPECT_TRUE(flood.session());
}

TEST(Hostile, BytesPerDayAndStoredHistoryAreCappedPerTenant) {
  TempDir dir("hostile-bytes");
  CoordinatorHarness h(dir.path(), "",
                       "  quota:\n    bytes_per_day: 1Mi\n    max_events_stored: 8\n");
  h.start();
  OwnAgent big(h, "big");
  ASSERT_TRUE(big.enrolled());
  auto s = big.session();
  ASSERT_TRUE(s);
  const std::string pad(60 * 1024, 'p');
  for (uint64_t id = 1; id <= 30; ++id)
    if (!big.send(*s, "event", {{"id", id}, {"kind", "synthetic"}, {"pad", pad}})) break;
  big.drain(*s);
  std::string over;
  for (const auto& e : big.errors())
    if (e.rfind("over_quota: ", 0) == 0) over = e;
  EXPECT_NE(over.find("used its 1 MiB of events per day"), std::string::npos)
      << ::testing::PrintToString(big.errors());
  // Retention: the newest 8 stay, the oldest went first, and it is counted.
  // (The events are committed a moment after the refusal closed the session.)
  std::this_thread::sleep_for(1s);
  auto events = h.stored_events("big");
  ASSERT_EQ(events.size(), 8u);
  const auto admitted = events.back()["id"].get<uint64_t>();
  EXPECT_GE(admitted, 14u);
  EXPECT_LE(admitted, 17u) << "1 MiB is about 17 events of 60 KiB";
  EXPECT_EQ(events.front()["id"].get<uint64_t>(), admitted - 7);
  auto m = api(h, "GET", "/metrics");
  EXPECT_EQ(metric(m.body, "factory_events_expired_total"), admitted - 8) << m.body;
  EXPECT_GE(
      metric(m.body, "factory_agent_quota_refusals_total{tenant=\"big\",quota=\"bytes_per_day\"}"),
      1u);
}

TEST(Hostile, ApiAndCliRefuseBadInputNamingTheField) {
  TempDir dir("hostile-input");
  CoordinatorHarness h(dir.path());
  h.start();
  struct Case {
    std::string path, body, want;
  };
  for (const auto& c : std::vector<Case>{
           {"/v1/tokens", R"({"tenant": 5})", "'tenant' must be a string"},
           {"/v1/tokens", R"({"tenant": "t1", "ttl": 3600})", "'ttl' must be a duration string"},
           {"/v1/tokens", R"({"tenant": "t1", "tll": "1h"})", "unknown field 'tll'"},
           {"/v1/tokens", R"({})", "'tenant' is required"},
           {"/v1/tokens", R"([1])", "want {"},
           {"/v1/tenants", R"({"name": "t2", "tier": "gpu-vm", "gpus": 4294967297})",
            "'gpus' is 4294967297: want a whole number from 0 to 16"},
           {"/v1/tenants", R"({"name": "t2", "tier": "gpu-vm", "gpus": -1})", "'gpus' is -1"},
           {"/v1/tenants", R"({"name": "t2", "tier": "gpu-vm", "gpus": "2"})", "'gpus' must be"},
           {"/v1/tenants", R"({"name": ["t2"], "tier": "gpu-vm"})", "'name' must be a string"},
           {"/v1/tenants", R"({"name": "t2", "tier": "gpu-vm", "ssh_node_port": -1})",
            "'ssh_node_port' is -1"},
       }) {
    auto r = api(h, "POST", c.path, c.body);
    EXPECT_EQ(r.status, 400) << c.path << " " << c.body << ": " << r.body;
    EXPECT_NE(r.body.find(c.want), std::string::npos) << c.body << ": " << r.body;
  }
  EXPECT_TRUE(h.status()["tenants"].empty()) << "nothing was made";
  // The CLI refuses --gpus 17 itself, with a usage error naming the flag.
  auto cli = h.factory({"tenant", "create", "t3", "--tier", "gpu-vm", "--gpus", "17"});
  EXPECT_EQ(cli.exit_code, 2) << cli.output;
  EXPECT_EQ(cli.output, "factory: --gpus 17 is out of range: want 0-16\n");
}

TEST(Hostile, DeletingATenantClearsItsAgentFromStatus) {
  TempDir dir("hostile-delete");
  CoordinatorHarness h(dir.path());
  h.start();
  AgentProcess agent(h, h.create_token("t1"), named("t1"));
  ASSERT_TRUE(eventually([&] { return h.agent_connected("t1"); }, 10s)) << agent.log();
  auto d = h.factory({"tenant", "delete", "t1"});
  ASSERT_EQ(d.exit_code, 0) << d.output;
  ASSERT_TRUE(eventually([&] { return !h.tenant("t1"); }, 5s));
  // The name is taken again; the old agent is not on show under it.
  h.create_token("t1");
  std::this_thread::sleep_for(1s);
  auto t = h.tenant("t1");
  ASSERT_TRUE(t);
  EXPECT_EQ((*t)["agent"]["state"], "never_connected") << t->dump(2);
  EXPECT_EQ((*t)["agent"]["version"], "") << t->dump(2);
  EXPECT_FALSE((*t)["agent"]["connected"].get<bool>());
}
