#pragma once
// The flags every command that talks to the host cluster takes, spelt as
// kubectl spells them, so an admin's habits carry over.
#include <CLI/CLI.hpp>

#include "coordinator/kube/kubeconfig.hpp"

namespace factory::kube {

// --kubeconfig FILE and --context NAME (see resolve_access for the order in
// which kubeconfig sources are tried).
void add_kube_flags(CLI::App& cmd, AccessOptions& opts);

}  // namespace factory::kube
