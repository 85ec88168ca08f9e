// Maintenance notices in the simulated guest (agent/cli/maintenance.hpp;
// tests/guestsim, NOT a real guest): a notice becomes the file the guest's
// users read, one `wall` (the stand-in's log) and one durable event in a real
// spool; the coordinator's resend, also to a restarted agent, does nothing
// more; a cancel undoes it; an invalid notice does nothing at all.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <regex>
#include <sstream>

#include "agent/cli/maintenance.hpp"
#include "agent/cli/runtime.hpp"
#include "common/durations.hpp"
#include "tests/guestsim/guest_sim.hpp"
#include "tests/support/captured_log.hpp"

namespace factory::testing {
namespace {

namespace fs = std::filesystem;
using agent::EventSpool;
using agent::MaintenanceNotices;
using agent::MaintenanceOptions;
using agent::MaintenanceOutcome;
using nlohmann::json;
using namespace std::chrono_literals;

using factory::testing::CapturedLog;

// The notice's clock: half an hour before its deadline.
const Clock::time_point kNow = *parse_rfc3339("2026-11-30T08:30:00Z");

json notice(const std::string& state = "scheduled", const std::string& id = "drain-42") {
  return {{"action", "maintenance"},
          {"notice_id", id},
          {"state", state},
          {"node", "gpu-node-3"},
          {"deadline", "2026-11-30T09:00:00Z"},
          {"message", "Host kernel update."}};
}

class MaintenanceNoticeInGuest : public ::testing::Test {
 protected:
  void SetUp() override {
    sim_ = std::make_unique<GuestSim>(dir_.path());
    open_spool();
  }
  void open_spool() {
    spool_.reset();
    auto s = EventSpool::open(dir_ / "spool", 1000);
    ASSERT_TRUE(s) << s.error().message;
    spool_ = std::move(*s);
  }
  // A handler as the agent makes one; a new one is the agent after a restart.
  std::unique_ptr<MaintenanceNotices> handler() {
    MaintenanceOptions o;
    o.now = [] { return kNow; };
    return std::make_unique<MaintenanceNotices>(sim_->env(), *spool_, o);
  }
  fs::path file() const { return sim_->root() / "run/factory/maintenance"; }
  std::vector<json> events() const {
    std::vector<json> out;
    for (auto& e : spool_->pending_after(0, 1000)) out.push_back(e.body);
    return out;
  }
  long walls() const { return sim_->counter("wall"); }

