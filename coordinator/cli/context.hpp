#pragma once
// What every `factory` command shares: the global options, the one way a
// command fails, the coordinator config they all read, and the flags of the
// commands that talk to the host cluster. A command reads these and nothing
// of another command.
#include <CLI/CLI.hpp>
#include <functional>
#include <string>

#include "common/cli/app.hpp"
#include "common/error.hpp"
#include "coordinator/config/coordinator_config.hpp"
#include "coordinator/kube/kubeconfig.hpp"

namespace factory::cli {

inline constexpr const char* kDefaultConfigPath = "/etc/factory/coordinator.yaml";

// Each of the first three may also come from the environment
// (FACTORY_CONFIG, FACTORY_SERVER, FACTORY_TOKEN_FILE), as VAULT_ADDR does
// for vault: set once in a shell, it serves every command; a flag wins.
struct GlobalOptions {
  std::string config_path = kDefaultConfigPath;
  std::string server;      // overrides the API address from the config
  std::string token_file;  // overrides the admin token from the state dir
  std::string log_level;   // empty: warn for commands, the config's for serve
};

// A subcommand's callback sets `run`, which returns the process exit status.
struct Context {
  GlobalOptions global;
  std::function<int()> run;
};

// --config, --server, --token-file, --log-level on the top-level app, and
// the house conventions (common/cli/app.hpp) for the whole command tree.
void add_global_options(CLI::App& app, GlobalOptions& g);

// Errors reach the user as one line on stderr: "factory: <what went wrong>:
// <what to do>". Returns the exit status for it (2 for bad input, else 1).
int fail(const Error& e);

// The check of every argument or option that names a tenant: a name that
// breaks a rule is a usage error (exit 2, naming the rule) before any
// request is made, so a name a script passes along never becomes part of
// another path or a query.
CLI::Validator tenant_name_rule();
// The same for a Kubernetes namespace (a DNS-1123 label).
CLI::Validator namespace_rule();
// The same for a project (quotas and usage; a DNS-1123 label).
CLI::Validator project_rule();

// The coordinator config --config names. The default path may be absent
// (then defaults apply); a path given explicitly must exist.
Result<coordinator::CoordinatorConfig> load_config(const GlobalOptions& g);

// --kubeconfig FILE and --context NAME, spelt as kubectl spells them so an
// admin's habits carry over (kube::resolve_access says in which order
// kubeconfig sources are tried).
void add_kube_flags(CLI::App& cmd, kube::AccessOptions& opts);

}  // namespace factory::cli
