#include "coordinator/kube/cli_flags.hpp"

namespace factory::kube {

void add_kube_flags(CLI::App& cmd, AccessOptions& opts) {
  cmd.add_option("--kubeconfig", opts.kubeconfig,
                 "Kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then the pod's "
                 "service account)");
  cmd.add_option("--context", opts.context, "Kubeconfig context (default: its current-context)");
}

}  // namespace factory::kube
