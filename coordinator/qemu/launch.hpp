#pragma once
// What a tenant's QEMU process is made of, as pure data and pure functions:
// the VM's shape in QEMU's units (from the Kubernetes quantities the catalog
// speaks), the base image it sits on, and the exact command line. No I/O
// here beyond reading an image's description, so the command line is tested
// as text and the provider only runs it.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"

namespace factory::qemu {

// Kubernetes quantities ("8", "500m", "16Gi", "2.5G") as QEMU wants them.
// CPUs round up to whole vCPUs (500m is one); sizes are bytes.
Result<int> vcpus_from_quantity(std::string_view cpu);
Result<std::uint64_t> bytes_from_quantity(std::string_view size);

// The disk every tenant's copy-on-write disk is created over. Either a folder
// holding image.json (deploy/qemu/build-image.sh writes it: a disk without a
// boot loader, booted through its kernel and initrd), or a disk file that
// boots by its own boot loader (Ubuntu's cloud image).
struct BaseImage {
  std::string source;                  // what qemu.base_image named
  std::string disk;                    // absolute path
  std::string format;                  // qcow2 or raw
  std::string kernel, initrd, append;  // empty: firmware boots the disk
  bool direct_kernel() const { return !kernel.empty(); }
};
Result<BaseImage> load_base_image(const std::string& path);
// "qcow2" or "raw", from the file's first bytes (QEMU's own test).
Result<std::string> disk_format(const std::string& path);

// One VM's process, fully resolved.
struct Launch {
  std::string tenant;
  std::string dir;  // the VM's folder: disk, seed, pidfile, QMP socket, console log
  int vcpus = 1;
  std::uint64_t memory_mib = 1024;
  std::string accel = "tcg";  // kvm | tcg
  BaseImage image;
  std::string ssh_listen = "127.0.0.1";
  int ssh_port = 0;
  std::vector<std::string> gpus;  // host PCI addresses, each passed through by vfio-pci

  std::string disk() const { return dir + "/disk.qcow2"; }
  std::string seed() const { return dir + "/seed.iso"; }
  std::string pidfile() const { return dir + "/qemu.pid"; }
  std::string qmp_socket() const { return dir + "/qmp.sock"; }  // QEMU binds it as qmp.sock
  std::string console_log() const { return dir + "/console.log"; }
  std::string process_log() const { return dir + "/qemu.log"; }
};

// "factory-vm-<tenant>": the systemd unit, QEMU's -name and process name.
std::string vm_unit_name(const std::string& tenant);

// The command line of the tenant's QEMU: q35, the tier's CPUs and memory,
// the copy-on-write disk and the NoCloud seed on virtio, user-mode
// networking with the guest's port 22 forwarded to ssh_listen:ssh_port, a
// serial console appended to console.log, a QMP socket and a pidfile (the
// coordinator finds a running VM again by them; QEMU runs in the VM's folder
// and names its socket relative to it, since a Unix socket's path may not
// exceed 107 bytes and a state directory can), and each GPU on a PCIe root
// port of its own as `-device vfio-pci,host=ADDR`. A guest reboot resets the
// machine inside the same process; a guest poweroff ends the process (and
// the supervisor starts it again).
std::vector<std::string> qemu_argv(const std::string& binary, const Launch& l);

// `systemd-run` starting that command as the transient unit
// factory-vm-<tenant>, restarted by systemd whenever it ends.
std::vector<std::string> systemd_run_argv(const std::string& systemd_run,
                                          const std::vector<std::string>& qemu, const Launch& l);

}  // namespace factory::qemu
