#pragma once
// PCI functions as sysfs shows them under /sys/bus/pci/devices/<address>/:
// vendor/device/class/subsystem_* hold "0x10de\n"-style values, `driver` and
// `iommu_group` are links, driver_override holds "(null)" or a driver name,
// and /sys/kernel/iommu_groups/<n>/devices/ lists each group's members.
#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"
#include "coordinator/host/host_root.hpp"

namespace factory::host {

inline constexpr uint16_t kNvidiaVendor = 0x10de;

// DOMAIN:BUS:DEVICE.FUNCTION, e.g. 0000:01:00.0. Cards are always named by
// address, never by vendor:device ID: two L4s share 10de:27b8.
struct PciAddress {
  uint32_t domain = 0;
  uint8_t bus = 0;
  uint8_t device = 0;
  uint8_t function = 0;

  // Accepts "0000:01:00.0" and lspci's short "01:00.0" (domain 0000), any case.
  static Result<PciAddress> parse(std::string_view text);
  std::string str() const;   // "0000:01:00.0", as the kernel names the sysfs entry
  std::string slot() const;  // "0000:01:00": the card; its functions share it
  bool same_slot(const PciAddress& o) const {
    return domain == o.domain && bus == o.bus && device == o.device;
  }
  auto operator<=>(const PciAddress&) const = default;
};

struct PciFunction {
  PciAddress address;
  uint16_t vendor = 0;
  uint16_t device = 0;
  uint32_t class_code = 0;  // 0x030200 = 3D controller
  uint16_t subsystem_vendor = 0;
  uint16_t subsystem_device = 0;
  std::string driver;                   // empty when no driver is bound
  std::optional<unsigned> iommu_group;  // none when the IOMMU is off (or a VM without vIOMMU)
  std::string driver_override;          // empty when sysfs says "(null)"

  bool is_nvidia() const { return vendor == kNvidiaVendor; }
  bool is_bridge() const { return (class_code >> 8) == 0x0604; }  // PCI-to-PCI bridge
  bool is_display() const { return (class_code >> 16) == 0x03; }  // VGA / 3D controller
  std::string vendor_id() const;                                  // "10de"
  std::string device_id() const;                                  // "27b8"
  std::string subsystem_id() const;                               // "10de:16ca"
  std::string class_id() const;                                   // "0302"
  std::string sysfs_dir() const { return "/sys/bus/pci/devices/" + address.str(); }
};

// Four lower-case hex digits, as lspci -n prints IDs.
std::string hex4(uint16_t v);

class PciBus {
 public:
  explicit PciBus(HostRoot root) : root_(std::move(root)) {}

  // Every function under /sys/bus/pci/devices, sorted by address.
  Result<std::vector<PciFunction>> functions() const;
  // One function; a clear not_found error when the address is not on this host.
  Result<PciFunction> function(const PciAddress& addr) const;
  // The members of an IOMMU group (including the one asked about), sorted.
  std::vector<PciAddress> iommu_group_members(unsigned group) const;
  // True when /sys/kernel/iommu_groups has at least one group: the IOMMU is on.
  bool iommu_groups_present() const;
  size_t iommu_group_count() const;

  const HostRoot& root() const { return root_; }

 private:
  HostRoot root_;
};

}  // namespace factory::host
