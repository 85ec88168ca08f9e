// factory: the coordinator. Server and admin CLI in one binary, like vault or consul.
#include <iostream>

#include "common/log.hpp"
#include "coordinator/cli/commands.hpp"

int main(int argc, char** argv) {
  using namespace factory::cli;
  CLI::App app{"factory: run a catalog of GPU products on a KubeVirt host"};
  app.set_version_flag("--version", std::string("factory ") + FACTORY_VERSION);
  app.require_subcommand(1);
  app.fallthrough();
  Context ctx;
  add_global_options(app, ctx.global);

  add_serve_command(app, ctx);
  add_token_commands(app, ctx);
  add_status_command(app, ctx);
  add_host_commands(app, ctx);
  add_kubevirt_commands(app, ctx);
  add_tenant_commands(app, ctx);
  add_catalog_commands(app, ctx);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  factory::setup_logging("factory", ctx.global.log_level);
  if (!ctx.run) {
    std::cerr << app.help();
    return 2;
  }
  try {
    return ctx.run();
  } catch (const std::exception& e) {
    // A bug, not a user error: still one line, and a non-zero exit.
    std::cerr << "factory: internal error: " << e.what() << "\n";
    return 70;
  }
}
