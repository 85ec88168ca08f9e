#include "coordinator/cli/context.hpp"

#include <iostream>

#include "common/display.hpp"

namespace factory::cli {

void add_global_options(CLI::App& app, GlobalOptions& g) {
  app.add_option("--config", g.config_path, "Coordinator config file")->capture_default_str();
  app.add_option("--server", g.server, "Coordinator API URL (overrides the config)");
  app.add_option("--token-file", g.token_file,
                 "Admin token file (overrides <state_dir>/admin.token)");
  app.add_option("--log-level", g.log_level, "trace|debug|info|warn|error")->capture_default_str();
}

int fail(const Error& e) {
  // A message may quote what a guest reported (a failed step's message).
  std::cerr << "factory: " << display::sanitize(e.message) << "\n";
  return e.code == Errc::invalid_argument ? 2 : 1;
}

Result<coordinator::CoordinatorConfig> load_config(const GlobalOptions& g) {
  bool explicit_config = g.config_path != GlobalOptions{}.config_path;
  return coordinator::load_coordinator_config(g.config_path, explicit_config);
}

void add_kube_flags(CLI::App& cmd, kube::AccessOptions& opts) {
  cmd.add_option("--kubeconfig", opts.kubeconfig,
                 "Kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then the pod's "
                 "service account)");
  cmd.add_option("--context", opts.context, "Kubeconfig context (default: its current-context)");
}

}  // namespace factory::cli
