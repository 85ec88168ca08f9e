#pragma once
// The NVIDIA functions on the host, each with what an admin needs to decide
// about passthrough: its name, driver, IOMMU group and the group's other
// members, driverctl's override and the resource name KubeVirt would use.
// Also the IOMMU group rule shared by `host check` and `host bind`.
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "coordinator/host/pci.hpp"
#include "coordinator/host/pci_ids.hpp"
#include "coordinator/host/resource_name.hpp"

namespace factory::host {

struct GpuReport {
  PciFunction fn;
  std::optional<std::string> name;             // from pci.ids: "AD104GL [L4]"
  std::vector<PciAddress> group_members;       // the other functions in its IOMMU group
  std::optional<std::string> override_driver;  // driverctl's saved override
  ResourceName resource;
};

struct HostInventory {
  std::vector<PciFunction> functions;  // every PCI function, sorted
  std::vector<GpuReport> nvidia;       // every NVIDIA function, sorted
  const PciFunction* find(const PciAddress& a) const;
};

Result<HostInventory> take_inventory(const PciBus& bus, const PciIds* ids);

// How one member of a card's IOMMU group stands with respect to passthrough.
enum class MemberRole {
  card,    // a function being passed through (asked for, or the card's own)
  bridge,  // a PCI bridge: vfio allows it to stay on its driver
  idle,    // no driver, or vfio-pci / pci-stub: does not stop the group
  in_use,  // a host driver owns it: the group is not viable
};

struct GroupMember {
  PciFunction fn;
  MemberRole role = MemberRole::idle;
};

// Every function in an IOMMU group must be on vfio-pci (or idle) or KubeVirt
// fails the VM with "group not viable". The card's own functions (same
// bus:device: its audio, USB-C controller) go with it; bridges stay; anything
// else a host driver owns blocks the card. `moving` is the set of functions
// the caller is passing through (the cards asked for).
struct GroupAnalysis {
  unsigned group = 0;
  std::vector<GroupMember> members;
  std::vector<PciAddress> to_move() const;           // role card, sorted
  std::vector<const GroupMember*> blockers() const;  // role in_use
  // "IOMMU group 5 also holds 0000:02:00.0 (class 0106, driver ahci), which the host uses"
  std::string blocker_text() const;
};
GroupAnalysis analyze_group(const HostInventory& inv, const PciBus& bus, unsigned group,
                            const std::set<PciAddress>& moving);

// Drivers that leave a group viable for vfio.
bool driver_leaves_group_viable(const std::string& driver);

}  // namespace factory::host
