// Registration points for command groups not built yet. Each module's owner
// deletes its function here when it adds the real one in its own folder.
#include "coordinator/cli/commands.hpp"

namespace factory::cli {
void add_serve_command(CLI::App&, Context&) {}
void add_token_commands(CLI::App&, Context&) {}
void add_status_command(CLI::App&, Context&) {}
void add_tenant_commands(CLI::App&, Context&) {}
}  // namespace factory::cli
