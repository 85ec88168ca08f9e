// The agent's self-update in a simulated guest (agent/upgrade; tests/guestsim,
// NOT a real guest: systemctl and systemd-run are the simulator's stand-ins,
// which record what they were asked and run nothing). The coordinator's
// binary download is a real HTTPS server on 127.0.0.1 (common/net's server)
// with a test CA (tests/fakes/testpki.py); the binaries are stand-ins too:
// small files carrying a version mark as a real build does
// (contract/agent_upgrade.hpp), never executed here. Real systemd runs these
// calls in the real-guest test (tests/e2e/vm_e2e.cpp).
//
// An Upgrader plays one binary at a time: the running version and
// /proc/self/exe are its options, so a test is the old agent taking the
// order, the new one confirming, or the old one again after a rollback. The
// guard is called as systemd would call it (run_upgrade_guard), with
// systemd's environment for ExecStopPost given by the test.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <fstream>
#include <future>
#include <map>
#include <sstream>
#include <thread>

#include "agent/link/spool.hpp"
#include "agent/upgrade/agent_binary.hpp"
#include "agent/upgrade/guard.hpp"
#include "agent/upgrade/upgrade_state.hpp"
#include "agent/upgrade/upgrader.hpp"
#include "common/durations.hpp"
#include "common/net/io_pool.hpp"
#include "common/net/server.hpp"
#include "common/pki.hpp"
#include "common/subprocess.hpp"
#include "contract/agent_upgrade.hpp"
#include "tests/guestsim/guest_sim.hpp"

namespace factory::testing {
namespace {

namespace fs = std::filesystem;
using agent::EventSpool;
using agent::GuardAction;
using agent::GuardContext;
using agent::GuardOutcome;
using agent::UpgradeOptions;
using agent::UpgradeOutcome;
using agent::UpgradePhase;
using agent::Upgrader;
using agent::UpgradeState;
using nlohmann::json;
using namespace std::chrono_literals;

const Clock::time_point kNow = *parse_rfc3339("2026-12-01T10:00:00Z");

// A stand-in for an agent build: a few bytes and the version mark with the
// version NUL-padded to its field, as a real build carries it.
std::string agent_build(const std::string& version, const std::string& body) {
  std::string field = version;
  field.resize(proto::kAgentVersionField, '\0');
  return "#!/bin/false\n" + body + "\n" + std::string(proto::kAgentVersionMark) + field + "\n";
}

void pki(const std::vector<std::string>& args) {
  std::vector<std::string> argv{"/usr/bin/python3",
                                (source_dir() / "tests/fakes/testpki.py").string()};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = run(argv);
  if (!r.ok()) setup_failed("testpki.py: " + r.output);
}

// The coordinator's binary download, over real HTTPS with a test CA.
class BinaryServer {
 public:
  explicit BinaryServer(const fs::path& dir) {
    fs::create_directories(dir);
    pki({"ca", dir.string(), "ca"});
    pki({"cert", dir.string(), "server", "ca", "factory-test-coordinator", "--san",
         "IP:127.0.0.1,DNS:localhost"});
    net::ServerOptions o;
    o.listen = "127.0.0.1:0";
    o.name = "binary";
    o.tls.cert_chain_pem = slurp(dir / "server.crt") + slurp(dir / "ca.crt");
    o.tls.key_pem = slurp(dir / "server.key");
    pool_ = std::make_unique<net::IoPool>(1);
    server_ = std::make_unique<net::Server>(*pool_, std::move(o));
    server_->on_http(net::immediate([this](const net::HttpRequestIn& req, const net::PeerInfo&) {
      ++requests_;
      std::lock_guard lk(mu_);
      if (req.path != "/v1/agent/binary" || body_.empty())
        return net::HttpResponseOut::error(404, "not_found", "no such file");
      net::HttpResponseOut r;
      r.content_type = "application/octet-stream";
      r.body = body_;
      return r;
    }));
    auto st = server_->start();
    if (!st.ok()) setup_failed("the binary server: " + st.error().message);
    runner_ = std::thread([p = pool_.get()] { p->run(); });
  }
  ~BinaryServer() {
    server_->stop();
    pool_->stop();
    runner_.join();
  }
  void serve(std::string bytes) {
    std::lock_guard lk(mu_);
    body_ = std::move(bytes);
  }
  std::string url() const {
    return "https://127.0.0.1:" + std::to_string(server_->port()) + "/v1/agent/binary";
  }
  int requests() const { return requests_; }

