#pragma once
// Step kind `mig`: cuts one GPU into MIG slices with nvidia-smi, for guests
// without the GPU Operator's mig-manager (which does the same from a node
// label: the gpu-k8s-mig tier).
//
// Params (types, defaults and ranges: contract/step_params.cpp):
//   gpu:       0                     the GPU's index (nvidia-smi -i)
//   instances: {"1g.18gb": 7}        profile name -> count; names, not IDs: the IDs
//                                    differ per model and are read off `-lgip`
//   enabled:   true                  false: tear MIG down on that GPU instead
//   reboot:    true                  false: fail instead of rebooting when MIG mode is pending
//
// check:  MIG mode is what `enabled` says and (enabled) the GPU instances
//         (`nvidia-smi mig -lgi`) and MIG devices (`nvidia-smi -L`) are exactly
//         `instances`.
// apply:  enabled: `nvidia-smi -i N -mig 1` (pending: the guest reboots, once;
//         still pending after it is a diagnosis); `nvidia-smi mig -i N -lgip`
//         maps names to this card's IDs; instances that differ are torn down
//         (-dci, -dgi); `nvidia-smi mig -i N -cgi <ids> -C` creates the rest,
//         larger slices first so they find their placements.
//         disabled: -dci, -dgi, then `nvidia-smi -i N -mig 0` (pending: reboot).
// verify: the same as check, saying what each slice is (profile, memory, UUID).
// Diagnoses: mig_not_supported, mig_mode_still_pending.
#include <memory>

#include "agent/plan/step.hpp"

namespace factory::agent::steps {

Result<std::unique_ptr<Step>> make_mig(const StepSpec& spec);

}  // namespace factory::agent::steps