  TempDir dir_{"maint"};
  std::unique_ptr<GuestSim> sim_;
  std::unique_ptr<EventSpool> spool_;
};

TEST_F(MaintenanceNoticeInGuest, ANoticeIsTheFileOneWallAndOneEvent) {
  auto path = sim_->activate();
  auto h = handler();
  EXPECT_EQ(h->file(), file());
  EXPECT_EQ(h->handle(notice()), MaintenanceOutcome::recorded);

  // The file, for the customer's users and scripts: readable by all.
  ASSERT_TRUE(fs::exists(file()));
  auto held = json::parse(slurp(file()));
  EXPECT_EQ(held, json({{"notice_id", "drain-42"},
                        {"node", "gpu-node-3"},
                        {"deadline", "2026-11-30T09:00:00Z"},
                        {"message", "Host kernel update."},
                        {"received_at", "2026-11-30T08:30:00Z"}}));
  struct stat st {};
  ASSERT_EQ(::stat(file().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0644u);

  // One wall, through the stand-in (never this machine's terminals).
  EXPECT_EQ(walls(), 1);
  const std::string wall = sim_->wall_log();
  EXPECT_TRUE(std::regex_match(
      wall, std::regex("[0-9]+\\.[0-9]+ Factory: this VM will be stopped for host maintenance on "
                       "gpu-node-3 at 2026-11-30T09:00:00Z \\(in 30 minutes\\)\\. Save your "
                       "work\\. Host kernel update\\.\n")))
      << wall;

  // One durable event.
  auto ev = events();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0]["kind"], "maintenance");
  EXPECT_EQ(ev[0]["notice_id"], "drain-42");
  EXPECT_EQ(ev[0]["state"], "received");
  EXPECT_EQ(ev[0]["node"], "gpu-node-3");
  EXPECT_EQ(ev[0]["deadline"], "2026-11-30T09:00:00Z");
  EXPECT_FALSE(ev[0].value("time", "").empty());
}

TEST_F(MaintenanceNoticeInGuest, TheResendDoesNothingMoreEvenAfterARestart) {
  auto path = sim_->activate();
  ASSERT_EQ(handler()->handle(notice()), MaintenanceOutcome::recorded);
  const std::string written = slurp(file());
  const auto mtime = fs::last_write_time(file());

  // After a reconnection: the same handler.
  auto h = handler();
  EXPECT_EQ(h->handle(notice()), MaintenanceOutcome::repeated);
  EXPECT_EQ(h->handle(notice()), MaintenanceOutcome::repeated);
  // After an agent restart: a new handler, and the spool opened again.
  h.reset();
  open_spool();
  EXPECT_EQ(handler()->handle(notice()), MaintenanceOutcome::repeated);

  EXPECT_EQ(slurp(file()), written);
  EXPECT_EQ(fs::last_write_time(file()), mtime) << "rewritten";
  EXPECT_EQ(walls(), 1);
  EXPECT_EQ(events().size(), 1u);
}

TEST_F(MaintenanceNoticeInGuest, ANewDeadlineIsNews) {
  auto path = sim_->activate();
  auto h = handler();
  ASSERT_EQ(h->handle(notice()), MaintenanceOutcome::recorded);
  json later = notice();
  later["deadline"] = "2026-11-30T10:00:00Z";
  EXPECT_EQ(h->handle(later), MaintenanceOutcome::recorded);
  EXPECT_EQ(json::parse(slurp(file()))["deadline"], "2026-11-30T10:00:00Z");
  EXPECT_EQ(walls(), 2);
  EXPECT_NE(sim_->wall_log().find("at 2026-11-30T10:00:00Z (in 90 minutes)"), std::string::npos);
  ASSERT_EQ(events().size(), 2u);
  EXPECT_EQ(events()[1]["deadline"], "2026-11-30T10:00:00Z");
}

TEST_F(MaintenanceNoticeInGuest, CancelledRemovesTheFileWithOneWallAndOneEvent) {
  auto path = sim_->activate();
  ASSERT_EQ(handler()->handle(notice()), MaintenanceOutcome::recorded);
  auto h = handler();
  EXPECT_EQ(h->handle(notice("cancelled")), MaintenanceOutcome::cancelled);
  EXPECT_FALSE(fs::exists(file()));
  EXPECT_EQ(walls(), 2);
  EXPECT_NE(sim_->wall_log().find(" Factory: maintenance cancelled: this VM will not be stopped "
                                  "for host maintenance on gpu-node-3 at 2026-11-30T09:00:00Z.\n"),
            std::string::npos)
      << sim_->wall_log();
  auto ev = events();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[1]["kind"], "maintenance");
  EXPECT_EQ(ev[1]["notice_id"], "drain-42");
  EXPECT_EQ(ev[1]["state"], "cancelled");

  // Its resend: the notice is no longer held, nothing more.
  EXPECT_EQ(h->handle(notice("cancelled")), MaintenanceOutcome::unknown);
  EXPECT_EQ(walls(), 2);
  EXPECT_EQ(events().size(), 2u);
}

TEST_F(MaintenanceNoticeInGuest, CancellingANoticeNotHeldIsANoOpWithALogLine) {
  auto path = sim_->activate();
  CapturedLog log;
  auto h = handler();
  EXPECT_EQ(h->handle(notice("cancelled", "never-sent")), MaintenanceOutcome::unknown);
  EXPECT_NE(log.text().find("never-sent is not one this guest holds"), std::string::npos)
      << log.text();
  // Nor does it touch the notice that is held.
  ASSERT_EQ(h->handle(notice()), MaintenanceOutcome::recorded);
  EXPECT_EQ(h->handle(notice("cancelled", "another")), MaintenanceOutcome::unknown);
  EXPECT_TRUE(fs::exists(file()));
  EXPECT_EQ(walls(), 1);
  EXPECT_EQ(events().size(), 1u);
}

