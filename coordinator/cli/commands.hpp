#pragma once
// The `factory` command tree. Each module registers its own subcommands; a
// subcommand sets `run`, which returns the process exit status. Errors reach
// the user as one line on stderr: "factory: <what went wrong>: <what to do>".
#include <functional>
#include <string>

#include <CLI/CLI.hpp>

#include "common/error.hpp"

namespace factory::cli {

struct GlobalOptions {
  std::string config_path = "/etc/factory/coordinator.yaml";
  std::string server;      // overrides the API address from the config
  std::string token_file;  // overrides the admin token from the state dir
  std::string log_level = "warn";
};

struct Context {
  GlobalOptions global;
  std::function<int()> run;  // set by the chosen subcommand
};

// Prints "factory: <message>" to stderr and returns the exit status for it.
int fail(const Error& e);

void add_serve_command(CLI::App& app, Context& ctx);
void add_token_commands(CLI::App& app, Context& ctx);
void add_status_command(CLI::App& app, Context& ctx);
void add_host_commands(CLI::App& app, Context& ctx);
void add_kubevirt_commands(CLI::App& app, Context& ctx);
void add_tenant_commands(CLI::App& app, Context& ctx);
void add_catalog_commands(CLI::App& app, Context& ctx);

}  // namespace factory::cli