 private:
  std::unique_ptr<net::IoPool> pool_;
  std::unique_ptr<net::Server> server_;
  std::thread runner_;
  std::mutex mu_;
  std::string body_;
  std::atomic<int> requests_{0};
};

class AgentUpgradeInGuest : public ::testing::Test {
 protected:
  void SetUp() override {
    sim_ = std::make_unique<GuestSim>(dir_.path());
    // The PKI first: openssl is this machine's, not on the guest's PATH.
    server_ = std::make_unique<BinaryServer>(dir_ / "pki");
    path_ = std::make_unique<GuestSim::PathScope>(sim_->path());
    // The guest as cloud-init left it: the unit, and the agent a regular file.
    fs::create_directories(sim_->root() / "etc/systemd/system");
    std::ofstream(sim_->root() / "etc/systemd/system/factory-agent.service")
        << "[Unit]\nDescription=Factory guest agent\n[Service]\n"
           "ExecStart=/usr/local/bin/factory-agent --config /etc/factory/agent.yaml\n";
    fs::create_directories(binary().parent_path());
    std::ofstream(binary(), std::ios::binary) << kOld;
    fs::permissions(binary(), fs::perms(0755));
    server_->serve(kNew);
    open_spool();
  }
  void TearDown() override { path_.reset(); }

  void open_spool() {
    spool_.reset();
    auto s = EventSpool::open(dir_ / "spool", 1000);
    ASSERT_TRUE(s) << s.error().message;
    spool_ = std::move(*s);
  }

  fs::path binary() const { return sim_->root() / "usr/local/bin/factory-agent"; }
  fs::path upgrade_dir() const { return sim_->env().state_dir / "upgrade"; }
  fs::path state_file() const { return upgrade_dir() / "state.json"; }
  fs::path slot(const std::string& bytes) const {
    return upgrade_dir() / "bin" / agent::slot_name(pki::sha256_hex(bytes));
  }
  fs::path drop_in() const {
    return sim_->root() / "etc/systemd/system/factory-agent.service.d/50-factory-upgrade.conf";
  }
  fs::path timer_file() const {
    return sim_->root() / ".guestsim/state/timers/factory-agent-upgrade-deadline.timer";
  }

  // The running binary an Upgrader plays: its version and its executable.
  std::unique_ptr<Upgrader> agent_running(const std::string& version, const fs::path& exe,
                                          std::function<bool()> plan_busy = {},
                                          std::chrono::milliseconds plan_settle = 60s) {
    UpgradeOptions o;
    o.plan_busy = std::move(plan_busy);
    o.plan_settle = plan_settle;
    o.ca_file = (dir_ / "pki/ca.crt").string();
    o.running_version = version;
    o.self_exe = exe;
    o.now = [this] { return now_; };
    o.download_timeout = 5s;
    return std::make_unique<Upgrader>(sim_->env(), *spool_, o);
  }
  // The old agent, before the switch: /usr/local/bin/factory-agent, 0.1.0.
  std::unique_ptr<Upgrader> old_agent(std::function<bool()> plan_busy = {},
                                      std::chrono::milliseconds plan_settle = 60s) {
    auto u = agent_running("0.1.0", binary(), std::move(plan_busy), plan_settle);
    return u;
  }
  // The new one as systemd starts it after the switch: the candidate slot.
  std::unique_ptr<Upgrader> new_agent() { return agent_running("0.2.0", slot(kNew)); }
  // The old one again after a rollback: the stable slot.
  std::unique_ptr<Upgrader> stable_agent() { return agent_running("0.1.0", slot(kOld)); }

  json order(const std::string& id = "up-1") const {
    return proto::AgentUpgradeOrder{
        id, "0.2.0", pki::sha256_hex(kNew), server_->url(), static_cast<std::uint64_t>(kNew.size()),
        120}
        .to_json();
  }

  GuardOutcome guard(GuardAction a, std::map<std::string, std::string> systemd_env = {}) {
    GuardContext ctx;
    ctx.env = sim_->env();
    ctx.now = [this] { return now_; };
    ctx.getenv = [systemd_env](const char* name) {
      auto it = systemd_env.find(name);
      return it == systemd_env.end() ? std::string() : it->second;
    };
    return agent::run_upgrade_guard(a, state_file(), ctx);
  }
  // What systemd's ExecStopPost sees after the new binary exited with 1.
  static std::map<std::string, std::string> exited_1() {
    return {{"SERVICE_RESULT", "exit-code"}, {"EXIT_CODE", "exited"}, {"EXIT_STATUS", "1"}};
  }

