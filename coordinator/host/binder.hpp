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
#include <sys/types.h>

#include <vector>

#include "common/error.hpp"
#include "coordinator/host/host_root.hpp"
#include "coordinator/host/pci.hpp"
#include "coordinator/host/pci_ids.hpp"
#include "coordinator/host/plan.hpp"

namespace factory::host {

// Binding the real machine's cards writes /sys and /etc: root only. The
// caller passes the effective uid (geteuid() for the real machine) and
// `what` names the command in the refusal.
Status require_root(uid_t euid, const std::string& what);

// Refuses (nothing changed) for an unknown address, a non-NVIDIA function, a
// card without an IOMMU group, a group shared with a function the host uses,
// a card held open by a process, a kernel without vfio_pci, or no driverctl.
// ids may be null; it only names cards in the output.
Result<HostPlan> plan_bind(const HostRoot& root, const std::vector<PciAddress>& cards,
                           const PciIds* ids);

Result<HostPlan> plan_unbind(const HostRoot& root, const std::vector<PciAddress>& cards,
                             const PciIds* ids);

}  // namespace factory::host
