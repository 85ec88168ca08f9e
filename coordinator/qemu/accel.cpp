#include "coordinator/qemu/accel.hpp"

#include <fcntl.h>
#include <linux/kvm.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "common/atomic_file.hpp"
#include "common/subprocess.hpp"

namespace factory::qemu {

std::string probe_boot_sector(const std::string& banner, bool exit) {
  // xor ax,ax; mov ds,ax; cld; mov dx,0x3f8; mov si,msg
  // loop: lodsb; test al,al; jz done; out dx,al; jmp loop
  // done: mov al,0x10; out 0xf4,al (isa-debug-exit: QEMU ends, status 33)
  // halt: cli; hlt; jmp halt;  msg: the banner, CR, LF, 0
  // Without exit, the two bytes of `out 0xf4,al` become NOPs: it halts.
  std::vector<unsigned char> code = {0x31, 0xC0, 0x8E, 0xD8, 0xFC, 0xBA, 0xF8, 0x03, 0xBE,
                                     0x1B, 0x7C, 0xAC, 0x84, 0xC0, 0x74, 0x03, 0xEE, 0xEB,
                                     0xF8, 0xB0, 0x10, 0xE6, 0xF4, 0xFA, 0xF4, 0xEB, 0xFC};
  if (!exit) code[21] = code[22] = 0x90;
  std::string s(code.begin(), code.end());
  s += banner.substr(0, 510 - s.size() - 3);
  s += "\r\n";
  s.push_back('\0');
  s.resize(510, '\0');
  s.push_back(static_cast<char>(0x55));
  s.push_back(static_cast<char>(0xAA));
  return s;
}

namespace {

// Whether /dev/kvm answers as KVM does; the reason when not.
std::string kvm_device_problem() {
  int fd = ::open("/dev/kvm", O_RDWR | O_CLOEXEC);
  if (fd < 0) return std::string("cannot open /dev/kvm: ") + std::strerror(errno);
  int version = ::ioctl(fd, KVM_GET_API_VERSION, 0);
  ::close(fd);
  if (version != KVM_API_VERSION)
    return "/dev/kvm answers API version " + std::to_string(version) + ", not " +
           std::to_string(KVM_API_VERSION);
  return "";
}

// QEMU's first "error" line (an abort's assertion follows it), else its last.
std::string telling_line(const std::string& text) {
  std::string first_error, last;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    std::string l = text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    pos = nl == std::string::npos ? text.size() : nl + 1;
    while (!l.empty() && (l.back() == '\r' || l.back() == ' ')) l.pop_back();
    if (l.empty()) continue;
    if (first_error.empty() && l.find("error") != std::string::npos) first_error = l;
    last = l;
  }
  std::string l = first_error.empty() ? last : first_error;
  if (l.size() > 200) l = l.substr(0, 200) + "...";
  return l;
}

// A probe machine: q35 on `accel` with `memory`, its serial line on stdout
// and nothing else; under KVM the CPU model tenants get (launch.cpp).
std::vector<std::string> probe_machine(const std::string& qemu_binary, const std::string& accel,
                                       const std::string& memory) {
  std::vector<std::string> argv = {qemu_binary, "-machine", "q35", "-accel", accel};
  if (accel == "kvm") argv.insert(argv.end(), {"-cpu", "host"});
  argv.insert(argv.end(), {"-m", memory, "-nodefaults", "-no-user-config", "-display", "none",
                           "-serial", "stdio"});
  return argv;
}

}  // namespace

std::string boot_sector_problem(const std::string& qemu_binary, const std::string& accel,
                                const std::string& disk, const std::string& want,
                                std::chrono::milliseconds timeout) {
  CommandSpec spec;
  spec.argv = probe_machine(qemu_binary, accel, "64M");
  spec.argv.insert(spec.argv.end(), {"-drive", "file=" + disk + ",format=raw,if=ide,index=0",
                                     "-device", "isa-debug-exit,iobase=0xf4,iosize=0x04"});
  spec.timeout = timeout;
  // The boot code ends QEMU through isa-debug-exit; a guest that hangs is
  // ended by the deadline. What counts is whether the line came.
  auto r = run_command(spec);
  if (!r) return r.error().message;
  if (r->output.find(want) != std::string::npos) return "";
  std::string why = telling_line(r->output);
  if (why.empty()) why = "it printed nothing in " + std::to_string(timeout.count() / 1000) + " s";
  return why;
}