  UpgradeState state() const {
    auto s = agent::load_upgrade_state(state_file());
    EXPECT_TRUE(s && *s) << (s ? "no state file" : s.error().message);
    return s && *s ? **s : UpgradeState{};
  }
  std::vector<json> events() const {
    std::vector<json> out;
    for (auto& e : spool_->pending_after(0, 1000)) out.push_back(e.body);
    return out;
  }
  // The stand-ins' calls (systemctl, systemd-run), one line each: "NAME ARGS".
  std::vector<std::string> systemd_calls() const {
    std::vector<std::string> out;
    std::istringstream in(sim_->calls_log());
    for (std::string line; std::getline(in, line);)
      if (line.rfind("systemctl ", 0) == 0 || line.rfind("systemd-run ", 0) == 0)
        out.push_back(line);
    return out;
  }
  std::vector<std::string> timer_argv() const {
    std::vector<std::string> out;
    std::istringstream in(slurp(timer_file()));
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
  }
  static std::ptrdiff_t index_of(const std::vector<std::string>& v, const std::string& s) {
    auto it = std::find(v.begin(), v.end(), s);
    return it == v.end() ? -1 : it - v.begin();
  }
  std::string guard_line(const std::string& action) const {
    return slot(kOld).string() + " upgrade-guard " + action + " --state " + state_file().string() +
           " --root " + sim_->root().string();
  }
  bool points_at(const fs::path& target) const {
    return fs::is_symlink(binary()) && fs::read_symlink(binary()) == target;
  }
  static mode_t mode_of(const fs::path& p) {
    struct stat st {};
    EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
    return st.st_mode & 07777;
  }

  // The old agent takes a good order: the state is "trying" from here.
  void installed() {
    ASSERT_EQ(old_agent()->handle(order()), UpgradeOutcome::restarting);
    ASSERT_EQ(state().phase, UpgradePhase::trying);
  }

  const std::string kOld = agent_build("0.1.0", "the build the guest runs");
  const std::string kNew = agent_build("0.2.0", "the build the coordinator orders") +
                           std::string(100000, 'x');  // more than one TLS record
  Clock::time_point now_ = kNow;
  TempDir dir_{"upgrade"};
  std::unique_ptr<GuestSim> sim_;
  std::unique_ptr<GuestSim::PathScope> path_;
  std::unique_ptr<BinaryServer> server_;
  std::unique_ptr<EventSpool> spool_;
};

// Real systemd SIGTERMs the agent as soon as it runs the restart job, while
// the agent's `systemctl restart --no-block` may still be running (seen on a
// real guest: the agent's stop ended that call and the upgrade was reported
// refused and undone after the switch). The stand-in holds the call until
// the test, doing what the agent's SIGTERM handler does (AgentRuntime::stop:
// a CommandStop), has begun the stop.
TEST_F(AgentUpgradeInGuest, TheStopItsOwnRestartCausesNeitherEndsNorUndoesTheUpgrade) {
  sim_->set_knob("agent_stopped_by_restart");
  const fs::path services = sim_->root() / ".guestsim/state/services";
  std::promise<void> handled;
  std::shared_future<void> done = handled.get_future().share();
  std::atomic<bool> stop_began{false};
  std::thread systemd([&] {
    while (!fs::exists(services / "factory-agent.stopping"))
      if (done.wait_for(10ms) == std::future_status::ready) return;
    CommandStop sigterm(2s);
    stop_began = true;
    std::ofstream(services / "factory-agent.stop-seen");
    done.wait();
  });
  const UpgradeOutcome outcome = old_agent()->handle(order());
  handled.set_value();
  systemd.join();

  EXPECT_TRUE(stop_began) << "the stand-in never asked for the stop";
  EXPECT_EQ(outcome, UpgradeOutcome::restarting);
  EXPECT_TRUE(points_at(slot(kNew)));
  EXPECT_EQ(state().phase, UpgradePhase::trying);
  EXPECT_TRUE(fs::exists(drop_in()));
  EXPECT_EQ(sim_->counter("systemctl.restart.factory-agent"), 1);
  // Installing, and nothing after it: no "refused" for a restart under way.
  auto ev = events();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0]["state"], "installing");
}

