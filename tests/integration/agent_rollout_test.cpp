// Agent self-update, the coordinator's side (docs/agent-rollouts.md): the
// real `factory serve` and `factory agents upgrade`, against agents of our
// own that speak the real protocol over mTLS (own_agent.hpp). Each double
// stands in for factory-agent's link and its upgrade (agent/upgrade, the
// other side of contract/agent_upgrade.hpp): it enrolls, receives the
// order, downloads the order's URL and checks its size and sha256 as the
// real agent does, then does what the case needs: comes back as the new
// version and reports `upgraded`, reports `rolled_back` with a reason, or
// says nothing.
#include <gtest/gtest.h>

#include <fstream>
#include <future>
#include <set>

#include "common/net/http_client.hpp"
#include "common/pki.hpp"
#include "contract/agent_upgrade.hpp"
#include "tests/integration/event_reader.hpp"
#include "tests/integration/own_agent.hpp"

using namespace factory::testing;
using namespace std::chrono_literals;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// An agent binary as the agent side stamps it: bytes, the mark, the
// version, NUL.
std::string marked_binary(const std::string& version) {
  return std::string(4096, 'x') + std::string(factory::proto::kAgentVersionMark) + version +
         std::string(1, '\0') + "rest of the binary";
}

void write(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << bytes;
}

std::map<std::string, std::string> bearer(const std::string& t) {
  return {{"Authorization", "Bearer " + t}};
}

// The harness serves the build's factory-agent; these tests serve a file
// of their own.
void serve_binary(CoordinatorHarness& h, const fs::path& bin) {
  std::string cfg = slurp(h.config_path());
  auto at = cfg.find("  binary: ");
  ASSERT_NE(at, std::string::npos);
  cfg.replace(at, cfg.find('\n', at) - at, "  binary: " + bin.string());
  write(h.config_path(), cfg);
}

using Clock = std::chrono::steady_clock;

// One tenant's agent, as its upgrade sees it.
class UpgradingAgent {
 public:
  UpgradingAgent(CoordinatorHarness& h, const std::string& tenant)
      : h_(h), tenant_(tenant), own_(h, tenant) {}

  bool connect(const std::string& version) {
    session_.reset();
    for (int i = 0; i < 50 && !session_; ++i) {
      session_ = own_.session(
          {{"agent_id", "a0" + std::to_string(tenant_.size())}, {"agent_version", version}});
      if (!session_) std::this_thread::sleep_for(200ms);
    }
    version_ = version;
    return session_ != nullptr;
  }

