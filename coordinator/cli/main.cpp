// factory: the coordinator. Server and admin CLI in one binary, like vault or consul.
#include <iostream>

#include "common/cli/app.hpp"
#include "common/log.hpp"
#include "coordinator/cli/commands.hpp"

int main(int argc, char** argv) {
  using namespace factory::cli;
  // Named here, so help says "Usage: factory ..." however it was started.
  CLI::App app{"factory: run a catalog of GPU products on a KubeVirt host", "factory"};
  app.set_version_flag("--version", std::string("factory ") + FACTORY_VERSION);
  app.require_subcommand(1);
  app.fallthrough();
  Context ctx;
  add_global_options(app, ctx.global);
  set_examples(app,
               {{"factory serve --config /etc/factory/coordinator.yaml", "run the coordinator"},
                {"factory tenant create alice --tier gpu-vm --wait", "a GPU VM for alice"},
                {"factory status", "every tenant, its agent and its GPU"},
                {"factory COMMAND --help", "more about one command"}});

  add_serve_command(app, ctx);
  add_token_commands(app, ctx);
  add_status_command(app, ctx);
  add_host_commands(app, ctx);
  add_kubevirt_commands(app, ctx);
  add_tenant_commands(app, ctx);
  add_catalog_commands(app, ctx);
  add_install_commands(app, ctx);
  add_agent_commands(app, ctx);
  add_usage_command(app, ctx);

  if (auto done = parse(app, argc, argv)) return *done;
  factory::setup_logging("factory", ctx.global.log_level.empty() ? "warn" : ctx.global.log_level);
  if (!ctx.run) {
    std::cerr << app.help();
    return kExitUsage;
  }
  try {
    return ctx.run();
  } catch (const std::exception& e) {
    // A bug, not a user error: still one line, and the error status.
    std::cerr << "factory: internal error: " << e.what() << "\n";
    return kExitError;
  }
}
