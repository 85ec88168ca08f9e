#include "agent/upgrade/systemd_unit.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "agent/upgrade/upgrade_state.hpp"
#include "common/display.hpp"
#include "common/subprocess.hpp"

namespace factory::agent {

namespace {

// systemctl answers at once unless systemd is busy; a D-Bus call stuck
// longer than this is a systemd in trouble, and the caller reports it.
constexpr std::chrono::seconds kSystemdTimeout{60};

Result<CommandResult> systemd_call(std::vector<std::string> argv, bool survives_stop = false) {
  CommandSpec spec;
  spec.argv = std::move(argv);
  spec.survives_stop = survives_stop;
  spec.timeout = kSystemdTimeout;
  spec.max_output = 4096;
  return run_command(spec);
}

// The call, as one line for an error: "systemctl daemon-reload: exited 1: <its last line>".
Status checked(std::vector<std::string> argv, bool survives_stop = false) {
  std::string shown;
  for (const auto& a : argv) shown += (shown.empty() ? "" : " ") + a;
  auto r = systemd_call(std::move(argv), survives_stop);
  if (!r) return r.error().with_context(shown);
  if (r->ok()) return {};
  std::string said = r->tail(1);
  while (!said.empty() && (said.back() == '\n' || said.back() == ' ')) said.pop_back();
  return Error(Errc::unavailable,
               shown + ": " + r->describe() + (said.empty() ? "" : ": " + display::sanitize(said)));
}

std::string timer_unit() {
  return std::string(kDeadlineUnit) + ".timer";
}

}  // namespace

const char* guard_action_name(GuardAction a) {
  switch (a) {
    case GuardAction::pre_start:
      return "pre-start";
    case GuardAction::post_stop:
      return "post-stop";
    case GuardAction::deadline:
      return "deadline";
  }
  return "unknown";
}

std::vector<std::string> guard_argv(const std::string& stable, GuardAction action,
                                    const std::filesystem::path& state_file, const GuestEnv& env) {
  std::vector<std::string> argv = {stable, "upgrade-guard", guard_action_name(action), "--state",
                                   state_file.string()};
  if (env.root != "/" && !env.root.empty()) {
    argv.push_back("--root");
    argv.push_back(env.root.string());
  }
  return argv;
}

bool unit_safe_path(const std::string& path) {
  return !path.empty() && path.front() == '/' && std::all_of(path.begin(), path.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '/' ||
           c == '.' || c == '_' || c == '-' || c == '+';
  });
}

std::string upgrade_drop_in(const std::string& stable, const std::filesystem::path& state_file,
                            const GuestEnv& env) {
  auto line = [&](GuardAction a) {
    std::string s;
    for (const auto& arg : guard_argv(stable, a, state_file, env))
      s += (s.empty() ? "" : " ") + arg;
    return s;
  };
  return "# Written by factory-agent when it updates itself (docs/agent-upgrades.md).\n"
         "# The guard runs from the previous, known-good binary, never the new one, so a\n"
         "# broken new binary cannot break its own rollback; '-': a failing guard never\n"
         "# keeps the agent from starting. It does nothing unless an upgrade is on trial.\n"
         "[Service]\n"
         "ExecStartPre=-" +
         line(GuardAction::pre_start) +
         "\n"
         "ExecStopPost=-" +
         line(GuardAction::post_stop) + "\n";
}

Status reload_systemd() {
  return checked({"systemctl", "daemon-reload"});
}

Status restart_agent_unit() {
  // systemd SIGTERMs this agent as soon as it runs the job, often before
  // systemctl has returned: the agent's stop must let this call finish, or
  // it would report the restart it asked for as a failure and undo it.
  return checked({"systemctl", "restart", "--no-block", kAgentUnit}, /*survives_stop=*/true);
}

Status arm_deadline_timer(const std::string& stable, const std::filesystem::path& state_file,
                          long seconds, const GuestEnv& env) {
  // systemd-run refuses a unit name that is taken: a timer (or a failed
  // service) of an earlier upgrade is cleared first. Either may be absent.
  stop_deadline_timer();
  if (auto r = systemd_call({"systemctl", "reset-failed", std::string(kDeadlineUnit) + ".service"});
      r && !r->ok())
    spdlog::debug("upgrade: systemctl reset-failed {}.service: {}", kDeadlineUnit, r->describe());
  std::vector<std::string> argv = {"systemd-run", std::string("--unit=") + kDeadlineUnit,
                                   "--on-active=" + std::to_string(std::max(seconds, 1L)) + "s",
                                   "--timer-property=AccuracySec=1s"};
  for (auto& a : guard_argv(stable, GuardAction::deadline, state_file, env))
    argv.push_back(std::move(a));
  return checked(std::move(argv));
}

bool deadline_timer_active() {
  auto r = systemd_call({"systemctl", "is-active", "--quiet", timer_unit()});
  return r && r->ok();
}

void stop_deadline_timer() {
  if (auto st = checked({"systemctl", "stop", timer_unit()}); !st.ok())
    spdlog::debug("upgrade: {}", st.error().message);
}

}  // namespace factory::agent