  // The next upgrade order, and when it came.
  std::optional<json> wait_order(std::chrono::milliseconds timeout = 20s) {
    auto until = Clock::now() + timeout;
    while (session_ && Clock::now() < until) {
      auto f = own_.read_type(
          *session_, "command",
          std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()));
      if (!f) return std::nullopt;
      if ((*f)["body"].value("action", "") != "upgrade") continue;
      received_at_ = Clock::now();
      auto order = factory::proto::decode_agent_upgrade_order((*f)["body"]);
      EXPECT_TRUE(order.ok()) << (order.ok() ? "" : order.error().message);
      ids_.insert((*f)["body"].value("upgrade_id", ""));
      return (*f)["body"];
    }
    return std::nullopt;
  }

  // What the real agent checks before it installs anything.
  bool download(const json& order) {
    factory::net::TlsClientOptions tls;
    tls.ca_pem = slurp(h_.state_dir() / "ca.crt");
    factory::net::HttpClient c(tls);
    factory::net::HttpRequest req;
    req.url = order.value("url", "");
    auto r = c.request(req);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
    if (!r.ok()) return false;
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(r->body.size(), order.value("size", 0u));
    EXPECT_EQ(factory::pki::sha256_hex(r->body), order.value("sha256", ""));
    return r->status == 200 && factory::pki::sha256_hex(r->body) == order.value("sha256", "");
  }

  bool report(const std::string& upgrade_id, const std::string& state, const std::string& from,
              const std::string& to, const std::string& reason = "") {
    json e = {{"id", ++event_id_}, {"kind", "agent_upgrade"}, {"upgrade_id", upgrade_id},
              {"state", state},    {"from_version", from},    {"to_version", to},
              {"reason", reason}};
    if (!session_ || !own_.send(*session_, "event", e)) return false;
    // Stored once acknowledged, as the agent's spool knows it.
    auto until = Clock::now() + 5s;
    while (own_.acked_events().count(event_id_) == 0 && Clock::now() < until)
      own_.read_type(*session_, "ack", 200ms);
    return own_.acked_events().count(event_id_) > 0;
  }

  void disconnect() { session_.reset(); }

  // What a live agent does while it waits: a heartbeat, and a pong for
  // every ping (the coordinator drops a connection silent past
  // agents.idle_timeout).
  void keep_alive(std::chrono::milliseconds for_) {
    if (!session_) return;
    own_.send(*session_, "heartbeat", {{"pending_events", 0}, {"dropped_events", 0}});
    auto until = Clock::now() + for_;
    while (Clock::now() < until) {
      auto f = session_->ws_read(50ms);
      if (f.ok() && f->op == factory::net::ws::Opcode::ping)
        (void)session_->ws_send(factory::net::ws::Opcode::pong, f->payload);
    }
  }

  // The whole of a good upgrade: installing, the new binary connects and
  // says so.
  void upgrade(const json& order) {
    const std::string id = order.value("upgrade_id", "");
    const std::string to = order.value("version", "");
    ASSERT_TRUE(download(order));
    ASSERT_TRUE(report(id, "installing", version_, to));
    const std::string from = version_;
    ASSERT_TRUE(connect(to));
    done_at_ = Clock::now();
    ASSERT_TRUE(report(id, "upgraded", from, to));
  }

  // Frames until `quiet` passes with none: the upgrade orders among them.
  int orders_within(std::chrono::milliseconds quiet) {
    int n = 0;
    while (session_) {
      auto f = own_.read_type(*session_, "command", quiet);
      if (!f) break;
      if ((*f)["body"].value("action", "") == "upgrade") ++n;
    }
    return n;
  }

  const std::string& tenant() const { return tenant_; }
  const std::set<std::string>& ids() const { return ids_; }
  Clock::time_point received_at() const { return received_at_; }
  Clock::time_point done_at() const { return done_at_; }

 private:
  CoordinatorHarness& h_;
  std::string tenant_;
  OwnAgent own_;
  std::unique_ptr<RawTlsClient> session_;
  std::string version_;
  std::uint64_t event_id_ = 0;
  std::set<std::string> ids_;
  Clock::time_point received_at_{}, done_at_{};
};

class AgentRollout : public ::testing::Test {
 protected:
  void start(const std::string& binary, const std::string& agents_yaml = "") {
    bin_ = dir_.path() / "factory-agent-served";
    write(bin_, binary);
    h_ = std::make_unique<CoordinatorHarness>(dir_.path(), "", agents_yaml,
                                              "  events_heartbeat: 1s\n");
    serve_binary(*h_, bin_);
    h_->start();
  }
  std::vector<std::unique_ptr<UpgradingAgent>> agents(int n, const std::string& version = "0.1.0") {
    std::vector<std::unique_ptr<UpgradingAgent>> out;
    for (int i = 0; i < n; ++i) {
      out.push_back(std::make_unique<UpgradingAgent>(*h_, "t" + std::to_string(i)));
      EXPECT_TRUE(out.back()->connect(version));
    }
    return out;
  }
  json progress() {
    auto r = h_->factory({"agents", "upgrade", "status", "-o", "json"});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    auto j = json::parse(r.output, nullptr, false);
    return j.is_discarded() ? json::object() : j;
  }
  std::map<std::string, std::string> states() {
    std::map<std::string, std::string> out;
    for (const auto& t : progress().value("tenants", json::array()))
      out[t.value("tenant", "")] = t.value("state", "");
    return out;
  }
  TempDir dir_{"agent-rollout"};
  fs::path bin_;
  std::unique_ptr<CoordinatorHarness> h_;
};

}  // namespace

