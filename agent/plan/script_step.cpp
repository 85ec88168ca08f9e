#include "agent/plan/script_step.hpp"

#include <algorithm>

#include "common/subprocess.hpp"

namespace factory::agent {

namespace {

using std::chrono::milliseconds;

class ScriptStep : public Step {
 public:
  ScriptStep(std::string check, std::string run, std::string verify, bool reboot,
             std::map<std::string, std::string> env)
      : check_(std::move(check)),
        run_(std::move(run)),
        verify_(std::move(verify)),
        reboot_(reboot),
        env_(std::move(env)) {}

  Result<bool> check(StepContext& ctx) override {
    // Without a check the step cannot know it is done: run (which must then
    // be safe to repeat) runs every time the step is entered.
    if (check_.empty()) return false;
    auto r = sh(ctx, "check", check_, /*stream=*/false);
    if (!r) return r.error();
    if (r->timed_out) return Error(Errc::timeout, "check timed out");
    return r->exit_code == 0;
  }

  StepOutcome apply(StepContext& ctx) override {
    auto r = sh(ctx, "run", run_, /*stream=*/true);
    if (!r) return StepOutcome::failure(r.error().message);
    if (!r->ok()) return StepOutcome::failure("run " + r->describe(), r->tail());
    if (reboot_) return StepOutcome::reboot("the script asked for a reboot");
    return StepOutcome::success();
  }

  StepOutcome verify(StepContext& ctx) override {
    if (verify_.empty()) return StepOutcome::success();
    auto r = sh(ctx, "verify", verify_, /*stream=*/false);
    if (!r) return StepOutcome::failure(r.error().message);
    if (!r->ok()) return StepOutcome::failure("verify " + r->describe(), r->tail());
    return StepOutcome::success();
  }

 private:
  Result<CommandResult> sh(StepContext& ctx, const char* what, const std::string& script,
                           bool stream) {
    milliseconds left = ctx.remaining();
    if (left <= milliseconds(0))
      return Error(Errc::timeout, std::string(what) + ": the step's deadline passed");
    CommandSpec cmd = shell_command(script);
    cmd.timeout = left;
    cmd.env = env_;
    cmd.env["FACTORY_ROOT"] = ctx.env.root.string();
    cmd.env["FACTORY_STEP"] = ctx.spec.id;
    if (stream && ctx.progress) {
      // A long script shows signs of life, at most one line a second.
      auto last = std::make_shared<std::chrono::steady_clock::time_point>();
      cmd.on_line = [&ctx, last](const std::string& line) {
        auto now = std::chrono::steady_clock::now();
        if (now - *last < std::chrono::seconds(1)) return;
        *last = now;
        ctx.progress({{"message", line}});
      };
    }
    auto r = run_command(cmd);
    if (!r) return r.error().with_context(std::string("script ") + what);
    return r;
  }

  std::string check_, run_, verify_;
  bool reboot_;
  std::map<std::string, std::string> env_;
};

}  // namespace

Result<std::unique_ptr<Step>> make_script_step(const StepSpec& spec) {
  auto p = normalized_params("script", spec);
  if (!p) return p.error();
  auto text = [&](const char* key) { return p->value(key, std::string()); };
  return std::unique_ptr<Step>(
      new ScriptStep(text("check"), text("run"), text("verify"), (*p)["reboot"].get<bool>(),
                     (*p)["env"].get<std::map<std::string, std::string>>()));
}

void register_script_step(StepRegistry& registry) {
  registry.add("script", make_script_step);
}

}  // namespace factory::agent
