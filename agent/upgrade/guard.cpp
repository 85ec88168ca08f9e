#include "agent/upgrade/guard.hpp"

#include <spdlog/spdlog.h>

#include <cmath>

#include "agent/upgrade/agent_binary.hpp"
#include "common/display.hpp"
#include "contract/agent_upgrade.hpp"

namespace factory::agent {

namespace fs = std::filesystem;

namespace {

// What systemd put in the environment, as the state keeps it: short, and
// safe to show (it ends up in a reason the coordinator displays).
std::string from_systemd(const std::string& v) {
  return display::sanitize(v.size() > 64 ? v.substr(0, 64) : v);
}

std::string bounded_reason(std::string r) {
  constexpr std::size_t kMax = proto::agent_upgrade_limits::kReason;
  if (r.size() > kMax) r.resize(kMax);
  return display::sanitize(r);
}

std::string shown_version(const UpgradeState& s) {
  return s.to_version.empty() ? std::string("the new binary") : s.to_version;
}

GuardOutcome pre_start(const fs::path& file, UpgradeState& s, const GuardContext& ctx) {
  s.starts += 1;
  const auto now = ctx.now();
  std::string why;
  if (now >= *s.deadline)
    why = no_health_reason(s);
  else if (s.starts > kMaxCandidateStarts)
    why = failed_starts_reason(s, s.starts - 1);
  if (!why.empty()) {
    if (auto st = roll_back(ctx.env, file, s, why); !st.ok()) {
      spdlog::error("upgrade guard: cannot roll back: {}", st.error().message);
      return GuardOutcome::failed;
    }
    spdlog::warn("upgrade guard: {}: rolled back to {}", why, s.stable);
    return GuardOutcome::rolled_back;
  }
  if (auto st = save_upgrade_state(file, s); !st.ok()) {
    spdlog::error("upgrade guard: {}", st.error().message);
    return GuardOutcome::failed;
  }
  // A transient timer does not survive a reboot: the trial's deadline does.
  if (deadline_timer_active()) {
    spdlog::info("upgrade guard: {} start {} of {}", shown_version(s), s.starts,
                 kMaxCandidateStarts);
    return GuardOutcome::counted;
  }
  const auto left = std::chrono::duration<double>(*s.deadline - now).count();
  const long seconds = static_cast<long>(std::ceil(left));
  if (auto st = arm_deadline_timer(s.stable, file, seconds, ctx.env); !st.ok()) {
    spdlog::error("upgrade guard: the deadline timer: {}", st.error().message);
    return GuardOutcome::failed;
  }
  spdlog::info("upgrade guard: {} start {} of {}; deadline timer armed again ({} s left)",
               shown_version(s), s.starts, kMaxCandidateStarts, seconds);
  return GuardOutcome::rearmed;
}

GuardOutcome post_stop(const fs::path& file, UpgradeState& s, const GuardContext& ctx) {
  s.last_exit =
      ServiceExit{from_systemd(ctx.getenv("SERVICE_RESULT")), from_systemd(ctx.getenv("EXIT_CODE")),
                  from_systemd(ctx.getenv("EXIT_STATUS"))};
  if (auto st = save_upgrade_state(file, s); !st.ok()) {
    spdlog::error("upgrade guard: {}", st.error().message);
    return GuardOutcome::failed;
  }
  spdlog::info("upgrade guard: {} stopped: {} ({} {})", shown_version(s),
               s.last_exit->service_result, s.last_exit->exit_code, s.last_exit->exit_status);
  return GuardOutcome::recorded;
}

GuardOutcome deadline(const fs::path& file, UpgradeState& s, const GuardContext& ctx) {
  const std::string why = no_health_reason(s);
  if (auto st = roll_back(ctx.env, file, s, why); !st.ok()) {
    spdlog::error("upgrade guard: cannot roll back: {}", st.error().message);
    return GuardOutcome::failed;
  }
  spdlog::warn("upgrade guard: {}: rolled back to {}; restarting {}", why, s.stable, kAgentUnit);
  // The new binary may be running (and stuck): the restart replaces it with
  // the stable one that binary_path now names.
  if (auto st = restart_agent_unit(); !st.ok())
    spdlog::error("upgrade guard: {}", st.error().message);
  return GuardOutcome::rolled_back;
}

}  // namespace

Result<GuardAction> parse_guard_action(const std::string& s) {
  for (auto a : {GuardAction::pre_start, GuardAction::post_stop, GuardAction::deadline})
    if (s == guard_action_name(a)) return a;
  return Error(
      Errc::invalid_argument,
      "upgrade-guard: want pre-start, post-stop or deadline, got '" + display::sanitize(s) + "'");
}

const char* guard_outcome_name(GuardOutcome o) {
  switch (o) {
    case GuardOutcome::nothing:
      return "nothing";
    case GuardOutcome::counted:
      return "counted";
    case GuardOutcome::rearmed:
      return "rearmed";
    case GuardOutcome::recorded:
      return "recorded";
    case GuardOutcome::rolled_back:
      return "rolled_back";
    case GuardOutcome::failed:
      return "failed";
  }
  return "unknown";
}

std::string no_health_reason(const UpgradeState& s) {
  return bounded_reason(shown_version(s) + " sent no health report within " +
                        std::to_string(s.confirm_within_s) + " s");
}

std::string failed_starts_reason(const UpgradeState& s, int failed_starts) {
  std::string what = "did not stay up";
  std::string last;
  if (s.last_exit) {
    const auto& e = *s.last_exit;
    if (e.exit_code == "exited")
      what = "exited with status " + e.exit_status;
    else if (e.exit_code == "killed")
      what = "was killed by signal " + e.exit_status;
    else if (e.exit_code == "dumped")
      what = "dumped core (signal " + e.exit_status + ")";
    if (!e.service_result.empty()) last = " (last: " + e.service_result + ")";
  }
  return bounded_reason(shown_version(s) + " " + what + " at start " +
                        std::to_string(failed_starts) + (failed_starts == 1 ? " time" : " times") +
                        last);
}

Status roll_back(const GuestEnv& env, const fs::path& state_file, UpgradeState& s,
                 const std::string& reason) {
  std::error_code ec;
  if (s.stable.empty() || !fs::is_regular_file(s.stable, ec))
    return Error(Errc::failed_precondition,
                 "the stable binary " + (s.stable.empty() ? std::string("(none)") : s.stable) +
                     " is gone; " + s.binary_path + " is left as it is");
  if (auto st = point_link_at(env.path(s.binary_path), s.stable); !st.ok()) return st;
  s.phase = UpgradePhase::rolled_back;
  s.reason = reason;
  s.reported = false;
  if (auto st = save_upgrade_state(state_file, s); !st.ok()) return st;
  // Its work is done; a rollback before the deadline leaves it pending.
  stop_deadline_timer();
  return {};
}

GuardOutcome run_upgrade_guard(GuardAction action, const fs::path& state_file,
                               const GuardContext& ctx) {
  try {
    auto lock = UpgradeStateLock::acquire(state_file);
    if (!lock) {
      spdlog::error("upgrade guard: {}", lock.error().message);
      return GuardOutcome::failed;
    }
    auto loaded = load_upgrade_state(state_file);
    if (!loaded) {
      spdlog::error("upgrade guard: {}", loaded.error().message);
      return GuardOutcome::failed;
    }
    if (!*loaded || (*loaded)->phase != UpgradePhase::trying) return GuardOutcome::nothing;
    UpgradeState& s = **loaded;
    switch (action) {
      case GuardAction::pre_start:
        return pre_start(state_file, s, ctx);
      case GuardAction::post_stop:
        return post_stop(state_file, s, ctx);
      case GuardAction::deadline:
        return deadline(state_file, s, ctx);
    }
  } catch (const std::exception& e) {
    spdlog::error("upgrade guard: internal error: {}", e.what());
  }
  return GuardOutcome::failed;
}

}  // namespace factory::agent
