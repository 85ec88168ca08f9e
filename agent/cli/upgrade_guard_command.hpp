#pragma once
// `factory-agent upgrade-guard pre-start|post-stop|deadline --state FILE`:
// what systemd runs from the previous (stable) binary while an upgrade is on
// trial (agent/upgrade/guard.hpp; docs/agent-upgrades.md). It reads no
// config and needs no network: only the state file. Exit 0 whatever it
// found (a failing guard must never keep the agent from starting), 2 for a
// usage error.
#include <CLI/CLI.hpp>

#include "agent/cli/local_commands.hpp"

namespace factory::agent {

void add_upgrade_guard_command(CLI::App& app, LocalCommand& chosen);

}  // namespace factory::agent