TEST_F(AgentUpgradeInGuest, AGoodOrderInstallsBesideTheOldBinaryAndAsksForARestart) {
  EXPECT_EQ(old_agent()->handle(order()), UpgradeOutcome::restarting);

  // The new binary in its slot, the old one kept in its own.
  EXPECT_EQ(slurp(slot(kNew)), kNew);
  EXPECT_EQ(mode_of(slot(kNew)), 0755u);
  EXPECT_EQ(slurp(slot(kOld)), kOld);
  EXPECT_EQ(mode_of(slot(kOld)), 0755u);
  // binary_path switched: a link to the new slot.
  EXPECT_TRUE(points_at(slot(kNew))) << fs::read_symlink(binary());

  // The drop-in runs the guard from the OLD binary, '-' so it never blocks a start.
  const std::string unit = slurp(drop_in());
  EXPECT_NE(unit.find("[Service]\nExecStartPre=-" + guard_line("pre-start") + "\n"),
            std::string::npos)
      << unit;
  EXPECT_NE(unit.find("\nExecStopPost=-" + guard_line("post-stop") + "\n"), std::string::npos)
      << unit;

  // The state, 0600: on trial until now + confirm_within_s.
  EXPECT_EQ(mode_of(state_file()), 0600u);
  UpgradeState s = state();
  EXPECT_EQ(s.upgrade_id, "up-1");
  EXPECT_EQ(s.from_version, "0.1.0");
  EXPECT_EQ(s.to_version, "0.2.0");
  EXPECT_EQ(s.from_sha256, pki::sha256_hex(kOld));
  EXPECT_EQ(s.to_sha256, pki::sha256_hex(kNew));
  EXPECT_EQ(s.stable, slot(kOld).string());
  EXPECT_EQ(s.candidate, slot(kNew).string());
  EXPECT_EQ(s.binary_path, "/usr/local/bin/factory-agent");
  ASSERT_TRUE(s.deadline);
  EXPECT_EQ(format_rfc3339(*s.deadline), "2026-12-01T10:02:00Z");
  EXPECT_EQ(s.confirm_within_s, 120);
  EXPECT_EQ(s.starts, 0);

  // systemd: reload (the drop-in), the timer running the OLD binary's guard
  // in 120 s, then the restart, in that order.
  const auto calls = systemd_calls();
  const auto reload = index_of(calls, "systemctl daemon-reload");
  const auto timer = index_of(calls,
                              "systemd-run --unit=factory-agent-upgrade-deadline --on-active=120s "
                              "--timer-property=AccuracySec=1s " +
                                  guard_line("deadline"));
  const auto restart = index_of(calls, "systemctl restart --no-block factory-agent.service");
  EXPECT_GE(reload, 0);
  EXPECT_GT(timer, reload);
  EXPECT_GT(restart, timer);
  // A stale timer of an earlier upgrade is cleared first.
  EXPECT_GE(index_of(calls, "systemctl stop factory-agent-upgrade-deadline.timer"), 0);
  EXPECT_GE(index_of(calls, "systemctl reset-failed factory-agent-upgrade-deadline.service"), 0);
  EXPECT_EQ(sim_->counter("systemctl.restart.factory-agent"), 1);

  // One durable event: installing.
  auto ev = events();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0]["kind"], "agent_upgrade");
  EXPECT_EQ(ev[0]["upgrade_id"], "up-1");
  EXPECT_EQ(ev[0]["state"], "installing");
  EXPECT_EQ(ev[0]["from_version"], "0.1.0");
  EXPECT_EQ(ev[0]["to_version"], "0.2.0");
  EXPECT_TRUE(proto::decode_agent_upgrade_event(ev[0])) << ev[0];
}

// Each way an order fails before the switch: the event says why, and the
// guest is as it was (binary_path the same regular file, no drop-in, no
// timer, no restart, no binary left in the slots).
struct Refusal {
  const char* name;
  std::function<void(json& order, BinaryServer& server)> spoil;
  const char* reason;  // in the refused event's reason
};

void PrintTo(const Refusal& r, std::ostream* os) {
  *os << r.name;
}

class RefusedOrder : public AgentUpgradeInGuest, public ::testing::WithParamInterface<Refusal> {};

TEST_P(RefusedOrder, EmitsRefusedAndChangesNothing) {
  json o = order();
  GetParam().spoil(o, *server_);
  EXPECT_EQ(old_agent()->handle(o), UpgradeOutcome::refused);

  EXPECT_FALSE(fs::is_symlink(binary()));
  EXPECT_EQ(slurp(binary()), kOld);
  EXPECT_FALSE(fs::exists(drop_in()));
  EXPECT_TRUE(systemd_calls().empty()) << sim_->calls_log();
  std::vector<std::string> left;
  for (auto& e : fs::directory_iterator(upgrade_dir() / "bin"))
    left.push_back(e.path().filename().string());
  EXPECT_TRUE(left.empty()) << left.front();

  auto ev = events();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0]["state"], "installing");
  EXPECT_EQ(ev[1]["state"], "refused");
  EXPECT_EQ(ev[1]["upgrade_id"], "up-1");
  const std::string reason = ev[1].value("reason", "");
  EXPECT_NE(reason.find(GetParam().reason), std::string::npos) << reason;
  EXPECT_TRUE(proto::decode_agent_upgrade_event(ev[1])) << ev[1];
  UpgradeState s = state();
  EXPECT_EQ(s.phase, UpgradePhase::refused);
  EXPECT_EQ(s.reason, reason);
  EXPECT_TRUE(s.reported);
}

