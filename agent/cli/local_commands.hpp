#pragma once
// Commands an admin (or the test suite) runs inside a guest without a
// coordinator: what the agent sees of the GPU, and a tier's plan run or
// checked locally. Useful to answer "why is this guest not ready?" on the spot.
// Also the upgrade guard systemd runs while a new agent binary is on trial
// (upgrade_guard_command.hpp).
#include <CLI/CLI.hpp>

namespace factory::agent {

struct LocalCommand {
  std::function<int()> run;
};

void add_local_commands(CLI::App& app, LocalCommand& chosen);

}  // namespace factory::agent
