#include "coordinator/qemu/accel.hpp"

#include <fcntl.h>
#include <linux/kvm.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/atomic_file.hpp"
#include "common/subprocess.hpp"

namespace factory::qemu {

std::string probe_boot_sector() {
  // xor ax,ax; mov ds,ax; cld; mov dx,0x3f8; mov si,msg
  // loop: lodsb; test al,al; jz done; out dx,al; jmp loop
  // done: mov al,0x10; out 0xf4,al (isa-debug-exit: QEMU ends, status 33)
  // halt: cli; hlt; jmp halt;  msg: kProbeBanner, CR, LF, 0
  const unsigned char code[] = {0x31, 0xC0, 0x8E, 0xD8, 0xFC, 0xBA, 0xF8, 0x03, 0xBE,
                                0x1B, 0x7C, 0xAC, 0x84, 0xC0, 0x74, 0x03, 0xEE, 0xEB,
                                0xF8, 0xB0, 0x10, 0xE6, 0xF4, 0xFA, 0xF4, 0xEB, 0xFC};
  std::string s(reinterpret_cast<const char*>(code), sizeof code);
  s += kProbeBanner;
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

}  // namespace

Accelerator choose_accelerator(const std::string& mode, const std::string& qemu_binary,
                               const std::string& work_dir, std::chrono::milliseconds timeout) {
  if (mode == "tcg") return {"tcg", "qemu.accel is tcg"};
  if (mode == "kvm") return {"kvm", ""};
  if (auto problem = kvm_device_problem(); !problem.empty()) return {"tcg", problem};

  const std::string disk = work_dir + "/kvm-probe.img";
  if (auto st = ensure_dir(work_dir, 0700); !st.ok()) return {"tcg", st.error().message};
  // SeaBIOS reads more than the one sector it boots: give it a whole MiB.
  std::string image = probe_boot_sector();
  image.resize(1 << 20, '\0');
  if (auto st = write_file_atomic(disk, image, 0600); !st.ok()) return {"tcg", st.error().message};
  CommandSpec spec;
  spec.argv = {qemu_binary,
               "-machine",
               "q35",
               "-accel",
               "kvm",
               "-cpu",
               "host",
               "-m",
               "64M",
               "-nodefaults",
               "-no-user-config",
               "-display",
               "none",
               "-serial",
               "stdio",
               "-drive",
               "file=" + disk + ",format=raw,if=ide,index=0",
               "-device",
               "isa-debug-exit,iobase=0xf4,iosize=0x04"};
  spec.timeout = timeout;
  bool ok = false;
  spec.on_line = [&](const std::string& line) {
    if (line.find(kProbeBanner) != std::string::npos) ok = true;
  };
  // The boot code ends QEMU through isa-debug-exit; a guest that hangs is
  // ended by the deadline. What counts is whether the line came.
  auto r = run_command(spec);
  std::error_code ec;
  std::filesystem::remove(disk, ec);
  if (!r) return {"tcg", r.error().message};
  if (ok || r->output.find(kProbeBanner) != std::string::npos) return {"kvm", ""};
  std::string why = telling_line(r->output);
  if (why.empty()) why = "it printed nothing in " + std::to_string(timeout.count() / 1000) + " s";
  return {"tcg", "/dev/kvm opens, but a guest under KVM (-cpu host) did not run: " + why};
}

}  // namespace factory::qemu