INSTANTIATE_TEST_SUITE_P(
    Download, RefusedOrder,
    ::testing::Values(
        Refusal{"HashMismatch", [](json& o, BinaryServer&) { o["sha256"] = std::string(64, 'a'); },
                "SHA-256 is "},
        Refusal{"FewerBytesThanOrdered",
                [](json& o, BinaryServer&) { o["size"] = o["size"].get<std::uint64_t>() + 1; },
                "bytes, the order says"},
        Refusal{"MoreBytesThanOrdered",
                [](json& o, BinaryServer&) { o["size"] = o["size"].get<std::uint64_t>() - 1; },
                "more than the"},
        Refusal{"NotFound", [](json&, BinaryServer& s) { s.serve(""); }, "HTTP 404"},
        Refusal{"Unreachable",
                [](json& o, BinaryServer&) {
                  o["url"] = "https://127.0.0.1:" + std::to_string(free_loopback_port()) + "/x";
                },
                "download: "},
        Refusal{"ABinaryOfAnotherVersion",
                [](json& o, BinaryServer& s) {
                  const std::string other = agent_build("0.3.0", "not what was ordered");
                  s.serve(other);
                  o["sha256"] = pki::sha256_hex(other);
                  o["size"] = other.size();
                },
                "the downloaded binary is version 0.3.0, the order says 0.2.0"}),
    [](const auto& info) { return std::string(info.param.name); });

// The plan's step is the runtime's to tell (plan_busy stands in for the
// plan runner): the restart waits for it, a bounded time.
TEST_F(AgentUpgradeInGuest, TheRestartWaitsForAPlanStepToEnd) {
  std::atomic<int> asked{0};
  auto u = old_agent([&] { return ++asked < 3; }, 10s);
  EXPECT_EQ(u->handle(order()), UpgradeOutcome::restarting);
  EXPECT_EQ(asked, 3) << "asked until the step was over";
  EXPECT_EQ(sim_->counter("systemctl.restart.factory-agent"), 1);
}

TEST_F(AgentUpgradeInGuest, TheRestartWaitsNoLongerThanPlanSettle) {
  // A step that never ends (a 20-minute driver build): the restart goes
  // ahead, and the journal resumes the step in the new binary.
  const auto start = std::chrono::steady_clock::now();
  auto u = old_agent([] { return true; }, 300ms);
  EXPECT_EQ(u->handle(order()), UpgradeOutcome::restarting);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 10s);
  EXPECT_EQ(sim_->counter("systemctl.restart.factory-agent"), 1);
}

TEST_F(AgentUpgradeInGuest, AStopWhileWaitingForThePlanChangesNothing) {
  auto u = old_agent([] { return true; }, 60s);
  auto outcome = std::async(std::launch::async, [&] { return u->handle(order()); });
  ASSERT_TRUE(
      eventually([&] { return fs::exists(upgrade_dir() / "bin" / slot(kNew).filename()); }));
  u->stop();  // SIGTERM while the step runs
  ASSERT_EQ(outcome.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(outcome.get(), UpgradeOutcome::refused);
  EXPECT_FALSE(fs::is_symlink(binary()));
  EXPECT_FALSE(fs::exists(drop_in()));
  EXPECT_FALSE(fs::exists(slot(kNew)));
  EXPECT_TRUE(systemd_calls().empty());
  auto ev = events();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[1]["state"], "refused");
  EXPECT_EQ(ev[1]["reason"], "the agent stopped before 0.2.0 was installed");
}

TEST_F(AgentUpgradeInGuest, TheSameIdActsOnceAlsoAfterARestart) {
  installed();
  const auto calls = systemd_calls().size();
  EXPECT_EQ(old_agent()->handle(order()), UpgradeOutcome::repeated);
  // A new Upgrader is the agent after a restart: the state file decides.
  open_spool();
  EXPECT_EQ(new_agent()->handle(order()), UpgradeOutcome::repeated);
  EXPECT_EQ(server_->requests(), 1);
  EXPECT_EQ(systemd_calls().size(), calls);
  EXPECT_EQ(events().size(), 1u);
  EXPECT_EQ(state().phase, UpgradePhase::trying);
}

