#include "agent/steps/step_util.hpp"

#include "agent/diagnose/known.hpp"
#include "common/atomic_file.hpp"

namespace factory::agent::steps {

using nlohmann::json;

std::chrono::milliseconds time_left(const StepContext& ctx, std::chrono::milliseconds cap) {
  auto left = ctx.remaining();
  if (left > cap) left = cap;
  // A command always gets a moment: a step past its deadline still reports
  // a clean timeout from the command rather than a zero-length run.
  if (left < std::chrono::milliseconds(100)) left = std::chrono::milliseconds(100);
  return left;
}

Result<CommandResult> run_in_step(const StepContext& ctx, std::vector<std::string> argv,
                                  std::chrono::milliseconds cap,
                                  std::map<std::string, std::string> env) {
  CommandSpec spec;
  spec.argv = std::move(argv);
  spec.timeout = time_left(ctx, cap);
  spec.env = std::move(env);
  return run_command(spec);
}

std::string command_line(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) s += (s.empty() ? "" : " ") + a;
  return s;
}

std::string sh_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

StepOutcome run_install_script(const StepContext& ctx, const std::string& what,
                               const std::string& url, const std::string& interpreter,
                               std::map<std::string, std::string> env,
                               std::chrono::milliseconds cap) {
  std::string script =
      "set -e\n"
      "f=$(mktemp)\n"
      "trap 'rm -f \"$f\"' EXIT\n"
      "curl -fsSL " +
      sh_quote(url) + " -o \"$f\"\n" + interpreter + " \"$f\"\n";
  CommandSpec spec = shell_command(script);
  spec.env = std::move(env);
  spec.timeout = time_left(ctx, cap);
  auto r = run_command(spec);
  if (!r) return StepOutcome::failure("cannot run the " + what + ": " + r.error().message);
  if (!r->ok()) {
    std::string tail = r->tail(20);
    std::optional<Diagnosis> d;
    if (tail.find("curl: (") != std::string::npos) d = diagnoses::download_failed(url, tail);
    return StepOutcome::failure("the " + what + " " + r->describe(), tail, d);
  }
  return StepOutcome::success(r->tail(5));
}

bool ProgressLimiter::due(bool final) {
  auto now = std::chrono::steady_clock::now();
  if (final || !sent_any_ || now - last_ >= interval_) {
    last_ = now;
    sent_any_ = true;
    return true;
  }
  return false;
}

void emit_progress(const StepContext& ctx, json fields) {
  if (ctx.progress) ctx.progress(std::move(fields));
}

namespace {
std::filesystem::path state_file(const StepContext& ctx) {
  return ctx.env.state_dir / "steps" / (ctx.spec.id + ".json");
}
}  // namespace

json load_step_state(const StepContext& ctx) {
  auto text = read_file(state_file(ctx));
  if (!text) return json::object();
  auto j = json::parse(*text, nullptr, false);
  // A torn or foreign file reads as "nothing known": every decision that uses
  // this state also re-checks the guest itself.
  return j.is_object() ? j : json::object();
}

Status save_step_state(const StepContext& ctx, const json& state) {
  auto dir = state_file(ctx).parent_path();
  if (auto st = ensure_dir(dir, 0700); !st) return st;
  return write_file_atomic(state_file(ctx), state.dump(2) + "\n", 0600);
}

}  // namespace factory::agent::steps