TEST_F(AgentRollout, DryRunListsEveryTenantAndChangesNothing) {
  start(marked_binary("0.2.0"));
  auto old = agents(2);
  UpgradingAgent current(*h_, "t-current");
  ASSERT_TRUE(current.connect("0.2.0"));
  UpgradingAgent away(*h_, "t-away");
  ASSERT_TRUE(away.connect("0.1.0"));
  away.disconnect();
  ASSERT_TRUE(eventually([&] { return !h_->agent_connected("t-away"); }, 5s));
  h_->create_token("t-never");

  auto r = h_->factory({"agents", "upgrade", "--all", "--dry-run", "-o", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto plan = json::parse(r.output);
  EXPECT_EQ(plan["version"], "0.2.0");
  EXPECT_EQ(plan["sha256"], factory::pki::sha256_hex(marked_binary("0.2.0")));
  std::map<std::string, json> by;
  for (const auto& t : plan["tenants"]) by[t["tenant"]] = t;
  ASSERT_EQ(by.size(), 5u) << plan.dump(2);
  EXPECT_EQ(by["t0"]["action"], "upgrade");
  EXPECT_EQ(by["t1"]["action"], "upgrade");
  EXPECT_EQ(by["t0"]["version"], "0.1.0");
  EXPECT_EQ(by["t-current"]["action"], "current");
  EXPECT_EQ(by["t-away"]["action"], "skip");
  EXPECT_EQ(by["t-away"]["why"], "not connected");
  EXPECT_EQ(by["t-never"]["action"], "skip");
  EXPECT_EQ(by["t-never"]["why"], "never enrolled");

  auto table = h_->factory({"agents", "upgrade", "--all", "--dry-run"});
  ASSERT_EQ(table.exit_code, 0) << table.output;
  EXPECT_NE(table.output.find("skip: never enrolled"), std::string::npos) << table.output;
  EXPECT_NE(table.output.find("dry run: nothing changed"), std::string::npos) << table.output;

  // Nothing journaled, nothing sent.
  for (auto name : {"t0", "t1", "t-current", "t-away", "t-never"}) {
    auto rec = h_->stored_record(name);
    ASSERT_TRUE(rec) << name;
    EXPECT_FALSE((*rec)["status"].contains("agent_upgrade")) << rec->dump(2);
  }
  for (auto& a : old) EXPECT_EQ(a->orders_within(1500ms), 0);
  EXPECT_EQ(progress().value("rollout_id", ""), "");
  // What is served, where the admin looks.
  EXPECT_NE(h_->metrics().find("factory_agent_binary_info{version=\"0.2.0\",sha256=\"" +
                               factory::pki::sha256_hex(marked_binary("0.2.0")) + "\"} 1"),
            std::string::npos);
  auto status = h_->factory({"status"});
  EXPECT_NE(status.output.find("agent binary served: 0.2.0"), std::string::npos) << status.output;
}

TEST_F(AgentRollout, TwoAtATimeOverFiveAgentsEndsAllUpgraded) {
  start(marked_binary("0.2.0"));
  auto fleet = agents(5);
  EventReader feed(*h_, "/v1/events", bearer(h_->admin_token()));
  auto cli = std::async(std::launch::async, [&] {
    return h_->factory(
        {"agents", "upgrade", "--all", "--max-unavailable", "2", "--poll", "1s", "--timeout", "2m"},
        150s);
  });
  std::vector<std::thread> guests;
  for (auto& a : fleet)
    guests.emplace_back([&a] {
      auto order = a->wait_order(60s);
      ASSERT_TRUE(order) << a->tenant() << " got no order";
      std::this_thread::sleep_for(700ms);  // the download, the install, the restart
      a->upgrade(*order);
    });
  for (auto& g : guests) g.join();
  auto r = cli.get();
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("every agent asked for runs 0.2.0"), std::string::npos) << r.output;
  // Never more than two between their order and their new agent's word.
  int most = 0;
  for (auto& a : fleet) {
    int at_once = 0;
    for (auto& b : fleet)
      if (b->received_at() <= a->received_at() && a->received_at() < b->done_at()) ++at_once;
    most = std::max(most, at_once);
  }
  EXPECT_LE(most, 2);
  EXPECT_GE(most, 2) << "two were meant to go at once";
  std::cout << "[ figures  ] 5 agents, --max-unavailable 2: at most " << most
            << " in flight at once\n";
  for (const auto& [t, s] : states()) EXPECT_EQ(s, "upgraded") << t;
  for (auto& a : fleet) EXPECT_EQ(a->ids().size(), 1u) << a->tenant();
  ASSERT_TRUE(eventually(
      [&] {
        return h_->metrics().find("factory_agent_upgrades_total{result=\"upgraded\"} 5") !=
               std::string::npos;
      },
      5s))
      << h_->metrics();
  EXPECT_TRUE(feed.wait_for("action", "event", "upgrade_pending"));
  EXPECT_TRUE(feed.wait_for("action", "event", "upgrade_upgraded"));
}

TEST_F(AgentRollout, ARollbackHoldsTheRestAndTheCommandSaysWhy) {
  start(marked_binary("0.2.0"));
  auto fleet = agents(3);
  EventReader feed(*h_, "/v1/events", bearer(h_->admin_token()));
  auto cli = std::async(std::launch::async, [&] {
    return h_->factory({"agents", "upgrade", "--all", "--poll", "1s", "--timeout", "1m"}, 90s);
  });
  auto order = fleet[0]->wait_order();
  ASSERT_TRUE(order);
  ASSERT_TRUE(fleet[0]->download(*order));
  const std::string why = "exited with status 1 at start, 3 times";
  ASSERT_TRUE(
      fleet[0]->report(order->value("upgrade_id", ""), "rolled_back", "0.1.0", "0.2.0", why));
  auto r = cli.get();
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("t0: rolled back: " + why), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("t1: held: t0 rolled back: " + why), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("t2: held: t0 rolled back: " + why), std::string::npos) << r.output;
  auto s = states();
  EXPECT_EQ(s["t0"], "rolled_back");
  EXPECT_EQ(s["t1"], "held");
  EXPECT_EQ(s["t2"], "held");
  EXPECT_EQ(fleet[1]->orders_within(1s), 0);
  EXPECT_EQ(fleet[2]->orders_within(200ms), 0);
  auto ev = feed.wait_for("action", "event", "upgrade_rolled_back");
  ASSERT_TRUE(ev) << feed.text();
  EXPECT_EQ(ev->data["reason"], why);
  EXPECT_EQ(ev->data["tenant"], "t0");
  EXPECT_NE(h_->metrics().find("factory_agent_upgrades_total{result=\"rolled_back\"} 1"),
            std::string::npos);
  auto show = h_->factory({"tenant", "show", "t0"});
  EXPECT_NE(show.output.find("Upgrade:"), std::string::npos) << show.output;
  EXPECT_NE(show.output.find(why), std::string::npos) << show.output;
  // A new rollout may start once none is under way.
  auto again = h_->factory({"agents", "upgrade", "--tenant", "t1", "--no-wait"});
  EXPECT_EQ(again.exit_code, 0) << again.output;
}

