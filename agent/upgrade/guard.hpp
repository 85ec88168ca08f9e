#pragma once
// The upgrade guard: `factory-agent upgrade-guard pre-start|post-stop|deadline
// --state FILE`, which systemd runs from the previous (stable) binary,
// through the drop-in around every start and stop of the agent's unit and
// from the transient timer at the deadline. It reads nothing but the state
// file (no config, no network, no coordinator) and does nothing unless an
// upgrade is on trial (phase trying):
//   pre-start  counts the start; past kMaxCandidateStarts starts, or at or
//              after the deadline, rolls back; otherwise re-arms the deadline
//              timer if it is gone (a guest that rebooted mid-trial).
//   post-stop  records what systemd says of the stop ($SERVICE_RESULT,
//              $EXIT_CODE, $EXIT_STATUS), for the rollback's reason.
//   deadline   rolls back ("sent no health report within N s") and asks
//              systemd to restart the unit, which then runs the stable binary.
// Roll back = binary_path made a link to the stable slot again (one rename),
// phase rolled_back with the reason; the stable binary, once started,
// reports it to the coordinator (Upgrader::on_start).
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <string>

#include "agent/guest/env.hpp"
#include "agent/upgrade/systemd_unit.hpp"
#include "agent/upgrade/upgrade_state.hpp"
#include "common/error.hpp"

namespace factory::agent {

Result<GuardAction> parse_guard_action(const std::string& s);

struct GuardContext {
  GuestEnv env;  // its root: binary_path is read under it
  std::function<Clock::time_point()> now = [] { return Clock::now(); };
  // Where $SERVICE_RESULT, $EXIT_CODE and $EXIT_STATUS are read (post-stop).
  std::function<std::string(const char* name)> getenv = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v ? v : "");
  };
};

// What the guard did (for tests and its log line).
enum class GuardOutcome {
  nothing,      // no upgrade on trial (or no state file)
  counted,      // pre-start: one more start, the timer armed
  rearmed,      // pre-start: one more start, and the missing timer armed again
  recorded,     // post-stop: the exit kept
  rolled_back,  // binary_path points at the stable slot again
  failed,       // could not read or write the state, or roll back (logged)
};
const char* guard_outcome_name(GuardOutcome o);

// Never throws; logs one line saying what it did.
GuardOutcome run_upgrade_guard(GuardAction action, const std::filesystem::path& state_file,
                               const GuardContext& ctx);

// The rollback itself, shared with the agent: binary_path back to the
// stable slot, phase rolled_back with `reason`, saved (the caller holds the
// state's lock). Refuses (failed_precondition) when the stable slot is gone,
// leaving everything as it was: a link to nothing would start no agent at all.
Status roll_back(const GuestEnv& env, const std::filesystem::path& state_file, UpgradeState& s,
                 const std::string& reason);

// "0.1.1 sent no health report within 120 s"
std::string no_health_reason(const UpgradeState& s);
// "0.1.2 exited with status 1 at start 3 times (last: exit-code)"
std::string failed_starts_reason(const UpgradeState& s, int failed_starts);

}  // namespace factory::agent
