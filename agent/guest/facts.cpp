#include "agent/guest/facts.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "common/atomic_file.hpp"
#include "common/subprocess.hpp"

namespace factory::agent {
namespace fs = std::filesystem;

namespace {

std::uint32_t read_hex(const fs::path& p) {
  std::ifstream in(p);
  std::string s;
  if (!(in >> s)) return 0;
  try {
    return static_cast<std::uint32_t>(std::stoul(s, nullptr, 16));
  } catch (...) {
    return 0;
  }
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  size_t i = 0;
  while (i < s.size() && s[i] == ' ') ++i;
  return s.substr(i);
}

}  // namespace

std::string PciFunction::id() const {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%04x:%04x", vendor, device);
  return buf;
}

nlohmann::json PciFunction::to_json() const {
  char cls[16];
  std::snprintf(cls, sizeof cls, "0x%06x", class_code);
  char sub[16];
  std::snprintf(sub, sizeof sub, "%04x:%04x", subsystem_vendor, subsystem_device);
  return {
      {"address", address}, {"id", id()}, {"class", cls}, {"subsystem", sub}, {"driver", driver}};
}

std::vector<PciFunction> scan_pci_bus(const GuestEnv& env) {
  std::vector<PciFunction> out;
  std::error_code ec;
  fs::path dir = env.path("/sys/bus/pci/devices");
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path p = it->path();
    PciFunction f;
    f.address = p.filename().string();
    f.vendor = read_hex(p / "vendor");
    f.device = read_hex(p / "device");
    f.class_code = read_hex(p / "class");
    f.subsystem_vendor = read_hex(p / "subsystem_vendor");
    f.subsystem_device = read_hex(p / "subsystem_device");
    std::error_code lec;
    fs::path target = fs::read_symlink(p / "driver", lec);
    if (!lec) f.driver = target.filename().string();
    out.push_back(std::move(f));
  }
  std::sort(out.begin(), out.end(),
            [](const PciFunction& a, const PciFunction& b) { return a.address < b.address; });
  return out;
}

std::vector<PciFunction> nvidia_gpus(const GuestEnv& env) {
  auto all = scan_pci_bus(env);
  std::vector<PciFunction> gpus;
  for (auto& f : all)
    if (f.is_nvidia_gpu()) gpus.push_back(std::move(f));
  return gpus;
}

bool kernel_module_loaded(const GuestEnv& env, const std::string& name) {
  std::error_code ec;
  if (fs::is_directory(env.path("/sys/module/" + name), ec)) return true;
  auto modules = read_file(env.path("/proc/modules"));
  if (!modules) return false;
  std::istringstream in(*modules);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, name.size() + 1, name + " ") == 0) return true;
  }
  return false;
}

std::string kernel_log(const GuestEnv& env, size_t max_bytes) {
  std::string log;
  auto kern = read_file(env.path("/var/log/kern.log"));
  if (kern) {
    log = kern->size() > max_bytes ? kern->substr(kern->size() - max_bytes) : *kern;
  }
  if (!which("dmesg").empty()) {
    CommandSpec spec;
    spec.argv = {"dmesg"};
    spec.timeout = std::chrono::seconds(10);
    spec.max_output = max_bytes;
    auto r = run_command(spec);
    if (r && r->ok()) {
      if (!log.empty() && log.back() != '\n') log += '\n';
      log += r->output;
    }
  }
  return log;
}

std::string boot_id(const GuestEnv& env) {
  auto id = read_file(env.path("/proc/sys/kernel/random/boot_id"));
  return id ? trim(*id) : std::string();
}

PackageState parse_dpkg_status(const std::string& out) {
  PackageState st;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Status:", 0) == 0)
      st.status = trim(line.substr(7));
    else if (line.rfind("Version:", 0) == 0)
      st.version = trim(line.substr(8));
  }
  // dpkg's Status is "<selection> <flag> <state>": a held package is
  // "hold ok installed", installed all the same.
  st.installed = st.status == "install ok installed" || st.status == "hold ok installed";
  st.held = st.status.rfind("hold ", 0) == 0;
  return st;
}

PackageState dpkg_package(const std::string& name) {
  CommandSpec spec;
  spec.argv = {"dpkg", "-s", name};
  spec.timeout = std::chrono::seconds(30);
  auto r = run_command(spec);
  if (!r || !r->ok()) return {};
  return parse_dpkg_status(r->output);
}

std::string find_line(const std::string& text, const std::string& needle) {
  size_t at = text.find(needle);
  if (at == std::string::npos) return "";
  size_t begin = text.rfind('\n', at);
  begin = begin == std::string::npos ? 0 : begin + 1;
  size_t end = text.find('\n', at);
  return text.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

std::string last_lines(const std::string& text, size_t n) {
  CommandResult r;
  r.output = text;
  return r.tail(n);
}

}  // namespace factory::agent
