// Credentials over time, on the real binaries: `factory serve`, `factory`
// and `factory-agent` all run under libfaketime (Debian's faketime) and share
// one fake clock, a FAKETIME_TIMESTAMP_FILE that the test rewrites to jump
// the wall clock forward while they run.
//
// Why LD_PRELOAD reaches every clock read: both binaries link glibc
// dynamically (only libstdc++ and libgcc are linked in, FACTORY_STATIC_LINK),
// so libfaketime interposes clock_gettime() and time() for the statically
// linked libstdc++'s system_clock and OpenSSL's certificate checks alike.
// Each test also proves it took: the agent logs that its certificate expired,
// which only the fake clock can make true within a test's minutes.
//
// Only the wall clock moves (FAKETIME_DONT_FAKE_MONOTONIC): a clock set
// forward, or a host resumed after weeks, leaves the monotonic clock alone,
// and the binaries' timers and deadlines with it. FAKETIME_CACHE_DURATION=1:
// each process sees a jump within a second, without rereading the file on
// every clock read as FAKETIME_NO_CACHE would.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <thread>

#include "common/atomic_file.hpp"
#include "tests/support/coordinator_harness.hpp"

using namespace factory::testing;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

class SharedFakeClock {
 public:
  explicit SharedFakeClock(fs::path file) : file_(std::move(file)) {
    if (!fs::exists(FACTORY_FAKETIME_LIB))
      setup_failed(std::string("libfaketime is not installed (") + FACTORY_FAKETIME_LIB +
                   "): scripts/install-deps.sh --test installs Debian's faketime");
    set("+0");
  }
  // libfaketime's offset syntax: "+31d", "+100d", "+0".
  void set(const std::string& offset) {
    ASSERT_TRUE(factory::write_file_atomic(file_, offset + "\n", 0644).ok());
  }
  std::map<std::string, std::string> env() const {
    return {{"LD_PRELOAD", FACTORY_FAKETIME_LIB},
            {"FAKETIME_TIMESTAMP_FILE", file_.string()},
            {"FAKETIME_CACHE_DURATION", "1"},
            {"FAKETIME_DONT_FAKE_MONOTONIC", "1"}};
  }

 private:
  fs::path file_;
};

AgentOptions on_clock(const SharedFakeClock& clock, const std::string& name = "agent") {
  AgentOptions o;
  o.state_dir_name = name;
  o.extra_args = {"--link-only"};
  o.env = clock.env();
  return o;
}

// After a jump the coordinator serves an expired certificate until its next
// wall-clock check (coordinator.hpp, kRenewalCheckEvery) renews it; the CLI
// verifies it like any client, so this waits for that renewal.
bool status_works(CoordinatorHarness& h) {
  return eventually([&] { return h.factory({"status", "-o", "json"}).exit_code == 0; }, 30s, 500ms);
}

// An enrolled agent, connected, then stopped as a VM is shut off.
std::unique_ptr<AgentProcess> enroll_then_stop(CoordinatorHarness& h, const SharedFakeClock& clock,
                                               const std::string& tenant) {
  auto agent = std::make_unique<AgentProcess>(h, h.create_token(tenant), on_clock(clock, tenant));
  EXPECT_TRUE(eventually([&] { return h.agent_connected(tenant); }, 10s)) << agent->log();
  EXPECT_FALSE(fs::exists(agent->token_file())) << "enrolled: the token is spent and removed";
  agent->proc().stop();
  return agent;
}

}  // namespace

