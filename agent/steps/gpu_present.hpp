#pragma once
// Step kind `gpu_present`: the GPU is on the guest's PCI bus.
//
// Params (as catalog/catalog.yaml writes them; their types, defaults and
// ranges are contract/step_params.cpp's, which the catalog checks too):
//   vendor:    "10de"  PCI vendor ID, 4 hex digits (default NVIDIA)
//   min_count: 1       at least this many display-class functions of that vendor
//
// check/verify: <root>/sys/bus/pci/devices has the functions.
// apply: nothing can be done in the guest (a driver cannot create a PCI
// device), so it fails with the diagnosis "gpu_not_on_pci_bus" and the fix on
// the host. The plan stops there instead of installing a driver for nothing.
#include <memory>

#include "agent/plan/step.hpp"

namespace factory::agent::steps {

Result<std::unique_ptr<Step>> make_gpu_present(const StepSpec& spec);

}  // namespace factory::agent::steps
