#pragma once
// KVM when it works, TCG otherwise. "Works" is decided by running guests:
// /dev/kvm can exist and open while nested virtualization still fails, in
// two ways seen on this project's CI machines. On one, QEMU with `-cpu host`
// aborts setting an MSR: a one-sector disk whose real-mode boot code prints
// a line on the serial port catches that. On another, that sector ran, but
// a Linux kernel under KVM printed its setup code's "Probing EDD ... ok" and
// then nothing (any -cpu), so every tenant stayed `pending` for good: the
// second probe boots a real kernel (the base image's, else the host's own)
// with no disk and no initramfs, and takes KVM only when it reaches mounting
// a root file system, past decompression, long mode, the clock and the CPUs.
#include <chrono>
#include <string>

#include "common/error.hpp"

namespace factory::qemu {

struct Accelerator {
  std::string name;    // "kvm" or "tcg"
  std::string reason;  // why not KVM (empty when KVM, or when TCG was configured)
};

struct AcceleratorProbe {
  std::string mode = "auto";  // qemu.accel: "auto", "kvm" or "tcg"
  std::string qemu_binary;
  std::string work_dir;  // where the boot sector's disk goes
  // The kernel to boot under KVM: the base image's when it has one, else
  // the host's (host_kernel()); empty: the boot sector only, said in the log.
  std::string kernel;
  int vcpus = 2;  // as tenants get them: bringing up the other CPUs is part of the test
  std::chrono::milliseconds sector_timeout{std::chrono::seconds(10)};
  // A kernel under working KVM gets there in 1 to 3 s; under TCG in 10 to 30.
  std::chrono::milliseconds kernel_timeout{std::chrono::seconds(45)};
};

// Blocking (up to both timeouts): call it off the io threads, once.
Accelerator choose_accelerator(const AcceleratorProbe& probe);

// The probe's disk: 512 bytes of real-mode code that writes `banner` to
// COM1, then (exit) ends QEMU through isa-debug-exit or (!exit) halts for
// good, with the boot signature. The banner must fit the sector.
inline constexpr const char* kProbeBanner = "FACTORY-KVM-OK";
std::string probe_boot_sector(const std::string& banner = kProbeBanner, bool exit = true);

// Boots `disk` (a boot sector, under `accel`) and says whether `want` came
// on the serial port in time; the reason when not.
std::string boot_sector_problem(const std::string& qemu_binary, const std::string& accel,
                                const std::string& disk, const std::string& want,
                                std::chrono::milliseconds timeout);

// What a kernel booted with no disk and no initramfs printed: whether it got
// as far as trying to mount a root file system (its "VFS:" line), and, when
// not, the last thing it said.
struct KernelBoot {
  bool reached_root_mount = false;
  std::string last_line;  // empty: the serial port stayed silent
  bool timed_out = false;
  double seconds = 0;
};
Result<KernelBoot> probe_kernel_boot(const std::string& qemu_binary, const std::string& accel,
                                     const std::string& kernel, int vcpus,
                                     std::chrono::milliseconds timeout);

// /boot/vmlinuz-<the running kernel's release> when it can be read, else "".
std::string host_kernel();

}  // namespace factory::qemu
