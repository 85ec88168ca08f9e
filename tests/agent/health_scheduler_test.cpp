// Health on its own schedule (agent/health/scheduler.hpp): it reports every
// interval and at once when asked, with what its scope says; and wired as the
// service runs it (agent/cli/runtime.hpp), it keeps reporting while a plan
// step runs, which the plan runner's thread could not do while it ran the step.
#include <gtest/gtest.h>

#include <fstream>
#include <mutex>
#include <thread>

#include "agent/cli/runtime.hpp"
#include "agent/health/scheduler.hpp"
#include "agent/link/spool.hpp"
#include "common/catalog.hpp"
#include "tests/guestsim/guest_sim.hpp"
#include "tests/support/test_support.hpp"

namespace factory::testing {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

class HealthSchedule : public ::testing::Test {
 protected:
  void SetUp() override {
    sim_ = std::make_unique<GuestSim>(dir_.path(), GuestSim::Options{"h200", 0});
    path_ = std::make_unique<GuestSim::PathScope>(sim_->path());
  }
  void TearDown() override {
    path_.reset();
    sim_.reset();
  }

  std::vector<json> health_events(agent::EventSpool& spool) {
    std::vector<json> out;
    for (const auto& e : spool.pending_after(0, 10000))
      if (e.body.value("kind", "") == "health") out.push_back(e.body);
    return out;
  }

  TempDir dir_{"health-schedule"};
  std::unique_ptr<GuestSim> sim_;
  std::unique_ptr<GuestSim::PathScope> path_;
};

TEST_F(HealthSchedule, ReportsEveryIntervalWithItsScopesCollectorsAndFields) {
  std::mutex mu;
  std::vector<json> reports;
  int asked = 0;
  agent::HealthScheduler health(
      sim_->env(), 50ms,
      [&] {
        std::lock_guard lk(mu);
        ++asked;
        return agent::HealthScheduler::Scope{{/*ollama=*/false, /*k8s=*/false},
                                             {{"plan_hash", "h-" + std::to_string(asked)}}};
      },
      [&](json r) {
        std::lock_guard lk(mu);
        reports.push_back(std::move(r));
      });
  health.start();
  ASSERT_TRUE(eventually(
      [&] {
        std::lock_guard lk(mu);
        return reports.size() >= 3;
      },
      60s));
  health.stop();
  std::lock_guard lk(mu);
  for (size_t i = 0; i < reports.size(); ++i) {
    EXPECT_EQ(reports[i]["kind"], "health");
    EXPECT_EQ(reports[i]["gpu"]["driver_version"], "580.159.04") << reports[i].dump(2);
    EXPECT_FALSE(reports[i].contains("ollama"));
    EXPECT_FALSE(reports[i].contains("k8s"));
    // The scope is asked again for every report.
    EXPECT_EQ(reports[i]["plan_hash"], "h-" + std::to_string(i + 1));
  }
}

TEST_F(HealthSchedule, ReportNowDoesNotWaitForTheInterval) {
  std::mutex mu;
  std::vector<json> reports;
  agent::HealthScheduler health(
      sim_->env(), std::chrono::hours(1), [] { return agent::HealthScheduler::Scope{}; },
      [&](json r) {
        std::lock_guard lk(mu);
        reports.push_back(std::move(r));
      });
  health.start();
  // Nothing before the first interval...
  std::this_thread::sleep_for(200ms);
  {
    std::lock_guard lk(mu);
    EXPECT_TRUE(reports.empty());
  }
  // ...unless asked.
  health.report_now();
  EXPECT_TRUE(eventually(
      [&] {
        std::lock_guard lk(mu);
        return reports.size() == 1;
      },
      60s));
}

TEST_F(HealthSchedule, HealthFlowsWhileAPlanStepRuns) {
  TempDir spool_dir("spool");
  auto spool = agent::EventSpool::open(spool_dir.path(), 1000);
  ASSERT_TRUE(spool) << spool.error().message;
  // A step that runs until the test lets it finish.
  json plan = {{"tier", "t"},
               {"steps",
                {{{"id", "wait"},
                  {"kind", "script"},
                  {"params", {{"run", "while [ ! -f \"$FACTORY_ROOT/go\" ]; do sleep 0.05; done"}}},
                  {"timeout_seconds", 300},
                  {"retries", 0}}}}};
  agent::AgentRuntimeOptions options;
  options.health_interval = 100ms;
  options.reboot = [] { return ok_status(); };
  agent::AgentRuntime runtime(sim_->env(), **spool, options);
  runtime.start();
  runtime.plan().submit_plan({{"plan", plan}});

  auto step_state = [&] {
    auto steps = runtime.plan().status().value("steps", json::array());
    return steps.empty() ? std::string() : steps[0].value("state", "");
  };
  ASSERT_TRUE(eventually([&] { return step_state() == "running"; }, 60s));
  size_t before = health_events(**spool).size();
  ASSERT_TRUE(eventually([&] { return health_events(**spool).size() >= before + 2; }, 60s));
  EXPECT_EQ(step_state(), "running");
  auto during = health_events(**spool).back();
  EXPECT_EQ(during["plan_hash"], catalog::plan_hash(plan)) << during.dump(2);
  EXPECT_EQ(during["gpu"]["driver_version"], "580.159.04");

  std::ofstream(sim_->root() / "go") << "go\n";
  EXPECT_TRUE(
      eventually([&] { return runtime.plan().summary()["plan_state"] == "succeeded"; }, 60s));
  runtime.stop();
}

}  // namespace
}  // namespace factory::testing
