#pragma once
// Which NVIDIA cards support Multi-Instance GPU, by PCI device ID: the
// GA100, GH100 and GB100/GB102 chips (A30, A100, A800, H100, H200, H800,
// H20, GH200, B100, B200, GB200), as their entries in pci.ids show (the
// copy at tests/fixtures/real/third-party/pci.ids-nvidia-2025.07.11:
// 20b0-20ff GA100, 2300-23ff GH100, 2900-29ff GB100/GB102). Ada and
// earlier cards (the runbook's L4, 10de:27b8) have no MIG.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "contract/catalog.hpp"

namespace factory {

// A MIG GPU instance profile's name as nvidia-smi and the GPU Operator write
// it: "<slices>g.<memory>gb", optionally "+<letters>" ("1g.18gb", "1g.18gb+me").
// The mig step's instances and a MIG tier's config are keyed by it.
bool valid_mig_profile_name(std::string_view name);

// A tier cuts its card into MIG slices: a helm_release step carries a
// mig-manager config (values.migManager.config.data) or a `mig` step enables
// MIG. Such a tier needs a MIG-capable card: `tenant create` refuses others,
// and the catalog checks the tier's config when it loads.
bool tier_needs_mig(const catalog::Tier& tier);

// The chip family when the device supports MIG ("GH100"), else nullopt.
std::optional<std::string> mig_chip(std::uint32_t vendor, std::uint32_t device);

// "10de:2335" (KubeVirt's pciVendorSelector) -> vendor and device; nullopt
// when it is not two 4-digit hex numbers.
struct PciId {
  std::uint32_t vendor = 0;
  std::uint32_t device = 0;
};
std::optional<PciId> parse_pci_selector(std::string_view selector);

}  // namespace factory