TEST(CredentialsOverTime, AgentOffFor31DaysComesBackWithoutAToken) {
  TempDir dir("creds");
  SharedFakeClock clock(dir / "clock");
  CoordinatorHarness h(dir.path());
  h.set_env(clock.env());
  h.start();
  auto agent = enroll_then_stop(h, clock, "t1");
  auto first = nlohmann::json::parse(slurp(agent->state_dir() / "identity.json"));

  // A month on, with the coordinator running all along: its 30-day serving
  // certificate and the agent's 24 h client certificate have both expired.
  clock.set("+31d");
  ASSERT_TRUE(status_works(h)) << "the coordinator renews its own certificate by the wall clock\n"
                               << h.log();
  EXPECT_NE(h.log().find("renewed the serving certificate"), std::string::npos);

  agent->restart();
  ASSERT_TRUE(eventually([&] { return h.agent_connected("t1"); }, 20s)) << agent->log() << h.log();
  const std::string log = agent->log();
  EXPECT_NE(log.find("the certificate expired at"), std::string::npos)
      << "the agent saw the fake clock (LD_PRELOAD reached it)\n"
      << log;
  EXPECT_NE(log.find("certificate renewed"), std::string::npos) << log;
  EXPECT_EQ(log.find("enrolled as tenant", log.find("---- restart")), std::string::npos)
      << "it came back on its old identity, not by enrolling again";
  EXPECT_FALSE(fs::exists(agent->token_file()));
  auto now = nlohmann::json::parse(slurp(agent->state_dir() / "identity.json"));
  EXPECT_NE(now["certificate"], first["certificate"]);
  EXPECT_EQ(now["agent_id"], first["agent_id"]);
  // The coordinator let the expired certificate renew and nothing else.
  EXPECT_NE(h.log().find("renewed the certificate of t1"), std::string::npos) << h.log();

  auto status = h.factory({"status", "-o", "json"});
  ASSERT_EQ(status.exit_code, 0) << status.output;
  auto t = h.tenant("t1");
  ASSERT_TRUE(t);
  EXPECT_EQ((*t)["agent"]["state"], "connected");
  EXPECT_EQ((*t)["agent"]["agent_id"], first["agent_id"]);
}

TEST(CredentialsOverTime, PastTheGraceTheRefusalNamesTheFixAndTheFixWorks) {
  TempDir dir("creds");
  SharedFakeClock clock(dir / "clock");
  CoordinatorHarness h(dir.path());  // agents.renewal_grace: the default, 90d
  h.set_env(clock.env());
  h.start();
  auto agent = enroll_then_stop(h, clock, "t1");

  clock.set("+100d");
  ASSERT_TRUE(status_works(h)) << h.log();
  agent->restart();
  EXPECT_EQ(agent->proc().wait(), 3) << "a refusal no retry can fix: exit 3\n" << agent->log();
  const std::string log = agent->log();
  EXPECT_NE(log.find("the certificate expired at"), std::string::npos) << log;
  EXPECT_NE(log.find("can no longer be renewed"), std::string::npos) << log;
  EXPECT_NE(log.find("agents.renewal_grace"), std::string::npos) << log;
  EXPECT_NE(log.find("factory token create --tenant t1"), std::string::npos)
      << "the refusal names the command that fixes it\n"
      << log;
  EXPECT_NE(log.find(agent->token_file().string()), std::string::npos)
      << "and where the new token goes\n"
      << log;
  EXPECT_FALSE(h.agent_connected("t1"));

  // The fix, as the message says: a new token where the agent looks for it.
  auto tok = h.create_token("t1");
  ASSERT_TRUE(
      factory::write_file_atomic(agent->token_file(), tok.value("token", "") + "\n", 0600).ok());
  agent->restart();
  EXPECT_TRUE(eventually([&] { return h.agent_connected("t1"); }, 20s)) << agent->log();
  EXPECT_TRUE(fs::exists(agent->state_dir() / "identity.refused.json"));
}

