#pragma once
// What the host is doing besides the PCI tree: kernel modules (loaded, present
// on disk, set to load at boot), processes (nvidia-persistenced and anything
// else holding a card's /dev/nvidiaN open), driverctl's saved overrides and
// the CPU's virtualization flag. Everything is read under the HostRoot.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "coordinator/host/host_root.hpp"
#include "coordinator/host/pci.hpp"

namespace factory::host {

// The modules the runbook loads, in load order. vfio_pci is what binds.
const std::vector<std::string>& vfio_module_names();

struct ModuleState {
  std::string name;
  bool loaded = false;            // /sys/module/<name> exists, or built in
  bool builtin = false;           // in modules.builtin: always there, nothing to load
  std::optional<bool> available;  // in modules.dep / modules.builtin; nullopt: cannot tell
  std::string boot_file;          // the modules-load.d file that lists it; empty if none
                                  // (built-in modules need none)
};
std::vector<ModuleState> probe_vfio_modules(const HostRoot& root);
// The running kernel's release ("6.8.0-45-generic"), empty when unknown.
std::string kernel_release(const HostRoot& root);

// The modules-load.d file bind writes.
inline constexpr std::string_view kVfioModulesLoadFile = "/etc/modules-load.d/vfio.conf";

struct ProcessInfo {
  int pid = 0;
  std::string comm;
};
// Processes whose comm (the kernel's 15-character name) starts with prefix.
std::vector<ProcessInfo> find_processes(const HostRoot& root, std::string_view comm_prefix);
// nvidia-persistenced shows as "nvidia-persiste" in /proc/<pid>/comm.
std::optional<ProcessInfo> persistenced_process(const HostRoot& root);

// driverctl keeps one file per overridden device: /etc/driverctl.d/pci-<address>
// holding the driver name, and its udev rule re-applies it at every boot.
std::string driverctl_override_path(const PciAddress& addr);
std::optional<std::string> driverctl_override(const HostRoot& root, const PciAddress& addr);

// The nvidia driver's minor for a card (/dev/nvidia<minor>), from
// /proc/driver/nvidia/gpus/<address>/information; nullopt when unknown.
std::optional<unsigned> nvidia_device_minor(const HostRoot& root, const PciAddress& addr);
// Processes with /dev/nvidia<minor> open. Unbinding nvidia from a card that is
// open blocks in the kernel until the holder lets go, so bind refuses first.
std::vector<ProcessInfo> nvidia_device_holders(const HostRoot& root, unsigned minor);

struct CpuVirtualization {
  bool readable = false;  // /proc/cpuinfo could be read
  std::string flag;       // "svm" (AMD-V), "vmx" (Intel VT-x) or empty
  std::string vendor;     // "AuthenticAMD", "GenuineIntel", ...
};
CpuVirtualization probe_cpu_virtualization(const HostRoot& root);

// The IOMMU units the kernel registered (/sys/class/iommu: ivhd0.. on AMD-Vi,
// dmar0.. on Intel VT-d).
std::vector<std::string> iommu_units(const HostRoot& root);

}  // namespace factory::host
