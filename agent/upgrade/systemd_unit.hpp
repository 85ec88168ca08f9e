#pragma once
// What the upgrade asks of systemd, every call in one place, exactly as
// docs/agent-upgrades.md lists them (a real guest runs these; tests run the
// guest simulator's stand-ins, tests/guestsim/bin):
//   - the drop-in that has the guard run around every start and stop of the
//     agent's unit, from the previous (stable) binary;
//   - systemctl daemon-reload, and systemctl restart --no-block of the unit;
//   - the transient timer that runs the guard at the deadline (systemd-run),
//     with its stale predecessor stopped and reset first.
// Commands are looked up through PATH.
#include <filesystem>
#include <string>
#include <vector>

#include "agent/guest/env.hpp"
#include "common/error.hpp"

namespace factory::agent {

enum class GuardAction { pre_start, post_stop, deadline };
const char* guard_action_name(GuardAction a);  // "pre-start", "post-stop", "deadline"

// <stable> upgrade-guard <action> --state <state file> [--root <root>]: the
// root only for a guest that is not this machine's (the guest simulator).
std::vector<std::string> guard_argv(const std::string& stable, GuardAction action,
                                    const std::filesystem::path& state_file, const GuestEnv& env);

// Whether a path can be written into a unit file as it is: systemd splits
// on spaces, unquotes and expands % specifiers, so a path must hold none of
// those characters to mean the same to systemd as to us.
bool unit_safe_path(const std::string& path);

// The drop-in's text: ExecStartPre and ExecStopPost running the guard from
// `stable`, each prefixed with '-' so a failing guard never keeps the agent
// from starting.
std::string upgrade_drop_in(const std::string& stable, const std::filesystem::path& state_file,
                            const GuestEnv& env);

// systemctl daemon-reload.
Status reload_systemd();
// systemctl restart --no-block factory-agent.service
Status restart_agent_unit();
// Stops and resets a timer left from an earlier upgrade (errors ignored),
// then: systemd-run --unit=factory-agent-upgrade-deadline --on-active=<N>s
// --timer-property=AccuracySec=1s <stable> upgrade-guard deadline --state <file>
Status arm_deadline_timer(const std::string& stable, const std::filesystem::path& state_file,
                          long seconds, const GuestEnv& env);
// systemctl is-active --quiet factory-agent-upgrade-deadline.timer
bool deadline_timer_active();
// systemctl stop factory-agent-upgrade-deadline.timer (errors logged, no more).
void stop_deadline_timer();

}  // namespace factory::agent
