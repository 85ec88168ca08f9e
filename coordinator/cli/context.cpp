#include "coordinator/cli/context.hpp"

#include <iostream>

#include "common/cli/app.hpp"
#include "common/display.hpp"
#include "coordinator/enroll/tenant_name.hpp"
#include "coordinator/tenants/k8s_names.hpp"

namespace factory::cli {

void add_global_options(CLI::App& app, GlobalOptions& g) {
  apply_conventions(app);
  app.add_option("--config", g.config_path, "Coordinator config file")
      ->type_name("FILE")
      ->envname("FACTORY_CONFIG")
      ->capture_default_str();
  app.add_option("--server", g.server, "Coordinator API URL (overrides the config)")
      ->type_name("URL")
      ->envname("FACTORY_SERVER");
  app.add_option("--token-file", g.token_file,
                 "Admin token file (overrides <state_dir>/admin.token)")
      ->type_name("FILE")
      ->envname("FACTORY_TOKEN_FILE");
  add_log_level_option(app, g.log_level,
                       "Log level (default: warn; for serve, the config's log_level)");
}

int fail(const Error& e) {
  // A message may quote what a guest reported (a failed step's message).
  std::cerr << "factory: " << display::sanitize(e.message) << "\n";
  return e.code == Errc::invalid_argument ? kExitUsage : kExitError;
}

namespace {
// A CLI11 check from one of the name rules: its message, or "" when it holds.
CLI::Validator rule(Status (*check)(std::string_view), const char* what) {
  return CLI::Validator(
      [check](std::string& value) -> std::string {
        auto st = check(value);
        return st.ok() ? "" : st.error().message;
      },
      what);
}
}  // namespace

CLI::Validator tenant_name_rule() {
  return rule(enroll::validate_tenant_name, "NAME");
}

namespace {
Status validate_project(std::string_view s) {
  if (tenants::is_dns1123_label(s)) return {};
  return Error(Errc::invalid_argument,
               "project '" + std::string(s.substr(0, 63)) +
                   "' is not a DNS-1123 label (lower-case letters, digits, '-'; at most 63)");
}
}  // namespace

CLI::Validator project_rule() {
  return rule(validate_project, "PROJECT");
}

CLI::Validator namespace_rule() {
  return rule(tenants::validate_namespace_name, "NAMESPACE");
}

Result<coordinator::CoordinatorConfig> load_config(const GlobalOptions& g) {
  // A config named by --config or FACTORY_CONFIG must exist; the default
  // path may be absent (then every key has its default).
  bool explicit_config = g.config_path != kDefaultConfigPath;
  return coordinator::load_coordinator_config(g.config_path, explicit_config);
}

void add_kube_flags(CLI::App& cmd, kube::AccessOptions& opts) {
  cmd.add_option("--kubeconfig", opts.kubeconfig,
                 "Kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then the pod's "
                 "service account)");
  cmd.add_option("--context", opts.context, "Kubeconfig context (default: its current-context)");
}

}  // namespace factory::cli
