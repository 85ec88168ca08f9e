// The spine end to end: the real `factory serve` and `factory-agent` binaries
// on loopback with real TLS, plus Debian's wscat as a websocket peer we did
// not write. Nothing is mocked.
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <set>
#include <thread>

#include "common/atomic_file.hpp"
#include "contract/protocol.hpp"
#include "tests/support/coordinator_harness.hpp"

using namespace factory::testing;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

std::string frame(const std::string& type, uint64_t seq, const nlohmann::json& body) {
  factory::proto::Envelope e;
  e.type = type;
  e.seq = seq;
  e.body = body;
  return factory::proto::serialize(e);
}

// Writes the agent's certificate and key (from its identity file) as PEM files
// for an external client to present.
std::pair<std::string, std::string> agent_cert_files(const AgentProcess& a, const fs::path& dir,
                                                     const std::string& name) {
  auto id = nlohmann::json::parse(slurp(a.state_dir() / "identity.json"));
  auto cert = dir / (name + ".crt");
  auto key = dir / (name + ".key");
  EXPECT_TRUE(factory::write_file_atomic(cert, id["certificate"].get<std::string>(), 0600).ok());
  EXPECT_TRUE(factory::write_file_atomic(key, id["key"].get<std::string>(), 0600).ok());
  return {cert.string(), key.string()};
}

std::set<uint64_t> synthetic_ids(const std::vector<nlohmann::json>& events) {
  std::set<uint64_t> ids;
  for (auto& e : events)
    if (e["event"].value("kind", "") == "synthetic") ids.insert(e["event"].value("n", uint64_t{0}));
  return ids;
}

AgentOptions named(const std::string& name, std::vector<std::string> extra = {}) {
  AgentOptions o;
  o.state_dir_name = name;
  o.extra_args = std::move(extra);
  return o;
}

}  // namespace

TEST(Spine, AgentEnrollsAndShowsConnectedWithinASecond) {
  TempDir dir("spine");
  CoordinatorHarness h(dir.path());
  h.start();
  auto tok = h.create_token("t1");
  ASSERT_EQ(tok.value("tenant", ""), "t1");
  EXPECT_EQ(tok.value("coordinator_url", ""), h.agents_url());
  EXPECT_EQ(tok.value("ca_sha256", ""), h.ca_sha256());
  ASSERT_FALSE(tok.value("expires_at", "").empty());

  auto t0 = std::chrono::steady_clock::now();
  AgentProcess agent(h, tok);
  bool up = eventually([&] { return h.agent_connected("t1"); }, 5s, 25ms);
  auto took =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  ASSERT_TRUE(up) << agent.log() << h.log();
  std::cout << "[ figures  ] agent connected " << took.count() << " ms after start\n";
  EXPECT_LE(took.count(), 1000) << "the acceptance says: connected within a second";

  auto t = *h.tenant("t1");
  EXPECT_EQ(t["phase"], "enrolled");
  EXPECT_EQ(t["agent"]["version"], FACTORY_VERSION);
  EXPECT_FALSE(t["agent"].value("connected_since", "").empty());
  EXPECT_FALSE(t["agent"].value("last_seen", "").empty());
  EXPECT_NE(t["agent"].value("remote_address", "").find("127.0.0.1:"), std::string::npos);
  // The token is single-use: the agent removed it; its key never left it.
  EXPECT_FALSE(fs::exists(agent.token_file()));
  auto perms = fs::status(agent.state_dir() / "identity.json").permissions();
  EXPECT_EQ(perms & (fs::perms::group_all | fs::perms::others_all), fs::perms::none);

  // The table form, for humans, and YAML.
  auto table = h.factory({"status"});
  EXPECT_EQ(table.exit_code, 0);
  EXPECT_NE(table.output.find("TENANT"), std::string::npos);
  EXPECT_NE(table.output.find("t1"), std::string::npos);
  auto yaml = h.factory({"status", "-o", "yaml"});
  EXPECT_NE(yaml.output.find("name: \"t1\""), std::string::npos) << yaml.output;
}

