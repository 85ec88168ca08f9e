#pragma once
// Which of the host's cards a QEMU tenant may get: NVIDIA display functions
// that `factory host bind` put on vfio-pci (bound to vfio-pci now, and kept
// there by its driverctl override) and that are not quarantined
// (coordinator/host/quarantine.hpp), each given to one tenant at a time.
// Read from sysfs under a HostRoot, so tests run on captured trees.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "coordinator/host/host_root.hpp"

namespace factory::qemu {

struct HostCard {
  std::string address;       // "0000:01:00.0"
  std::string resource;      // "nvidia.com/AD104GL_L4", as KubeVirt's device plugin names it
  std::string name;          // "AD104GL [L4]" when pci.ids knows it
  std::string driver;        // in use now
  std::uint16_t vendor = 0;  // PCI IDs: 0x10de, 0x27b8 (the L4)
  std::uint16_t device = 0;
  bool passthrough = false;  // on vfio-pci and kept there by driverctl: `factory host bind` did it
  bool quarantined = false;  // `factory host quarantine` took it out of the pool
  std::string why_not;       // when not: what to do, one line
};

// Every NVIDIA display function of the host (sorted by address).
Result<std::vector<HostCard>> host_cards(const host::HostRoot& root);

// The cards that support MIG (contract/mig_cards.hpp), for a tier that cuts its
// card into MIG slices; none: one line naming what the host has instead.
Result<std::vector<HostCard>> mig_capable(const std::vector<HostCard>& cards,
                                          const std::string& tier);

// Picks `count` cards for `tenant`: passthrough ones of `resource` (empty:
// any resource, the first that has enough free), none that another tenant
// holds (`held`: address -> tenant; the tenant's own cards count as free).
// On a shortfall, one line saying what the host has, who holds what and
// what to do.
struct GpuPick {
  std::string resource;
  std::vector<std::string> addresses;
};
Result<GpuPick> pick_gpus(const std::vector<HostCard>& cards, const std::string& resource,
                          int count, const std::string& tenant,
                          const std::map<std::string, std::string>& held);

}  // namespace factory::qemu
