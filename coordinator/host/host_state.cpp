#include "coordinator/host/host_state.hpp"

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "common/atomic_file.hpp"
#include "coordinator/host/sysfs.hpp"

namespace factory::host {
namespace fs = std::filesystem;

const std::vector<std::string>& vfio_module_names() {
  static const std::vector<std::string> names = {"vfio", "vfio_iommu_type1", "vfio_pci"};
  return names;
}

std::string kernel_release(const HostRoot& root) {
  auto r = read_attr(root, "/proc/sys/kernel/osrelease");
  return r ? *r : std::string();
}

namespace {

// Module names use "_" but files may use "-" (vfio-pci.ko): compare normalised.
std::string norm_module(std::string s) {
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}

// "kernel/drivers/vfio/pci/vfio-pci.ko.zst: ..." -> "vfio_pci"
std::string module_from_path(std::string_view line) {
  size_t colon = line.find(':');
  std::string_view path = line.substr(0, colon);
  size_t slash = path.rfind('/');
  std::string_view base = slash == std::string_view::npos ? path : path.substr(slash + 1);
  size_t ko = base.find(".ko");
  if (ko == std::string_view::npos) return "";
  return norm_module(std::string(base.substr(0, ko)));
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string l;
  while (std::getline(in, l)) out.push_back(l);
  return out;
}

// systemd-modules-load reads these directories (and Debian's /etc/modules).
std::vector<std::string> modules_load_files(const HostRoot& root) {
  std::vector<std::string> files;
  for (const char* dir : {"/etc/modules-load.d", "/run/modules-load.d", "/usr/lib/modules-load.d",
                          "/lib/modules-load.d"}) {
    std::error_code ec;
    fs::directory_iterator it(root(dir), ec);
    if (ec) continue;
    std::vector<std::string> here;
    for (const auto& e : it)
      if (e.path().extension() == ".conf")
        here.push_back(std::string(dir) + "/" + e.path().filename().string());
    std::sort(here.begin(), here.end());
    files.insert(files.end(), here.begin(), here.end());
  }
  std::error_code ec;
  if (fs::is_regular_file(root("/etc/modules"), ec)) files.push_back("/etc/modules");
  return files;
}

}  // namespace

std::vector<ModuleState> probe_vfio_modules(const HostRoot& root) {
  std::vector<ModuleState> out;
  const std::string rel = kernel_release(root);
  std::vector<std::string> on_disk, builtin;
  bool can_tell = false;
  if (!rel.empty()) {
    for (const char* f : {"modules.dep", "modules.builtin"}) {
      auto text = read_file(root("/lib/modules/" + rel + "/" + f));
      if (!text) continue;
      can_tell = true;
      for (const auto& l : lines_of(*text)) {
        std::string m = module_from_path(l);
        if (m.empty()) continue;
        on_disk.push_back(m);
        if (std::string_view(f) == "modules.builtin") builtin.push_back(m);
      }
    }
  }
  // Which modules-load.d file lists which module.
  std::vector<std::pair<std::string, std::string>> at_boot;  // module, file
  for (const auto& f : modules_load_files(root)) {
    auto text = read_file(root(f));
    if (!text) continue;
    for (auto l : lines_of(*text)) {
      size_t c = l.find_first_of("#;");
      if (c != std::string::npos) l.erase(c);
      std::istringstream words(l);
      std::string w;
      if (words >> w) at_boot.emplace_back(norm_module(w), f);
    }
  }
  for (const auto& name : vfio_module_names()) {
    ModuleState m;
    m.name = name;
    std::error_code ec;
    m.builtin = std::find(builtin.begin(), builtin.end(), name) != builtin.end();
    m.loaded = m.builtin || fs::is_directory(root("/sys/module/" + name), ec);
    if (can_tell)
      m.available = m.loaded || std::find(on_disk.begin(), on_disk.end(), name) != on_disk.end();
    else if (m.loaded)
      m.available = true;
    for (const auto& [mod, file] : at_boot)
      if (mod == name) {
        m.boot_file = file;
        break;
      }
    out.push_back(std::move(m));
  }
  return out;
}

std::vector<ProcessInfo> find_processes(const HostRoot& root, std::string_view comm_prefix) {
  std::vector<ProcessInfo> out;
  std::error_code ec;
  fs::directory_iterator it(root("/proc"), ec);
  if (ec) return out;
  for (const auto& e : it) {
    const std::string name = e.path().filename().string();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    auto comm = read_attr(root, "/proc/" + name + "/comm");
    if (!comm || comm->rfind(comm_prefix, 0) != 0) continue;
    out.push_back({std::stoi(name), *comm});
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.pid < b.pid; });
  return out;
}

