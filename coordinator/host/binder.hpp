#pragma once
// Step 2 of the runbook: move cards to vfio-pci by address and keep them there
// across reboots, and give them back. Only plans here; plan.hpp runs them.
//
// bind, per IOMMU group: unbind the current driver, driver_override=vfio-pci,
// bind vfio-pci, `driverctl set-override <addr> vfio-pci`; before any card:
// load vfio, vfio_iommu_type1, vfio_pci and list them in modules-load.d, stop
// nvidia-persistenced when it would hold a card being moved (and start it
// again afterwards while other cards stay on nvidia).
// unbind: `driverctl unset-override`, clear driver_override, unbind vfio-pci,
// reprobe so the host driver takes the card back.
#include <vector>

#include "common/error.hpp"
#include "coordinator/host/host_root.hpp"
#include "coordinator/host/pci.hpp"
#include "coordinator/host/pci_ids.hpp"
#include "coordinator/host/plan.hpp"

namespace factory::host {

// Binding writes /sys and /etc: root only. The check is skipped for trees
// under --host-root; FACTORY_HOST_ASSUME_NONROOT=1 makes it fail anyway, so
// the refusal itself can be tested (the test suite runs as root).
Status require_root(const HostRoot& root, const std::string& what);

// Refuses (nothing changed) for an unknown address, a non-NVIDIA function, a
// card without an IOMMU group, a group shared with a function the host uses,
// a card held open by a process, a kernel without vfio_pci, or no driverctl.
// ids may be null; it only names cards in the output.
Result<HostPlan> plan_bind(const HostRoot& root, const std::vector<PciAddress>& cards,
                           const PciIds* ids);

Result<HostPlan> plan_unbind(const HostRoot& root, const std::vector<PciAddress>& cards,
                             const PciIds* ids);

}  // namespace factory::host
