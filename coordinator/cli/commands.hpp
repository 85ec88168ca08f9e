#pragma once
// The `factory` command tree: one registration per command group, each in
// its own file, all built on the shared pieces of context.hpp, output.hpp
// and admin_client.hpp. main.cpp calls them in the order `--help` lists them.
#include <CLI/CLI.hpp>

#include "coordinator/cli/context.hpp"

namespace factory::cli {

void add_serve_command(CLI::App& app, Context& ctx);   // serve_command.cpp
void add_token_commands(CLI::App& app, Context& ctx);  // token_commands.cpp
void add_status_command(CLI::App& app, Context& ctx);  // status_command.cpp
void add_host_commands(CLI::App& app, Context& ctx);   // host_commands.cpp
// `host drain` and `host undrain`, under the host group (maintenance_commands.cpp).
void add_host_maintenance_commands(CLI::App* host, Context& ctx);
void add_kubevirt_commands(CLI::App& app, Context& ctx);  // kubevirt_commands.cpp
void add_tenant_commands(CLI::App& app, Context& ctx);    // tenant_commands.cpp
// `tenant keys`, under the tenant group (tenant_keys_commands.cpp).
void add_tenant_keys_commands(CLI::App* tenant, Context& ctx);
void add_catalog_commands(CLI::App& app, Context& ctx);  // catalog_commands.cpp
void add_install_commands(CLI::App& app, Context& ctx);  // install_commands.cpp
void add_agent_commands(CLI::App& app, Context& ctx);    // agent_commands.cpp
void add_usage_command(CLI::App& app, Context& ctx);     // usage_command.cpp

}  // namespace factory::cli