TEST_F(AgentUpgradeInGuest, ARefusedIdIsNotTriedAgain) {
  json bad = order();
  bad["sha256"] = std::string(64, 'b');
  ASSERT_EQ(old_agent()->handle(bad), UpgradeOutcome::refused);
  EXPECT_EQ(old_agent()->handle(bad), UpgradeOutcome::repeated);
  EXPECT_EQ(server_->requests(), 1);
  EXPECT_EQ(events().size(), 2u);
}

TEST_F(AgentUpgradeInGuest, ANewIdWhileOneIsOnTrialIsRefused) {
  installed();
  EXPECT_EQ(old_agent()->handle(order("up-2")), UpgradeOutcome::refused);
  auto ev = events();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[1]["upgrade_id"], "up-2");
  EXPECT_EQ(ev[1]["state"], "refused");
  EXPECT_EQ(ev[1]["reason"], "upgrade up-1 to 0.2.0 is still on trial until 2026-12-01T10:02:00Z");
  // The trial is untouched.
  UpgradeState s = state();
  EXPECT_EQ(s.upgrade_id, "up-1");
  EXPECT_EQ(s.phase, UpgradePhase::trying);
  EXPECT_TRUE(points_at(slot(kNew)));
  EXPECT_EQ(server_->requests(), 1);
}

TEST_F(AgentUpgradeInGuest, AnInvalidOrderTouchesNothing) {
  auto with = [this](const char* key, json v) {
    json o = order();
    o[key] = std::move(v);
    return o;
  };
  json no_id = order();
  no_id.erase("upgrade_id");
  for (const json& o :
       {with("sha256", "not-a-hash"), with("url", "http://127.0.0.1/x"),
        with("upgrade_id", "../../etc"), with("size", 0), with("confirm_within_s", 5),
        with("version", "-rf"), no_id, json::array()}) {
    EXPECT_EQ(old_agent()->handle(o), UpgradeOutcome::invalid) << o;
  }
  EXPECT_FALSE(fs::exists(state_file()));
  EXPECT_TRUE(events().empty());
  EXPECT_TRUE(systemd_calls().empty());
  EXPECT_EQ(server_->requests(), 0);
  EXPECT_FALSE(fs::is_symlink(binary()));
}

TEST_F(AgentUpgradeInGuest, AnOrderForTheRunningBinaryIsUpgradedAtOnce) {
  json o = order("same");
  o["version"] = "0.1.0";
  o["sha256"] = pki::sha256_hex(kOld);
  o["size"] = kOld.size();
  EXPECT_EQ(old_agent()->handle(o), UpgradeOutcome::current);
  auto ev = events();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0]["state"], "upgraded");
  EXPECT_EQ(server_->requests(), 0);
  EXPECT_TRUE(systemd_calls().empty());
  EXPECT_EQ(state().phase, UpgradePhase::confirmed);
}

TEST_F(AgentUpgradeInGuest, PreStartCountsStartsAndRollsBackAtTheFourth) {
  installed();
  // systemd restarts the unit: the old binary's stop, then three starts of
  // the new one that each exit 1 (Restart=on-failure).
  EXPECT_EQ(
      guard(GuardAction::post_stop,
            {{"SERVICE_RESULT", "success"}, {"EXIT_CODE", "killed"}, {"EXIT_STATUS", "TERM"}}),
      GuardOutcome::recorded);
  for (int start = 1; start <= 3; ++start) {
    EXPECT_EQ(guard(GuardAction::pre_start), GuardOutcome::counted) << "start " << start;
    EXPECT_EQ(state().starts, start);
    EXPECT_TRUE(points_at(slot(kNew)));
    EXPECT_EQ(guard(GuardAction::post_stop, exited_1()), GuardOutcome::recorded);
  }
  EXPECT_EQ(guard(GuardAction::pre_start), GuardOutcome::rolled_back);
  // ExecStart, right after, runs the old binary again.
  EXPECT_TRUE(points_at(slot(kOld))) << fs::read_symlink(binary());
  EXPECT_EQ(slurp(binary()), kOld);
  UpgradeState s = state();
  EXPECT_EQ(s.phase, UpgradePhase::rolled_back);
  EXPECT_EQ(s.reason, "0.2.0 exited with status 1 at start 3 times (last: exit-code)");
  EXPECT_FALSE(s.reported);
  // The timer's work is done.
  EXPECT_FALSE(fs::exists(sim_->root() /
                          ".guestsim/state/services/factory-agent-upgrade-deadline.timer.result"));
  // Later starts of the old binary: nothing more to do.
  EXPECT_EQ(guard(GuardAction::pre_start), GuardOutcome::nothing);
}

