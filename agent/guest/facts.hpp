#pragma once
// Facts about the guest that steps, health and diagnoses all read: the PCI
// functions in sysfs, loaded kernel modules, the kernel log, the boot id and
// dpkg's view of a package. Paths go through GuestEnv::path and commands
// through PATH, so the same code reads a real guest or the simulated one.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "agent/guest/env.hpp"

namespace factory::agent {

// One function in <root>/sys/bus/pci/devices.
struct PciFunction {
  std::string address;  // "0000:09:00.0"
  std::uint32_t vendor = 0;
  std::uint32_t device = 0;
  std::uint32_t class_code = 0;  // 24 bits: 0x030200 is a 3D controller
  std::uint32_t subsystem_vendor = 0;
  std::uint32_t subsystem_device = 0;
  std::string driver;  // basename of the driver symlink; empty when unbound

  // NVIDIA (0x10de) and a display controller (base class 0x03): a GPU, not
  // the card's audio or USB functions.
  bool is_nvidia_gpu() const { return vendor == 0x10de && (class_code >> 16) == 0x03; }
  std::string id() const;  // "10de:27b8"
  nlohmann::json to_json() const;
};

// Every PCI function, sorted by address. Missing or unreadable attributes are
// left 0 (sysfs of an odd guest should not stop a probe).
std::vector<PciFunction> scan_pci_bus(const GuestEnv& env);
std::vector<PciFunction> nvidia_gpus(const GuestEnv& env);

// /sys/module/<name> exists, or /proc/modules lists it.
bool kernel_module_loaded(const GuestEnv& env, const std::string& name);

// The kernel's messages: <root>/var/log/kern.log (its last max_bytes) followed
// by `dmesg` output when dmesg runs (it may need privileges the agent lacks).
std::string kernel_log(const GuestEnv& env, size_t max_bytes = 256 * 1024);

// <root>/proc/sys/kernel/random/boot_id: changes on every boot.
std::string boot_id(const GuestEnv& env);

// What `dpkg -s NAME` says about a package.
struct PackageState {
  bool installed = false;  // Status: install ok installed, or hold ok installed
  bool held = false;       // Status: hold ...: `apt-mark hold` keeps apt from changing it
  std::string status;      // the Status line's value, e.g. "install ok half-configured"
  std::string version;
};
PackageState parse_dpkg_status(const std::string& dpkg_s_output);
// Runs `dpkg -s NAME`; a missing dpkg or an unknown package reads as not installed.
PackageState dpkg_package(const std::string& name);

// The first line of text containing needle (without its trailing newline), or "".
std::string find_line(const std::string& text, const std::string& needle);
// The last n lines of text.
std::string last_lines(const std::string& text, size_t n);

}  // namespace factory::agent
