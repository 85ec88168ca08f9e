#pragma once
// What every `factory` command shares: the global options, the one way a
// command fails, the coordinator config they all read, and the flags of the
// commands that talk to the host cluster. A command reads these and nothing
// of another command.
#include <CLI/CLI.hpp>
#include <functional>
#include <string>

#include "common/error.hpp"
#include "coordinator/config/coordinator_config.hpp"
#include "coordinator/kube/kubeconfig.hpp"

namespace factory::cli {

struct GlobalOptions {
  std::string config_path = "/etc/factory/coordinator.yaml";
  std::string server;      // overrides the API address from the config
  std::string token_file;  // overrides the admin token from the state dir
  std::string log_level = "warn";
};

// A subcommand's callback sets `run`, which returns the process exit status.
struct Context {
  GlobalOptions global;
  std::function<int()> run;
};

// --config, --server, --token-file, --log-level on the top-level app.
void add_global_options(CLI::App& app, GlobalOptions& g);

// Errors reach the user as one line on stderr: "factory: <what went wrong>:
// <what to do>". Returns the exit status for it (2 for bad input, else 1).
int fail(const Error& e);

// The coordinator config --config names. The default path may be absent
// (then defaults apply); a path given explicitly must exist.
Result<coordinator::CoordinatorConfig> load_config(const GlobalOptions& g);

// --kubeconfig FILE and --context NAME, spelt as kubectl spells them so an
// admin's habits carry over (kube::resolve_access says in which order
// kubeconfig sources are tried).
void add_kube_flags(CLI::App& cmd, kube::AccessOptions& opts);

}  // namespace factory::cli