TEST_F(AgentUpgradeInGuest, PreStartAtOrAfterTheDeadlineRollsBack) {
  installed();
  now_ = kNow + 120s;
  EXPECT_EQ(guard(GuardAction::pre_start), GuardOutcome::rolled_back);
  EXPECT_TRUE(points_at(slot(kOld)));
  EXPECT_EQ(state().reason, "0.2.0 sent no health report within 120 s");
}

TEST_F(AgentUpgradeInGuest, PreStartArmsTheTimerAgainAfterAReboot) {
  installed();
  // A reboot takes transient units with it.
  ASSERT_TRUE(sim_->sh({"systemctl", "stop", "factory-agent-upgrade-deadline.timer"}).ok());
  now_ = kNow + 50s;
  EXPECT_EQ(guard(GuardAction::pre_start), GuardOutcome::rearmed);
  const auto argv = timer_argv();
  ASSERT_GE(argv.size(), 6u) << slurp(timer_file());
  EXPECT_EQ(argv[1], "--on-active=70s");
  EXPECT_EQ(argv[3], slot(kOld).string());
  EXPECT_EQ(argv[5], "deadline");
  EXPECT_EQ(sim_->counter("systemd-run.factory-agent-upgrade-deadline"), 2);
}

TEST_F(AgentUpgradeInGuest, PostStopRecordsWhatSystemdSaid) {
  installed();
  EXPECT_EQ(guard(GuardAction::post_stop,
                  {{"SERVICE_RESULT", "signal"}, {"EXIT_CODE", "killed"}, {"EXIT_STATUS", "SEGV"}}),
            GuardOutcome::recorded);
  ASSERT_TRUE(state().last_exit);
  EXPECT_EQ(*state().last_exit, (agent::ServiceExit{"signal", "killed", "SEGV"}));
  EXPECT_EQ(agent::failed_starts_reason(state(), 2),
            "0.2.0 was killed by signal SEGV at start 2 times (last: signal)");
}

TEST_F(AgentUpgradeInGuest, TheDeadlineRollsBackAndAsksForARestart) {
  installed();
  const long restarts = sim_->counter("systemctl.restart.factory-agent");
  now_ = kNow + 121s;
  EXPECT_EQ(guard(GuardAction::deadline), GuardOutcome::rolled_back);
  EXPECT_TRUE(points_at(slot(kOld)));
  EXPECT_EQ(state().phase, UpgradePhase::rolled_back);
  EXPECT_EQ(state().reason, "0.2.0 sent no health report within 120 s");
  EXPECT_EQ(sim_->counter("systemctl.restart.factory-agent"), restarts + 1);
}

TEST_F(AgentUpgradeInGuest, TheDeadlineDoesNothingOnceConfirmed) {
  installed();
  auto candidate = new_agent();
  candidate->on_start();
  ASSERT_TRUE(candidate->confirm());
  const long restarts = sim_->counter("systemctl.restart.factory-agent");
  now_ = kNow + 121s;
  EXPECT_EQ(guard(GuardAction::deadline), GuardOutcome::nothing);
  EXPECT_EQ(guard(GuardAction::pre_start), GuardOutcome::nothing);
  EXPECT_TRUE(points_at(slot(kNew)));
  EXPECT_EQ(state().phase, UpgradePhase::confirmed);
  EXPECT_EQ(sim_->counter("systemctl.restart.factory-agent"), restarts);
}

