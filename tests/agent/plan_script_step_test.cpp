// The `script` step kind with a real /bin/sh, alone and through the engine.
#include <gtest/gtest.h>

#include "agent/plan/engine.hpp"
#include "agent/plan/script_step.hpp"
#include "contract/catalog.hpp"
#include "tests/support/test_support.hpp"

using namespace factory::agent;
using factory::testing::TempDir;
using nlohmann::json;

namespace {

struct ScriptFixture {
  TempDir dir{"script"};
  GuestEnv env;
  std::vector<json> progress;
  ScriptFixture() {
    env.root = dir / "root";
    env.state_dir = dir / "state";
    std::filesystem::create_directories(env.root);
  }
  StepSpec spec(json params) {
    StepSpec s;
    s.id = "tool";
    s.kind = "script";
    s.params = std::move(params);
    s.timeout = std::chrono::seconds(20);
    return s;
  }
  StepContext ctx(const StepSpec& s) {
    return StepContext{env, s, [this](json f) { progress.push_back(std::move(f)); },
                       std::chrono::steady_clock::now() + s.timeout};
  }
};

}  // namespace

TEST(ScriptStep, CheckRunVerify) {
  ScriptFixture f;
  auto s = f.spec({{"check", "test -f \"$FACTORY_ROOT/installed\""},
                   {"run", "echo \"$GREETING from $FACTORY_STEP\" > \"$FACTORY_ROOT/installed\""},
                   {"verify", "grep -q 'hello from tool' \"$FACTORY_ROOT/installed\""},
                   {"env", {{"GREETING", "hello"}}}});
  auto step = make_script_step(s);
  ASSERT_TRUE(step.ok()) << step.error().message;
  auto c = f.ctx(s);
  auto done = (*step)->check(c);
  ASSERT_TRUE(done.ok());
  EXPECT_FALSE(*done);
  auto applied = (*step)->apply(c);
  EXPECT_TRUE(applied.ok()) << applied.message;
  EXPECT_TRUE((*step)->verify(c).ok());
  done = (*step)->check(c);
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(*done);
}

TEST(ScriptStep, FailingRunCarriesItsOutputTail) {
  ScriptFixture f;
  auto s =
      f.spec({{"run", "echo downloading; echo 'E: Unable to locate package nope' >&2; exit 100"}});
  auto step = make_script_step(s);
  ASSERT_TRUE(step.ok());
  auto c = f.ctx(s);
  auto out = (*step)->apply(c);
  EXPECT_EQ(out.kind, StepOutcome::Kind::failed);
  EXPECT_EQ(out.message, "run exited 100");
  EXPECT_NE(out.output_tail.find("E: Unable to locate package nope"), std::string::npos)
      << out.output_tail;
}

TEST(ScriptStep, WithoutCheckItRunsAndWithoutVerifyRunDecides) {
  ScriptFixture f;
  auto s = f.spec({{"run", "true"}});
  auto step = make_script_step(s);
  ASSERT_TRUE(step.ok());
  auto c = f.ctx(s);
  auto done = (*step)->check(c);
  ASSERT_TRUE(done.ok());
  EXPECT_FALSE(*done);
  EXPECT_TRUE((*step)->verify(c).ok());
  auto bad = f.spec({{"run", "true"}, {"verify", "exit 3"}});
  auto bstep = make_script_step(bad);
  auto bc = f.ctx(bad);
  EXPECT_EQ((*bstep)->verify(bc).message, "verify exited 3");
}

TEST(ScriptStep, RebootParamAsksForAReboot) {
  ScriptFixture f;
  auto s = f.spec({{"run", "true"}, {"reboot", true}});
  auto step = make_script_step(s);
  auto c = f.ctx(s);
  EXPECT_EQ((*step)->apply(c).kind, StepOutcome::Kind::reboot_required);
}

TEST(ScriptStep, DeadlineStopsAHangingScript) {
  ScriptFixture f;
  auto s = f.spec({{"run", "sleep 30"}});
  auto step = make_script_step(s);
  auto c = f.ctx(s);
  c.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  auto t0 = std::chrono::steady_clock::now();
  auto out = (*step)->apply(c);
  EXPECT_EQ(out.kind, StepOutcome::Kind::failed);
  EXPECT_EQ(out.message, "run timed out");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
}

TEST(ScriptStep, MissingRunIsRefused) {
  auto r = make_script_step(StepSpec{"x", "script", json::object()});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "step 'x': params.run: required for a script step");
}

TEST(ScriptStep, AnAdminsCatalogItemRunsEndToEnd) {
  // A tier written only in YAML, with the script kind, through the catalog and the engine.
  const char* yaml = R"yaml(version: 1
tiers:
  - name: tools
    description: Tools by script.
    vm: {cpu: "2", memory: 2Gi, disk: 10Gi, image: "https://example.invalid/i.img", gpus: 1}
    versions: {tool: "3.1"}
    steps:
      - id: tool
        kind: script
        params:
          check: test "$(cat "$FACTORY_ROOT/tool-version" 2>/dev/null)" = "${versions.tool}"
          run: echo ${versions.tool} > "$FACTORY_ROOT/tool-version"; echo run >> "$FACTORY_ROOT/runs"
          verify: grep -qx ${versions.tool} "$FACTORY_ROOT/tool-version"
)yaml";
  auto cat = factory::catalog::parse(yaml, "tools.yaml");
  ASSERT_TRUE(cat.ok()) << cat.error().message;
  json plan = cat->tiers[0].plan();
  ScriptFixture f;
  StepRegistry reg;
  register_script_step(reg);
  std::vector<json> events;
  auto engine = [&] {
    return std::make_unique<PlanEngine>(
        f.env, reg, [&](json e) { events.push_back(e); }, [] { return factory::ok_status(); });
  };
  EXPECT_EQ(engine()->run(plan), PlanEngine::Outcome::succeeded);
  EXPECT_EQ(factory::testing::slurp(f.env.root / "tool-version"), "3.1\n");
  // A new agent run of the same plan does nothing; a journal-less re-run only checks.
  EXPECT_EQ(engine()->run(plan), PlanEngine::Outcome::succeeded);
  std::filesystem::remove_all(f.env.state_dir);
  EXPECT_EQ(engine()->run(plan), PlanEngine::Outcome::succeeded);
  EXPECT_EQ(factory::testing::slurp(f.env.root / "runs"), "run\n");
}