Result<KernelBoot> probe_kernel_boot(const std::string& qemu_binary, const std::string& accel,
                                     const std::string& kernel, int vcpus,
                                     std::chrono::milliseconds timeout) {
  CommandSpec spec;
  // No disk, no initramfs, no root=: a kernel that runs gets to mounting a
  // root file system, says "VFS: Cannot open root device" and panics;
  // panic=-1 reboots at once and -no-reboot turns that into QEMU's exit.
  spec.argv = probe_machine(qemu_binary, accel, "512M");
  spec.argv.insert(spec.argv.end(), {"-smp", std::to_string(vcpus), "-no-reboot", "-kernel", kernel,
                                     "-append", "console=ttyS0 panic=-1 loglevel=4"});
  spec.timeout = timeout;
  spec.max_output = 64 << 10;
  const auto t0 = std::chrono::steady_clock::now();
  auto r = run_command(spec);
  if (!r) return r.error().with_context("booting " + kernel + " under " + accel);
  KernelBoot b;
  b.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  b.timed_out = r->timed_out;
  b.reached_root_mount = r->output.find("VFS:") != std::string::npos;
  if (!b.reached_root_mount) b.last_line = telling_line(r->output);
  return b;
}

std::string host_kernel() {
  struct utsname u {};
  if (::uname(&u) != 0) return "";
  const std::string k = std::string("/boot/vmlinuz-") + u.release;
  return ::access(k.c_str(), R_OK) == 0 ? k : "";
}

Accelerator choose_accelerator(const AcceleratorProbe& p) {
  if (p.mode == "tcg") return {"tcg", "qemu.accel is tcg"};
  if (p.mode == "kvm") return {"kvm", ""};
  if (auto problem = kvm_device_problem(); !problem.empty()) return {"tcg", problem};

  const std::string disk = p.work_dir + "/kvm-probe.img";
  if (auto st = ensure_dir(p.work_dir, 0700); !st.ok()) return {"tcg", st.error().message};
  // SeaBIOS reads more than the one sector it boots: give it a whole MiB.
  std::string image = probe_boot_sector();
  image.resize(1 << 20, '\0');
  if (auto st = write_file_atomic(disk, image, 0600); !st.ok()) return {"tcg", st.error().message};
  std::string problem =
      boot_sector_problem(p.qemu_binary, "kvm", disk, kProbeBanner, p.sector_timeout);
  std::error_code ec;
  std::filesystem::remove(disk, ec);
  if (!problem.empty())
    return {"tcg", "/dev/kvm opens, but a guest under KVM (-cpu host) did not run: " + problem};

  if (p.kernel.empty()) {
    spdlog::warn(
        "qemu: KVM passed the boot-sector probe only: no kernel to boot under it (the base image "
        "boots from its disk and /boot has no vmlinuz for the running kernel)");
    return {"kvm", ""};
  }
  auto boot = probe_kernel_boot(p.qemu_binary, "kvm", p.kernel, p.vcpus, p.kernel_timeout);
  if (!boot) return {"tcg", boot.error().message};
  if (boot->reached_root_mount) {
    spdlog::info("qemu: a kernel under KVM booted to its root mount in {:.1f} s ({})",
                 boot->seconds, p.kernel);
    return {"kvm", ""};
  }
  std::string said = boot->last_line.empty() ? "nothing" : "\"" + boot->last_line + "\"";
  return {"tcg", "/dev/kvm opens, but a kernel under KVM (" + p.kernel + ") " +
                     (boot->timed_out ? "stopped" : "ended") +
                     " before mounting a root: its last " + "line in " +
                     std::to_string(static_cast<int>(boot->seconds)) + " s was " + said};
}

}  // namespace factory::qemu