TEST_F(MaintenanceNoticeInGuest, AnInvalidNoticeWritesNothingAndEmitsNothing) {
  auto path = sim_->activate();
  auto h = handler();
  auto with = [](const char* key, json v) {
    json n = notice();
    n[key] = std::move(v);
    return n;
  };
  const std::vector<std::pair<std::string, json>> invalid = {
      {"notice_id", with("notice_id", "../../etc/passwd")},
      {"notice_id", with("notice_id", std::string(65, 'a'))},
      {"deadline", with("deadline", "soon")},
      {"deadline", with("deadline", "2026-11-30T09:00:00+02:00")},
      {"message", with("message", std::string(513, 'x'))},
      {"message", with("message", "\x1b]0;pwned\x07\x1b[2J")},
      {"message", with("message", "a\rb")},
      {"state", with("state", "postponed")},
      {"node", with("node", "gpu node")},
      {"node", with("node", nullptr)},  // missing
  };
  for (const auto& [field, body] : invalid) {
    CapturedLog log;
    EXPECT_EQ(h->handle(body), MaintenanceOutcome::refused) << body.dump();
    EXPECT_NE(log.text().find("maintenance: refused: maintenance notice: " + field + ": "),
              std::string::npos)
        << log.text();
    EXPECT_NE(log.text().find("[warning]"), std::string::npos) << log.text();
  }
  EXPECT_FALSE(fs::exists(file()));
  EXPECT_FALSE(fs::exists(file().parent_path())) << "not even the directory";
  EXPECT_EQ(walls(), 0);
  EXPECT_EQ(sim_->wall_log(), "");
  EXPECT_EQ(spool_->last_id(), 0u);
}

TEST_F(MaintenanceNoticeInGuest, WithoutWallTheFileAndTheEventStillHappen) {
  // A guest with no wall at all: neither the stand-in nor (since this
  // machine's own must never run) its guard.
  fs::remove(sim_->root() / ".guestsim/bin/wall");
  fs::remove(sim_->root() / ".guestsim/guard/wall");
  auto path = sim_->activate();
  CapturedLog log;
  EXPECT_EQ(handler()->handle(notice()), MaintenanceOutcome::recorded);
  EXPECT_NE(log.text().find("could not tell the guest's users (wall): wall: command not found"),
            std::string::npos)
      << log.text();
  EXPECT_TRUE(fs::exists(file()));
  EXPECT_EQ(events().size(), 1u);
  EXPECT_EQ(walls(), 0);
  EXPECT_EQ(sim_->guarded(), "");
}

TEST_F(MaintenanceNoticeInGuest, WallIsGuardedWhereNoStandInAnswers) {
  // The stand-in gone, the guard answers: nothing reaches this machine's
  // terminals, the failure is logged, and the notice is kept all the same.
  fs::remove(sim_->root() / ".guestsim/bin/wall");
  auto path = sim_->activate();
  EXPECT_EQ(handler()->handle(notice()), MaintenanceOutcome::recorded);
  EXPECT_EQ(sim_->take_guarded(), "wall\n");
  EXPECT_TRUE(fs::exists(file()));
  EXPECT_EQ(events().size(), 1u);
}

TEST_F(MaintenanceNoticeInGuest, TheRuntimeRoutesNoticesInLinkOnlyMode) {
  auto path = sim_->activate();
  agent::AgentRuntimeOptions options;
  options.run_plan = false;  // --link-only: no plan runner to hand commands to
  agent::AgentRuntime runtime(sim_->env(), *spool_, options);
  ASSERT_FALSE(runtime.runs_plans());
  runtime.on_command({{"action", 5}});        // no action to route: ignored
  runtime.on_command({{"action", "retry"}});  // the plan runner's, and there is none
  runtime.on_command(notice());
  EXPECT_TRUE(eventually([&] { return events().size() == 1; }, 30s));
  EXPECT_TRUE(eventually([&] { return fs::exists(file()); }, 30s));
  runtime.on_command(notice("cancelled"));
  EXPECT_TRUE(eventually([&] { return !fs::exists(file()); }, 30s));
  EXPECT_TRUE(eventually([&] { return events().size() == 2; }, 30s));
  EXPECT_EQ(walls(), 2);
}

TEST(MaintenanceWallText, SaysHowLongIsLeft) {
  auto n = proto::decode_maintenance_notice(notice());
  ASSERT_TRUE(n) << n.error().message;
  n->message.clear();
  auto at = [&](const char* now) { return agent::maintenance_wall_text(*n, *parse_rfc3339(now)); };
  EXPECT_EQ(at("2026-11-30T08:59:30Z"),
            "Factory: this VM will be stopped for host maintenance on gpu-node-3 at "
            "2026-11-30T09:00:00Z (in 1 minute). Save your work.");
  EXPECT_NE(at("2026-11-30T06:00:00Z").find("(in about 3 hours)"), std::string::npos);
  EXPECT_NE(at("2026-11-30T09:00:00Z").find("(now)"), std::string::npos);
  EXPECT_NE(at("2026-11-30T10:00:00Z").find("(now)"), std::string::npos);
}

}  // namespace
}  // namespace factory::testing
