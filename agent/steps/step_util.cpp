#include "agent/steps/step_util.hpp"

#include "common/atomic_file.hpp"

namespace factory::agent::steps {

using nlohmann::json;

Result<std::string> string_param(const json& p, const std::string& key, const std::string& step_id,
                                 const char* fallback) {
  if (p.contains(key) && p[key].is_string() && !p[key].get<std::string>().empty())
    return p[key].get<std::string>();
  if (p.contains(key) && !p[key].is_string())
    return Error(Errc::invalid_argument,
                 "step '" + step_id + "': params." + key + " must be a string");
  if (fallback) return std::string(fallback);
  return Error(Errc::invalid_argument, "step '" + step_id + "': params." + key + " is required");
}

Result<std::vector<std::string>> string_list_param(const json& p, const std::string& key,
                                                   const std::string& step_id,
                                                   std::vector<std::string> fallback,
                                                   bool required) {
  if (!p.contains(key)) {
    if (required)
      return Error(Errc::invalid_argument,
                   "step '" + step_id + "': params." + key + " is required");
    return fallback;
  }
  if (!p[key].is_array())
    return Error(Errc::invalid_argument,
                 "step '" + step_id + "': params." + key + " must be a list");
  std::vector<std::string> out;
  for (const auto& v : p[key]) {
    if (!v.is_string() || v.get<std::string>().empty())
      return Error(Errc::invalid_argument,
                   "step '" + step_id + "': params." + key + " must list non-empty strings");
    out.push_back(v.get<std::string>());
  }
  return out;
}

bool bool_param(const json& p, const std::string& key, bool fallback) {
  return p.contains(key) && p[key].is_boolean() ? p[key].get<bool>() : fallback;
}

long long int_param(const json& p, const std::string& key, long long fallback) {
  return p.contains(key) && p[key].is_number_integer() ? p[key].get<long long>() : fallback;
}

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
