#include "coordinator/qemu/launch.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/atomic_file.hpp"

namespace factory::qemu {

namespace fs = std::filesystem;

namespace {

Error invalid(std::string m) {
  return Error(Errc::invalid_argument, std::move(m));
}

// The value of a Kubernetes quantity: a decimal number, then a binary (Ki..Ei)
// or decimal (n u m k M G T P E) suffix or a decimal exponent.
Result<long double> quantity_value(std::string_view q) {
  std::string s(q);
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return invalid("'" + s + "' is not a quantity (e.g. 8, 500m, 16Gi)");
  long double v = 0;
  try {
    v = std::stold(s.substr(0, i));
  } catch (...) {
    return invalid("'" + s + "' is not a quantity (e.g. 8, 500m, 16Gi)");
  }
  std::string suf = s.substr(i);
  static const std::pair<const char*, long double> kSuffixes[] = {{"", 1},
                                                                  {"Ki", 1024.0L},
                                                                  {"Mi", 1048576.0L},
                                                                  {"Gi", 1073741824.0L},
                                                                  {"Ti", 1099511627776.0L},
                                                                  {"Pi", 1125899906842624.0L},
                                                                  {"Ei", 1152921504606846976.0L},
                                                                  {"n", 1e-9L},
                                                                  {"u", 1e-6L},
                                                                  {"m", 1e-3L},
                                                                  {"k", 1e3L},
                                                                  {"M", 1e6L},
                                                                  {"G", 1e9L},
                                                                  {"T", 1e12L},
                                                                  {"P", 1e15L},
                                                                  {"E", 1e18L}};
  for (auto [name, mult] : kSuffixes)
    if (suf == name) return v * mult;
  if (suf.size() > 1 && (suf[0] == 'e' || suf[0] == 'E')) {
    try {
      size_t used = 0;
      int exp = std::stoi(suf.substr(1), &used);
      if (used == suf.size() - 1) return v * std::pow(10.0L, exp);
    } catch (...) {
    }
  }
  return invalid("'" + s + "' has an unknown suffix '" + suf + "' (e.g. 8, 500m, 16Gi)");
}

std::string str_field(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : "";
}

}  // namespace

Result<int> vcpus_from_quantity(std::string_view cpu) {
  auto v = quantity_value(cpu);
  if (!v) return v.error().with_context("cpu");
  long double n = std::ceil(*v - 1e-9L);
  if (n < 1) n = 1;
  // QEMU's q35 takes at most 288 vCPUs; anything near it is a typo here.
  if (n > 256) return invalid("cpu " + std::string(cpu) + ": more than 256 vCPUs");
  return static_cast<int>(n);
}

Result<std::uint64_t> bytes_from_quantity(std::string_view size) {
  auto v = quantity_value(size);
  if (!v) return v.error();
  if (*v < 1 || *v > 1.0e18L) return invalid("size " + std::string(size) + " is out of range");
  return static_cast<std::uint64_t>(std::ceil(*v));
}

Result<std::string> disk_format(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error(Errc::not_found, "cannot read the disk image " + path);
  char magic[4] = {0, 0, 0, 0};
  in.read(magic, 4);
  if (in.gcount() == 4 && magic[0] == 'Q' && magic[1] == 'F' && magic[2] == 'I' &&
      static_cast<unsigned char>(magic[3]) == 0xfb)
    return std::string("qcow2");
  return std::string("raw");
}

Result<BaseImage> load_base_image(const std::string& path) {
  if (path.empty())
    return Error(Errc::failed_precondition,
                 "qemu.base_image is not set: build one with deploy/qemu/build-image.sh and set "
                 "qemu.base_image to the folder it prints (or to a cloud image file)");
  std::error_code ec;
  BaseImage img;
  img.source = path;
  fs::path p = fs::absolute(path, ec);
  if (fs::is_directory(p, ec)) {
    auto text = read_file(p / "image.json");
    if (!text)
      return Error(Errc::failed_precondition,
                   "qemu.base_image " + path +
                       " is a folder without image.json: point it at the folder "
                       "deploy/qemu/build-image.sh printed, or at a disk image file");
    auto j = nlohmann::json::parse(*text, nullptr, false);
    if (!j.is_object() || str_field(j, "disk").empty())
      return Error(Errc::invalid_argument,
                   (p / "image.json").string() + ": want {\"disk\": FILE, ...}");
    img.disk = (p / str_field(j, "disk")).string();
    if (!str_field(j, "kernel").empty()) img.kernel = (p / str_field(j, "kernel")).string();
    if (!str_field(j, "initrd").empty()) img.initrd = (p / str_field(j, "initrd")).string();
    img.append = str_field(j, "append");
    for (const auto* f : {&img.disk, &img.kernel, &img.initrd})
      if (!f->empty() && !fs::is_regular_file(*f, ec))
        return Error(Errc::failed_precondition,
                     "qemu.base_image " + path + ": " + *f + " (named in image.json) is missing");
  } else if (fs::is_regular_file(p, ec)) {
    img.disk = p.string();
  } else {
    return Error(Errc::failed_precondition,
                 "qemu.base_image " + path +
                     " does not exist: build it with deploy/qemu/build-image.sh, or fix the path");
  }
  auto fmt = disk_format(img.disk);
  if (!fmt) return fmt.error();
  img.format = *fmt;
  return img;
}

std::string vm_unit_name(const std::string& tenant) {
  return "factory-vm-" + tenant;
}

std::vector<std::string> qemu_argv(const std::string& binary, const Launch& l) {
  const std::string name = vm_unit_name(l.tenant);
  std::vector<std::string> a = {binary, "-name", "guest=" + name + ",process=" + name, "-machine",
                                "q35", "-accel", l.accel, "-smp", std::to_string(l.vcpus), "-m",
                                std::to_string(l.memory_mib) + "M",
                                // Only the devices named here: no default NIC, VGA or
                                // monitor on stdio.
                                "-nodefaults", "-no-user-config", "-display", "none"};
  // The host's CPU under KVM (a GPU driver wants its real features); QEMU's
  // default model under TCG, which emulates it.
  if (l.accel == "kvm") a.insert(a.end(), {"-cpu", "host"});
  a.insert(
      a.end(),
      {"-chardev", "file,id=console,path=" + l.console_log() + ",append=on", "-serial",
       "chardev:console", "-drive", "file=" + l.disk() + ",if=virtio,format=qcow2,discard=unmap",
       "-drive", "file=" + l.seed() + ",if=virtio,format=raw,media=cdrom,readonly=on",
       // Entropy from the host: a fresh guest generating SSH host keys
       // would otherwise wait for its own on an emulated CPU.
       "-device", "virtio-rng-pci", "-netdev",
       "user,id=net0,hostfwd=tcp:" + l.ssh_listen + ":" + std::to_string(l.ssh_port) + "-:22",
       "-device", "virtio-net-pci,netdev=net0"});
  if (l.image.direct_kernel()) {
    a.insert(a.end(), {"-kernel", l.image.kernel});
    if (!l.image.initrd.empty()) a.insert(a.end(), {"-initrd", l.image.initrd});
    if (!l.image.append.empty()) a.insert(a.end(), {"-append", l.image.append});
  }
  for (size_t i = 0; i < l.gpus.size(); ++i) {
    const std::string port = "gpuport" + std::to_string(i);
    a.insert(a.end(), {"-device",
                       "pcie-root-port,id=" + port + ",bus=pcie.0,chassis=" + std::to_string(i + 1),
                       "-device", "vfio-pci,host=" + l.gpus[i] + ",bus=" + port});
  }
  a.insert(a.end(), {"-qmp", "unix:qmp.sock,server=on,wait=off", "-pidfile", l.pidfile()});
  return a;
}

std::vector<std::string> systemd_run_argv(const std::string& systemd_run,
                                          const std::vector<std::string>& qemu, const Launch& l) {
  std::vector<std::string> a = {
      systemd_run, "--unit=" + vm_unit_name(l.tenant),
      "--description=Factory tenant VM " + l.tenant, "--working-directory=" + l.dir,
      "--property=Restart=always", "--property=RestartSec=2s",
      // QEMU flushes its disks on SIGTERM; give it time.
      "--property=TimeoutStopSec=30s", "--property=StandardOutput=append:" + l.process_log(),
      "--property=StandardError=append:" + l.process_log(), "--collect", "--quiet", "--"};
  a.insert(a.end(), qemu.begin(), qemu.end());
  return a;
}

}  // namespace factory::qemu