std::optional<ProcessInfo> persistenced_process(const HostRoot& root) {
  auto ps = find_processes(root, "nvidia-persiste");
  if (ps.empty()) return std::nullopt;
  return ps.front();
}

std::string driverctl_override_path(const PciAddress& addr) {
  return "/etc/driverctl.d/pci-" + addr.str();
}

std::optional<std::string> driverctl_override(const HostRoot& root, const PciAddress& addr) {
  auto r = read_attr(root, driverctl_override_path(addr));
  if (!r || r->empty()) return std::nullopt;
  return *r;
}

std::optional<unsigned> nvidia_device_minor(const HostRoot& root, const PciAddress& addr) {
  auto text = read_file(root("/proc/driver/nvidia/gpus/" + addr.str() + "/information"));
  if (!text) return std::nullopt;
  for (const auto& l : lines_of(*text)) {
    if (l.rfind("Device Minor:", 0) != 0) continue;
    std::istringstream in(l.substr(13));
    unsigned minor;
    if (in >> minor) return minor;
  }
  return std::nullopt;
}

std::vector<ProcessInfo> nvidia_device_holders(const HostRoot& root, unsigned minor) {
  std::vector<ProcessInfo> out;
  const std::string node = "/dev/nvidia" + std::to_string(minor);
  std::error_code ec;
  fs::directory_iterator it(root("/proc"), ec);
  if (ec) return out;
  for (const auto& e : it) {
    const std::string name = e.path().filename().string();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    std::error_code ec2;
    fs::directory_iterator fds(e.path() / "fd", ec2);
    if (ec2) continue;
    for (const auto& fd : fds) {
      std::error_code ec3;
      if (fs::read_symlink(fd.path(), ec3).string() == node && !ec3) {
        auto comm = read_attr(root, "/proc/" + name + "/comm");
        out.push_back({std::stoi(name), comm ? *comm : std::string("?")});
        break;
      }
    }
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.pid < b.pid; });
  return out;
}

CpuVirtualization probe_cpu_virtualization(const HostRoot& root) {
  CpuVirtualization v;
  auto text = read_file(root("/proc/cpuinfo"));
  if (!text) return v;
  v.readable = true;
  for (const auto& l : lines_of(*text)) {
    if (v.vendor.empty() && l.rfind("vendor_id", 0) == 0) {
      size_t c = l.find(':');
      if (c != std::string::npos) {
        std::istringstream in(l.substr(c + 1));
        in >> v.vendor;
      }
    }
    if (v.flag.empty() && l.rfind("flags", 0) == 0) {
      size_t c = l.find(':');
      std::istringstream in(c == std::string::npos ? std::string() : l.substr(c + 1));
      std::string f;
      while (in >> f)
        if (f == "svm" || f == "vmx") {
          v.flag = f;
          break;
        }
    }
    if (!v.flag.empty() && !v.vendor.empty()) break;
  }
  return v;
}

std::vector<std::string> iommu_units(const HostRoot& root) {
  std::vector<std::string> out;
  std::error_code ec;
  fs::directory_iterator it(root("/sys/class/iommu"), ec);
  if (ec) return out;
  for (const auto& e : it) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace factory::host