TEST_F(AgentUpgradeInGuest, TheNewBinaryConfirmsOnceItsHealthWentOut) {
  installed();
  // A slot of an older upgrade, which the confirmation prunes.
  const fs::path older = upgrade_dir() / "bin/factory-agent-0123456789abcdef";
  std::ofstream(older) << agent_build("0.0.9", "an older build");
  open_spool();
  auto candidate = new_agent();
  candidate->on_start();
  EXPECT_TRUE(candidate->on_trial());
  EXPECT_EQ(events().size(), 1u) << "nothing new at start";
  // The link's callback, on its thread: the confirmation runs on the upgrader's.
  candidate->on_health_sent();
  ASSERT_TRUE(eventually([&] { return state().phase == UpgradePhase::confirmed; }, 10s));
  ASSERT_TRUE(eventually([&] { return state().reported; }, 10s));
  EXPECT_FALSE(candidate->on_trial());
  candidate->on_health_sent();  // every later sample: nothing more
  candidate.reset();

  auto ev = events();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[1]["state"], "upgraded");
  EXPECT_EQ(ev[1]["from_version"], "0.1.0");
  EXPECT_EQ(ev[1]["to_version"], "0.2.0");
  EXPECT_GE(index_of(systemd_calls(), "systemctl stop factory-agent-upgrade-deadline.timer"), 0);
  EXPECT_FALSE(fs::exists(older));
  EXPECT_TRUE(fs::exists(slot(kNew)));
  EXPECT_TRUE(fs::exists(slot(kOld))) << "the previous binary stays for a rollback by hand";

  // The next start of the same binary: nothing to report again.
  auto again = new_agent();
  again->on_start();
  EXPECT_FALSE(again->on_trial());
  EXPECT_TRUE(again->confirm()) << "confirmed already";
  EXPECT_EQ(events().size(), 2u);
}

TEST_F(AgentUpgradeInGuest, TheOldBinaryNeverConfirms) {
  installed();
  auto old = stable_agent();
  EXPECT_FALSE(old->confirm());
  EXPECT_EQ(state().phase, UpgradePhase::trying);
}

TEST_F(AgentUpgradeInGuest, ARollbackIsReportedOnceAcrossTwoStarts) {
  installed();
  now_ = kNow + 121s;
  ASSERT_EQ(guard(GuardAction::deadline), GuardOutcome::rolled_back);
  // The old binary starts again (the restart the guard asked for).
  open_spool();
  stable_agent()->on_start();
  auto ev = events();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[1]["state"], "rolled_back");
  EXPECT_EQ(ev[1]["from_version"], "0.1.0");
  EXPECT_EQ(ev[1]["to_version"], "0.2.0");
  EXPECT_EQ(ev[1]["reason"], "0.2.0 sent no health report within 120 s");
  EXPECT_TRUE(proto::decode_agent_upgrade_event(ev[1])) << ev[1];
  EXPECT_TRUE(state().reported);
  // And once more, after another restart: nothing new.
  open_spool();
  stable_agent()->on_start();
  EXPECT_EQ(events().size(), 2u);
}

TEST_F(AgentUpgradeInGuest, TheOldBinaryStartingMidTrialEndsTheTrial) {
  installed();
  // The agent stopped after the switch was written but the old binary runs
  // (binary_path put back by hand, say): the trial is over, and said so.
  stable_agent()->on_start();
  EXPECT_TRUE(points_at(slot(kOld)));
  UpgradeState s = state();
  EXPECT_EQ(s.phase, UpgradePhase::rolled_back);
  EXPECT_TRUE(s.reported);
  auto ev = events();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[1]["state"], "rolled_back");
  EXPECT_EQ(ev[1]["reason"], "0.2.0 did not start: 0.1.0 started instead, before 0.2.0 ran");
}

TEST_F(AgentUpgradeInGuest, AnOrderCutShortByAStopIsRefusedAtTheNextStart) {
  // What an agent stopped mid-download leaves: the order's state, installing.
  UpgradeState s;
  s.upgrade_id = "up-1";
  s.from_version = "0.1.0";
  s.to_version = "0.2.0";
  s.phase = UpgradePhase::installing;
  ASSERT_TRUE(agent::save_upgrade_state(state_file(), s).ok());
  old_agent()->on_start();
  auto ev = events();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0]["state"], "refused");
  EXPECT_EQ(ev[0]["reason"], "the agent stopped before 0.2.0 was installed");
  EXPECT_FALSE(fs::is_symlink(binary()));
  old_agent()->on_start();
  EXPECT_EQ(events().size(), 1u);
}

TEST_F(AgentUpgradeInGuest, TheStateKeepsKeysANewerBinaryWrote) {
  installed();
  json j = json::parse(slurp(state_file()));
  j["written_by_a_newer_build"] = {{"x", 1}};
  std::ofstream(state_file(), std::ios::trunc) << j.dump();
  ASSERT_EQ(guard(GuardAction::pre_start), GuardOutcome::counted);
  json after = json::parse(slurp(state_file()));
  EXPECT_EQ(after["written_by_a_newer_build"], j["written_by_a_newer_build"]);
  EXPECT_EQ(after["starts"], 1);
}

}  // namespace
}  // namespace factory::testing