TEST(Spine, SecondAgentWithTheSameTokenNeverConnects) {
  TempDir dir("spine");
  CoordinatorHarness h(dir.path());
  h.start();
  auto tok = h.create_token("t1");
  AgentProcess first(h, tok);
  ASSERT_TRUE(eventually([&] { return h.agent_connected("t1"); }, 5s)) << first.log();
  AgentProcess second(h, tok, named("second"));
  int rc = second.proc().wait();
  EXPECT_EQ(rc, 3) << "a refused enrollment needs an admin: exit 3 (no restart loop)";
  EXPECT_NE(second.log().find("already used"), std::string::npos) << second.log();
  EXPECT_FALSE(fs::exists(second.state_dir() / "identity.json"));
  // The first agent is untouched and the coordinator keeps serving.
  EXPECT_TRUE(h.agent_connected("t1"));
  auto t = *h.tenant("t1");
  EXPECT_EQ(t["agent"]["agent_id"],
            nlohmann::json::parse(slurp(first.state_dir() / "identity.json"))["agent_id"]);
}

TEST(Spine, ExpiredTokenIsRefusedWithTheReason) {
  TempDir dir("spine");
  CoordinatorHarness h(dir.path());
  h.start();
  auto tok = h.create_token("t2", "1s");
  std::this_thread::sleep_for(1500ms);
  AgentProcess agent(h, tok);
  EXPECT_EQ(agent.proc().wait(), 3);
  EXPECT_NE(agent.log().find("expired"), std::string::npos) << agent.log();
  // Others are still served.
  AgentProcess good(h, h.create_token("t3"), named("t3"));
  EXPECT_TRUE(eventually([&] { return h.agent_connected("t3"); }, 5s)) << good.log();
}

TEST(Spine, AgentPinnedToTheWrongCaNeverSendsItsToken) {
  TempDir dir("spine");
  CoordinatorHarness h(dir.path());
  h.start();
  auto tok = h.create_token("t1");
  AgentOptions o;
  o.pin_wrong_ca = true;
  AgentProcess agent(h, tok, o);
  EXPECT_EQ(agent.proc().wait(), 3);
  EXPECT_NE(agent.log().find("failed verification"), std::string::npos) << agent.log();
  // The token was never presented: it is still usable.
  auto list = h.factory({"token", "list", "-o", "json"});
  auto j = nlohmann::json::parse(list.output);
  bool active = false;
  for (auto& t : j["tokens"])
    if (t["tenant"] == "t1" && t["state"] == "active") active = true;
  EXPECT_TRUE(active) << list.output;
  EXPECT_EQ(h.log().find("enrollment"), std::string::npos) << "the coordinator saw no enrollment";
}

