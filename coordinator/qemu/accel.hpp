#pragma once
// KVM when it works, TCG otherwise. "Works" is decided by running a guest:
// /dev/kvm can exist and open while nested virtualization still fails (on
// this project's CI machines QEMU with `-cpu host` aborts setting an MSR), so
// the probe starts QEMU under KVM with the same CPU model tenants get, on a
// one-sector disk whose boot code prints a line on the serial port, and
// takes KVM only when that line comes back.
#include <chrono>
#include <string>

namespace factory::qemu {

struct Accelerator {
  std::string name;    // "kvm" or "tcg"
  std::string reason;  // why not KVM (empty when KVM, or when TCG was configured)
};

// mode: "auto", "kvm" or "tcg" (qemu.accel). work_dir: where the probe's disk
// goes. Blocking (up to `timeout` for the probe guest): call it off the io
// threads, once.
Accelerator choose_accelerator(const std::string& mode, const std::string& qemu_binary,
                               const std::string& work_dir,
                               std::chrono::milliseconds timeout = std::chrono::seconds(10));

// The probe's disk: 512 bytes of real-mode code that writes kProbeBanner to
// COM1 and halts, with the boot signature.
inline constexpr const char* kProbeBanner = "FACTORY-KVM-OK";
std::string probe_boot_sector();

}  // namespace factory::qemu
