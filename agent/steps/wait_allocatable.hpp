#pragma once
// Step kind `wait_allocatable`: the guest cluster advertises the GPUs the
// tier promises, e.g. nvidia.com/gpu: 10 from one L4 split by HAMi (runbook
// step 7: `kubectl describe node | grep -A6 Allocatable`).
//
// Params (as catalog/catalog.yaml writes them; their types, defaults and
// ranges are contract/step_params.cpp's, which the catalog checks too):
//   resource:   nvidia.com/gpu                (required)
//   count:      10                            (required) at least this many
//   kubeconfig: /etc/rancher/rke2/rke2.yaml   (default)
//
// The count is status.allocatable[resource] summed over the Ready nodes
// (one node in this tier).
// check:  already at least `count` (one look).
// apply:  polls every 2 s until at least `count` or the step's deadline,
//         with a progress event whenever the number changes.
// verify: one look, at least `count`.
// Diagnoses (when it never gets there): hami_pods_pending (HAMi installed,
//   no node labelled gpu=on; fix `kubectl label node --all gpu=on`),
//   two_device_plugins, device_plugin_not_running, allocatable_short.
#include <memory>

#include "agent/plan/step.hpp"

namespace factory::agent::steps {

Result<std::unique_ptr<Step>> make_wait_allocatable(const StepSpec& spec);

}  // namespace factory::agent::steps
