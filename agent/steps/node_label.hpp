#pragma once
// Step kind `node_label`: labels on the guest cluster's nodes, e.g. gpu=on,
// which HAMi needs before it schedules onto a node (runbook step 6,
// `kubectl label node --all gpu=on --overwrite`).
//
// Params (as catalog/catalog.yaml writes them; their types, defaults and
// ranges are contract/step_params.cpp's, which the catalog checks too):
//   labels:     {gpu: "on"}                   (required) label -> value
//   nodes:      all | [name, ...]             (default all)
//   kubeconfig: /etc/rancher/rke2/rke2.yaml   (default)
//
// check:  `kubectl get nodes -o json`: every targeted node (at least one)
//         carries every label with its value.
// apply:  `kubectl label node (--all | NAME...) k=v... --overwrite`.
// verify: as check; a failure names the nodes and labels still missing.
#include <memory>

#include "agent/plan/step.hpp"

namespace factory::agent::steps {

Result<std::unique_ptr<Step>> make_node_label(const StepSpec& spec);

}  // namespace factory::agent::steps
