#pragma once
// The PCI ID database (pci.ids, from the pciutils / hwdata packages): vendor
// lines at column 0, device lines after one tab, subsystem lines after two,
// "#" comments, and the class list ("C 03  Display controller") at the end.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/error.hpp"
#include "coordinator/host/host_root.hpp"

namespace factory::host {

class PciIds {
 public:
  // Parses the file; shown_path is how messages name it ("/usr/share/misc/pci.ids").
  static Result<PciIds> load(const std::filesystem::path& file, std::string shown_path);
  static PciIds parse(const std::string& text, std::string shown_path);

  std::optional<std::string> vendor_name(uint16_t vendor) const;
  std::optional<std::string> device_name(uint16_t vendor, uint16_t device) const;
  std::optional<std::string> subsystem_name(uint16_t vendor, uint16_t device, uint16_t sub_vendor,
                                            uint16_t sub_device) const;
  // "2025.07.11" from the "#	Version:" header; empty if the file has none.
  const std::string& version() const { return version_; }
  const std::string& path() const { return path_; }
  // "/usr/share/misc/pci.ids (2023.01.11)"
  std::string describe() const;

 private:
  std::unordered_map<uint32_t, std::string> vendors_;
  std::unordered_map<uint32_t, std::string> devices_;     // vendor << 16 | device
  std::unordered_map<uint64_t, std::string> subsystems_;  // vendor,device,subvendor,subdevice
  std::string version_;
  std::string path_;
};

// Where Debian/Ubuntu (pciutils: /usr/share/misc), Fedora and hwdata
// (/usr/share/hwdata) and older systems (/usr/share) keep the file.
const std::vector<std::string>& pci_ids_search_path();

// --pci-ids FILE when given (it must exist: a typo must not silently fall back
// to an older list), else the first of pci_ids_search_path() under the root.
// nullopt when the host has none: names are then unknown, which the check reports.
Result<std::optional<PciIds>> find_pci_ids(const HostRoot& root, const std::string& override_file);

}  // namespace factory::host