TEST_F(AgentRollout, KilledMidRolloutConvergesWithoutOrderingAnyoneTwice) {
  start(marked_binary("0.2.0"));
  auto fleet = agents(3);
  auto r = h_->factory({"agents", "upgrade", "--all", "--no-wait"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto first = fleet[0]->wait_order();
  ASSERT_TRUE(first);
  // A second rollout is refused while this one is under way, naming it.
  auto busy = h_->factory({"agents", "upgrade", "--all", "--no-wait"});
  EXPECT_EQ(busy.exit_code, 1) << busy.output;
  EXPECT_NE(busy.output.find("a rollout is under way: up-"), std::string::npos) << busy.output;

  h_->kill9();
  h_->start();
  for (auto& a : fleet) ASSERT_TRUE(a->connect("0.1.0"));
  // The same order again, to the one it was sent to; nobody else's yet.
  auto again = fleet[0]->wait_order();
  ASSERT_TRUE(again);
  EXPECT_EQ(again->value("upgrade_id", ""), first->value("upgrade_id", ""));
  EXPECT_EQ(fleet[1]->orders_within(1500ms), 0);
  fleet[0]->upgrade(*again);
  for (std::size_t i = 1; i < fleet.size(); ++i) {
    auto o = fleet[i]->wait_order();
    ASSERT_TRUE(o) << fleet[i]->tenant();
    fleet[i]->upgrade(*o);
  }
  ASSERT_TRUE(eventually([&] { return progress().value("done", false); }, 20s));
  for (const auto& [t, s] : states()) EXPECT_EQ(s, "upgraded") << t;
  for (auto& a : fleet) EXPECT_EQ(a->ids().size(), 1u) << a->tenant();
}

TEST_F(AgentRollout, EventsForAnotherTenantsOrUnknownUpgradeChangeNothing) {
  start(marked_binary("0.2.0"));
  auto fleet = agents(2);
  ASSERT_EQ(
      h_->factory({"agents", "upgrade", "--all", "--max-unavailable", "2", "--no-wait"}).exit_code,
      0);
  auto a = fleet[0]->wait_order();
  auto b = fleet[1]->wait_order();
  ASSERT_TRUE(a && b);
  // t0 speaks of t1's order, and of one nobody gave.
  ASSERT_TRUE(
      fleet[0]->report(b->value("upgrade_id", ""), "rolled_back", "0.1.0", "0.2.0", "not mine"));
  ASSERT_TRUE(fleet[0]->report("up-1-99", "refused", "0.1.0", "0.2.0", "made up"));
  std::this_thread::sleep_for(2500ms);  // two passes of the rollout
  auto s = states();
  EXPECT_EQ(s["t0"], "sent");
  EXPECT_EQ(s["t1"], "sent");
  auto p = progress();
  for (const auto& t : p["tenants"]) EXPECT_FALSE(t.contains("reason")) << t.dump();
  fleet[0]->upgrade(*a);
  ASSERT_TRUE(eventually([&] { return states()["t0"] == "upgraded"; }, 10s));
  EXPECT_EQ(states()["t1"], "sent");
}

TEST_F(AgentRollout, ABinaryWithoutAVersionMarkIsRefusedWithTheReason) {
  start(std::string(8192, 'y'));  // an agent built before the mark
  auto fleet = agents(1);
  auto r = h_->factory({"agents", "upgrade", "--all"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(
      r.output.find("cannot upgrade: " + bin_.string() + " carries no factory-agent version mark"),
      std::string::npos)
      << r.output;
  auto dry = h_->factory({"agents", "upgrade", "--all", "--dry-run", "-o", "json"});
  EXPECT_EQ(dry.exit_code, 0) << dry.output;
  EXPECT_EQ(json::parse(dry.output).value("cannot_upgrade", ""),
            "cannot upgrade: " + bin_.string() + " carries no factory-agent version mark");
  EXPECT_FALSE((*h_->stored_record("t0"))["status"].contains("agent_upgrade"));
  EXPECT_EQ(fleet[0]->orders_within(1s), 0);
  EXPECT_NE(h_->metrics().find("factory_agent_binary_info{version=\"none\""), std::string::npos);
  // A release copied over the file is what the next request sees.
  write(bin_, marked_binary("0.3.0"));
  auto later = h_->factory({"agents", "upgrade", "--all", "--dry-run", "-o", "json"});
  ASSERT_EQ(later.exit_code, 0) << later.output;
  EXPECT_EQ(json::parse(later.output).value("version", ""), "0.3.0");
  EXPECT_FALSE(json::parse(later.output).contains("cannot_upgrade"));
}

TEST_F(AgentRollout, SilenceFailsAfterTheGraceUnlessTheAgentRunsTheNewVersion) {
  start(marked_binary("0.2.0"), "  upgrade_grace: 1s\n");
  auto fleet = agents(3);
  auto cli = std::async(std::launch::async, [&] {
    return h_->factory({"agents", "upgrade", "--all", "--max-unavailable", "2", "--confirm-within",
                        "10s", "--poll", "1s", "--timeout", "1m"},
                       90s);
  });
  auto silent = fleet[0]->wait_order();
  auto quiet = fleet[1]->wait_order();
  ASSERT_TRUE(silent && quiet);
  // t0 takes the order and is never heard of again about it; t1's new
  // agent comes back, but its report is lost.
  ASSERT_TRUE(fleet[1]->download(*quiet));
  ASSERT_TRUE(fleet[1]->connect("0.2.0"));
  // Both stay connected, saying nothing of the upgrade.
  while (cli.wait_for(0s) != std::future_status::ready)
    for (auto& a : fleet) a->keep_alive(100ms);
  auto r = cli.get();
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("t0: failed: no outcome within"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("its agent is connected, running 0.1.0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("t2: held: t0 failed: no outcome within"), std::string::npos) << r.output;
  auto s = states();
  EXPECT_EQ(s["t0"], "failed");
  EXPECT_EQ(s["t1"], "upgraded");
  EXPECT_EQ(s["t2"], "held");
  for (const auto& t : progress()["tenants"])
    if (t["tenant"] == "t1") {
      EXPECT_EQ(t["reason"], "the agent runs 0.2.0; its own report never came");
    }
  EXPECT_EQ(fleet[2]->orders_within(500ms), 0);
  EXPECT_NE(h_->metrics().find("factory_agent_upgrades_total{result=\"failed\"} 1"),
            std::string::npos);
}