TEST(CredentialsOverTime, RevokedAgentsNeverComeBackThisWay) {
  TempDir dir("creds");
  SharedFakeClock clock(dir / "clock");
  CoordinatorHarness h(dir.path());
  h.set_env(clock.env());
  h.start();
  // Two agents, both off: one tenant deleted (which revokes its agent), one
  // whose agent identity was revoked with the tenant kept.
  auto deleted = enroll_then_stop(h, clock, "gone");
  auto revoked = enroll_then_stop(h, clock, "kept");
  auto del = h.factory({"tenant", "delete", "gone"});
  ASSERT_EQ(del.exit_code, 0) << del.output;
  h.stop();
  auto rec = h.stored_record("kept");
  ASSERT_TRUE(rec);
  (*rec)["agent"]["cert_serials"] = nlohmann::json::array();
  (*rec)["agent"]["revoked_at"] = "2026-01-01T00:00:00Z";
  h.write_stored_record(*rec);
  h.start();

  clock.set("+31d");
  ASSERT_TRUE(status_works(h)) << h.log();
  deleted->restart();
  revoked->restart();
  EXPECT_EQ(deleted->proc().wait(), 3) << deleted->log();
  EXPECT_EQ(revoked->proc().wait(), 3) << revoked->log();
  EXPECT_NE(deleted->log().find("tenant gone no longer exists"), std::string::npos)
      << deleted->log();
  EXPECT_NE(revoked->log().find("was revoked or replaced"), std::string::npos) << revoked->log();
  // Neither got a certificate: the expired one renewed nothing.
  EXPECT_EQ(h.log().find("renewed the certificate of"), std::string::npos) << h.log();
  EXPECT_FALSE(h.agent_connected("kept"));
  EXPECT_FALSE(h.tenant("gone"));
}

TEST(CredentialsOverTime, StatusWarnsAMonthBeforeTheCaExpires) {
  TempDir dir("creds");
  SharedFakeClock clock(dir / "clock");
  CoordinatorHarness h(dir.path());
  h.set_env(clock.env());
  h.start();
  auto quiet = h.factory({"status"});
  ASSERT_EQ(quiet.exit_code, 0) << quiet.output;
  EXPECT_EQ(quiet.output.find("warning:"), std::string::npos) << quiet.output;

  // The CA lives ten years (3650 days, enroll/ca.cpp). 31 days before its
  // end: still quiet.
  clock.set("+3619d");
  ASSERT_TRUE(status_works(h)) << h.log();
  auto before = h.factory({"status"});
  ASSERT_EQ(before.exit_code, 0) << before.output;
  EXPECT_EQ(before.output.find("warning:"), std::string::npos) << before.output;
  // 20 days before: warned, on stderr (the table or document on stdout stays whole).
  clock.set("+3630d");
  ASSERT_TRUE(status_works(h)) << h.log();
  auto warned = h.factory({"status"});
  ASSERT_EQ(warned.exit_code, 0) << warned.output;
  EXPECT_NE(warned.output.find("warning: the coordinator's CA"), std::string::npos)
      << warned.output;
  EXPECT_NE(warned.output.find("(in 19 days)"), std::string::npos) << warned.output;
}

TEST(CredentialsOverTime, AnEnrolledAgentRetriesWhenTheCoordinatorFailsVerification) {
  // Not a refusal of the agent: its coordinator's certificate does not verify
  // (here another CA answers on its address, as after a botched restore).
  // Waiting can fix that, so the agent retries with backoff instead of
  // exiting 3, and comes back once the right coordinator answers again.
  TempDir dir("creds");
  CoordinatorHarness h(dir.path());
  h.start();
  AgentOptions o;
  o.extra_args = {"--link-only"};
  AgentProcess agent(h, h.create_token("t1"), o);
  ASSERT_TRUE(eventually([&] { return h.agent_connected("t1"); }, 10s)) << agent.log();
  h.stop();
  fs::rename(h.state_dir(), dir / "state.saved");
  h.start();  // a new CA, a new serving certificate
  ASSERT_TRUE(eventually(
      [&] {
        auto log = agent.log();
        size_t n = 0;
        for (size_t p = log.find("failed verification"); p != std::string::npos;
             p = log.find("failed verification", p + 1))
          ++n;
        return n >= 2;
      },
      30s))
      << agent.log();
  EXPECT_TRUE(agent.proc().running()) << "retrying, not exit 3\n" << agent.log();
  h.stop();
  fs::remove_all(h.state_dir());
  fs::rename(dir / "state.saved", h.state_dir());
  h.start();
  EXPECT_TRUE(eventually([&] { return h.agent_connected("t1"); }, 30s)) << agent.log();
}