TEST(Spine, WscatPeerWithoutCertificateMayOnlyEnroll) {
  TempDir dir("spine");
  CoordinatorHarness h(dir.path());
  h.start();
  auto ca = h.state_dir() / "ca.crt";
  std::string url = h.agents_url() + "/v1/agent";
  // Not enrolled: anything but enroll is refused with a reason.
  auto r = wscat(url, ca, {frame("hello", 1, {{"agent_id", "x"}})});
  EXPECT_NE(r.output.find("\"unauthenticated\""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("may only enroll"), std::string::npos) << r.output;

  // A malformed CSR is refused and does not spend the token.
  auto tok = h.create_token("t1");
  r = wscat(url, ca,
            {frame("enroll", 1,
                   {{"token", tok["token"]},
                    {"csr",
                     "-----BEGIN CERTIFICATE REQUEST-----\nnot a csr\n-----END CERTIFICATE "
                     "REQUEST-----\n"}})});
  EXPECT_NE(r.output.find("enrollment_refused"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("CSR"), std::string::npos) << r.output;
  AgentProcess agent(h, tok);
  EXPECT_TRUE(eventually([&] { return h.agent_connected("t1"); }, 5s)) << agent.log();
}

TEST(Spine, CertificateOfTenantACannotActAsTenantB) {
  TempDir dir("spine");
  CoordinatorHarness h(dir.path());
  h.start();
  AgentProcess a(h, h.create_token("tenant-a"), named("a"));
  AgentProcess b(h, h.create_token("tenant-b"), named("b"));
  ASSERT_TRUE(eventually(
      [&] { return h.agent_connected("tenant-a") && h.agent_connected("tenant-b"); }, 5s));
  auto [cert, key] = agent_cert_files(a, dir.path(), "a");
  a.proc().stop();  // wscat speaks as A from here on
  auto ca = h.state_dir() / "ca.crt";
  auto r = wscat(h.agents_url() + "/v1/agent", ca,
                 {frame("hello", 1, {{"agent_id", "x"}, {"tenant", "tenant-b"}})}, 1.0, cert, key);
  EXPECT_NE(r.output.find("permission_denied"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("cannot act as tenant tenant-b"), std::string::npos) << r.output;
  // An event sent with A's certificate is stored under A, whatever it claims.
  r = wscat(h.agents_url() + "/v1/agent", ca,
            {frame("hello", 1, {{"agent_id", "x"}}),
             frame("event", 2, {{"id", 999999}, {"kind", "note"}, {"tenant", "tenant-b"}})},
            1.0, cert, key);
  EXPECT_NE(r.output.find("\"event_id\":999999"), std::string::npos) << r.output;
  for (auto& e : h.stored_events("tenant-b")) EXPECT_NE(e["id"], 999999);
  bool in_a = false;
  for (auto& e : h.stored_events("tenant-a")) in_a |= e["id"] == 999999;
  EXPECT_TRUE(in_a);
}

TEST(Spine, BadFramesAreRejectedAndOtherSessionsUnaffected) {
  TempDir dir("spine");
  CoordinatorHarness h(dir.path());
  h.start();
  AgentProcess steady(h, h.create_token("steady"),
                      named("steady", {"--synthetic-events", "400", "--synthetic-rate", "200"}));
  AgentProcess rogue(h, h.create_token("rogue"), named("rogue"));
  ASSERT_TRUE(
      eventually([&] { return h.agent_connected("rogue") && h.agent_connected("steady"); }, 5s));
  auto [cert, key] = agent_cert_files(rogue, dir.path(), "rogue");
  // wscat now speaks with rogue's identity; the real agent would take the
  // session back when it reconnects (the newest connection wins).
  rogue.proc().stop();
  std::string url = h.agents_url() + "/v1/agent";
  auto ca = h.state_dir() / "ca.crt";
  auto r = wscat(url, ca,
                 {frame("hello", 1, {}), "this is not json", R"({"v":1,"type":"event"})",
                  R"({"v":99,"type":"event","seq":3})", frame("teleport", 4, {{"to", "mars"}}),
                  frame("heartbeat", 5, {})},
                 1.0, cert, key);
  EXPECT_NE(r.output.find("not valid JSON"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("no sequence number"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("unsupported protocol version 99"), std::string::npos) << r.output;
  // The unknown type was ignored and the connection survived: the heartbeat after it is acked.
  EXPECT_NE(r.output.find("\"ack\":5"), std::string::npos) << r.output;
  EXPECT_NE(h.log().find("unknown type 'teleport'"), std::string::npos);
  // A frame over the 64 KiB cap is refused with the reason; the session goes on.
  std::string big = frame("event", 2, {{"id", 1}, {"kind", "x"}, {"pad", std::string(70000, 'x')}});
  r = wscat(url, ca, {frame("hello", 1, {}), big, frame("heartbeat", 3, {})}, 1.0, cert, key);
  EXPECT_NE(r.output.find("exceeds the 65536-byte cap for type 'event'"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("\"ack\":3"), std::string::npos) << r.output;
  EXPECT_NE(h.log().find("exceeds the 65536-byte cap"), std::string::npos);
  EXPECT_TRUE(eventually([&] { return h.stored_events("steady").size() >= 400; }, 20s))
      << "the well-behaved agent kept delivering: " << h.stored_events("steady").size();
  EXPECT_TRUE(h.agent_connected("steady"));
}

// The coordinator dies (SIGKILL) mid-stream and comes back: every event the
// agent emitted is stored exactly once.
TEST(Spine, CoordinatorCrashLosesAndDuplicatesNothing) {
  TempDir dir("spine");
  CoordinatorHarness h(dir.path());
  h.start();
  const uint64_t n = 1500;
  AgentProcess agent(
      h, h.create_token("t1"),
      named("agent", {"--synthetic-events", std::to_string(n), "--synthetic-rate", "600"}));
  ASSERT_TRUE(eventually([&] { return h.stored_events("t1").size() > 200; }, 10s)) << agent.log();
  h.kill9();
  std::this_thread::sleep_for(700ms);  // the agent keeps emitting into its spool
  h.start();
  ASSERT_TRUE(eventually([&] { return h.stored_events("t1").size() >= n; }, 30s))
      << "stored " << h.stored_events("t1").size() << "\n"
      << agent.log();
  std::this_thread::sleep_for(500ms);
  auto events = h.stored_events("t1");
  EXPECT_EQ(events.size(), n) << "each event stored exactly once";
  EXPECT_EQ(synthetic_ids(events).size(), n);
  std::set<uint64_t> ids;
  for (auto& e : events) ids.insert(e["id"].get<uint64_t>());
  EXPECT_EQ(ids.size(), n) << "no duplicate ids";
  EXPECT_EQ((*h.tenant("t1"))["events_stored"], n);
}

// The agent dies (SIGKILL) mid-stream and is restarted as systemd would.
TEST(Spine, AgentCrashLosesAndDuplicatesNothing) {
  TempDir dir("spine");
  CoordinatorHarness h(dir.path());
  h.start();
  const uint64_t n = 1500;
  AgentProcess agent(
      h, h.create_token("t1"),
      named("agent", {"--synthetic-events", std::to_string(n), "--synthetic-rate", "600"}));
  ASSERT_TRUE(eventually([&] { return h.stored_events("t1").size() > 200; }, 10s)) << agent.log();
  agent.proc().kill(SIGKILL);
  agent.proc().wait();
  agent.restart();
  ASSERT_TRUE(eventually([&] { return h.stored_events("t1").size() >= n; }, 30s))
      << "stored " << h.stored_events("t1").size() << "\n"
      << agent.log();
  std::this_thread::sleep_for(500ms);
  auto events = h.stored_events("t1");
  EXPECT_EQ(events.size(), n);
  EXPECT_EQ(synthetic_ids(events).size(), n);
  EXPECT_TRUE(h.agent_connected("t1"));
}

TEST(Spine, ReEnrollmentWorksTwiceInARow) {
  TempDir dir("spine");
  CoordinatorHarness h(dir.path());
  h.start();
  std::string last_agent_id;
  for (int round = 0; round < 3; ++round) {
    AgentProcess agent(h, h.create_token("t1"), named("agent-round-" + std::to_string(round)));
    ASSERT_TRUE(eventually(
        [&] {
          auto t = h.tenant("t1");
          return t && (*t)["agent"].value("connected", false) &&
                 (*t)["agent"].value("agent_id", "") != last_agent_id;
        },
        5s))
        << "round " << round << "\n"
        << agent.log();
    last_agent_id = (*h.tenant("t1"))["agent"].value("agent_id", "");
    agent.proc().stop();
  }
}

TEST(Spine, CertificateIsRenewedBeforeExpiry) {
  TempDir dir("spine");
  // Short-lived certificates so renewal (at two thirds) happens during the test.
  CoordinatorHarness h(dir.path(), "");
  auto cfg = slurp(h.config_path());
  cfg.replace(cfg.find("  idle_timeout: 10s\n"), 19, "  idle_timeout: 10s\n  cert_ttl: 12s\n");
  ASSERT_TRUE(factory::write_file_atomic(h.config_path(), cfg).ok());
  h.start();
  AgentProcess agent(h, h.create_token("t1"));
  ASSERT_TRUE(eventually([&] { return h.agent_connected("t1"); }, 5s));
  auto first = nlohmann::json::parse(slurp(agent.state_dir() / "identity.json"));
  ASSERT_TRUE(eventually(
      [&] {
        auto now =
            nlohmann::json::parse(slurp(agent.state_dir() / "identity.json"), nullptr, false);
        return !now.is_discarded() && now["certificate"] != first["certificate"];
      },
      15s))
      << agent.log();
  auto second = nlohmann::json::parse(slurp(agent.state_dir() / "identity.json"));
  EXPECT_NE(second["key"], first["key"]) << "a renewal uses a fresh key";
  // Past the first certificate's expiry the agent still reconnects, with the new one.
  std::this_thread::sleep_for(5s);
  agent.proc().kill(SIGKILL);
  agent.proc().wait();
  agent.restart();
  EXPECT_TRUE(eventually([&] { return h.agent_connected("t1"); }, 8s)) << agent.log();
  EXPECT_NE(h.log().find("renewed the certificate"), std::string::npos);
}

TEST(Spine, SecretsNeverAppearInLogs) {
  TempDir dir("spine");
  CoordinatorHarness h(dir.path());
  h.start();
  auto tok = h.create_token("t1");
  AgentProcess agent(h, tok);
  ASSERT_TRUE(eventually([&] { return h.agent_connected("t1"); }, 5s));
  // A refused attempt logs too: it must not echo the token either.
  AgentProcess again(h, tok, named("again"));
  again.proc().wait();
  h.stop();
  std::string token = tok["token"];
  std::string secret = token.substr(token.find('.') + 1);
  std::string admin = slurp(h.state_dir() / "admin.token");
  admin = admin.substr(0, admin.find('\n'));
  auto id = nlohmann::json::parse(slurp(agent.state_dir() / "identity.json"));
  std::string key_body = id["key"].get<std::string>().substr(40, 40);
  int logs = 0;
  for (auto& entry : fs::directory_iterator(dir.path())) {
    if (entry.path().extension() != ".log") continue;
    ++logs;
    std::string log = slurp(entry.path());
    SCOPED_TRACE(entry.path().string());
    EXPECT_EQ(log.find(secret), std::string::npos);
    EXPECT_EQ(log.find(admin), std::string::npos);
    EXPECT_EQ(log.find(key_body), std::string::npos);
    EXPECT_EQ(log.find("PRIVATE KEY"), std::string::npos);
  }
  EXPECT_GE(logs, 3);
  for (auto p :
       {h.state_dir() / "admin.token", h.state_dir() / "ca.key", h.state_dir() / "tokens.json"}) {
    auto perms = fs::status(p).permissions();
    EXPECT_EQ(perms & (fs::perms::group_all | fs::perms::others_all), fs::perms::none) << p;
  }
}

TEST(Spine, AdminApiRefusesWithoutTheToken) {
  TempDir dir("spine");
  CoordinatorHarness h(dir.path());
  h.start();
  auto bad = dir.path() / "bad.token";
  ASSERT_TRUE(factory::write_file_atomic(bad, std::string(48, 'x'), 0600).ok());
  auto r = h.factory({"--token-file", bad.string(), "status"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("admin token"), std::string::npos) << r.output;
  r = h.factory({"token", "create", "--tenant", "Not_A_Label"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("Not_A_Label"), std::string::npos) << r.output;
}

TEST(Spine, CommandsSayClearlyWhenTheCoordinatorIsDown) {
  TempDir dir("spine");
  CoordinatorHarness h(dir.path());
  h.start();
  h.stop();
  auto r = h.factory({"status"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("cannot reach the coordinator API"), std::string::npos) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << "one line: " << r.output;
}

// A guest that freezes (SIGSTOP: a hung VM, a dead network path) is detected
// by the ping/pong deadline, not by a TCP timeout hours later.
TEST(Spine, FrozenAgentIsDetectedByPingTimeoutAndComesBack) {
  TempDir dir("spine");
  CoordinatorHarness h(dir.path());
  auto cfg = slurp(h.config_path());
  cfg.replace(cfg.find("  idle_timeout: 10s\n"), 19, "  idle_timeout: 2s\n");
  ASSERT_TRUE(factory::write_file_atomic(h.config_path(), cfg).ok());
  h.start();
  AgentProcess agent(h, h.create_token("t1"));
  ASSERT_TRUE(eventually([&] { return h.agent_connected("t1"); }, 5s)) << agent.log();
  agent.proc().kill(SIGSTOP);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(eventually([&] { return !h.agent_connected("t1"); }, 10s)) << h.log();
  auto took =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  std::cout << "[ figures  ] frozen agent dropped after " << took.count()
            << " ms (idle_timeout 2s)\n";
  agent.proc().kill(SIGCONT);
  EXPECT_TRUE(eventually([&] { return h.agent_connected("t1"); }, 20s)) << agent.log();
}

// After an outage the backlog is replayed at a bounded rate, so a fleet coming
// back does not flood the coordinator that just recovered.
TEST(Spine, BacklogIsReplayedAtABoundedRate) {
  TempDir dir("spine");
  CoordinatorHarness h(dir.path());
  h.start();
  const uint64_t n = 600;
  const int rate = 200;
  AgentProcess agent(h, h.create_token("t1"),
                     named("agent", {"--synthetic-events", std::to_string(n), "--synthetic-rate",
                                     "5000", "--replay-rate", std::to_string(rate)}));
  ASSERT_TRUE(eventually([&] { return h.agent_connected("t1"); }, 5s));
  h.kill9();
  // The whole backlog piles up in the agent's spool while the coordinator is down.
  ASSERT_TRUE(eventually(
      [&] {
        auto log = slurp(agent.state_dir() / "spool" / "spool.log");
        return std::count(log.begin(), log.end(), '\n') >= static_cast<long>(n);
      },
      10s));
  size_t before = h.stored_events("t1").size();
  h.start();
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(eventually([&] { return h.stored_events("t1").size() >= n; }, 30s));
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double replayed = static_cast<double>(n - before);
  std::cout << "[ figures  ] replayed " << replayed << " events in " << secs << " s ("
            << replayed / secs << "/s, cap " << rate << "/s)\n";
  // One second's burst is allowed on top of the rate.
  EXPECT_GE(secs, (replayed - rate) / rate * 0.9) << "the replay exceeded its rate";
  EXPECT_EQ(h.stored_events("t1").size(), n);
}
