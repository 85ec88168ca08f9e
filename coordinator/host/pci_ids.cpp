#include "coordinator/host/pci_ids.hpp"

#include <sstream>

#include "common/atomic_file.hpp"

namespace factory::host {
namespace fs = std::filesystem;

namespace {

int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Four hex digits at s[pos..pos+4).
bool hex4_at(const std::string& s, size_t pos, uint16_t& out) {
  if (s.size() < pos + 4) return false;
  uint16_t v = 0;
  for (size_t i = pos; i < pos + 4; ++i) {
    int d = hexval(s[i]);
    if (d < 0) return false;
    v = static_cast<uint16_t>(v * 16 + d);
  }
  out = v;
  return true;
}

std::string trimmed(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t' || s[b] == '\r')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t' || s[e - 1] == '\r')) --e;
  return std::string(s.substr(b, e - b));
}

uint64_t sub_key(uint16_t v, uint16_t d, uint16_t sv, uint16_t sd) {
  return (uint64_t{v} << 48) | (uint64_t{d} << 32) | (uint64_t{sv} << 16) | sd;
}

}  // namespace

PciIds PciIds::parse(const std::string& text, std::string shown_path) {
  PciIds ids;
  ids.path_ = std::move(shown_path);
  std::istringstream in(text);
  std::string line;
  bool have_vendor = false, have_device = false;
  uint16_t vendor = 0, device = 0;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    if (line[0] == '#') {
      const std::string tag = "Version:";
      size_t p = line.find(tag);
      if (ids.version_.empty() && p != std::string::npos)
        ids.version_ = trimmed(line.substr(p + tag.size()));
      continue;
    }
    if (line.rfind("C ", 0) == 0) break;  // the device-class list: no more vendors
    if (line[0] != '\t') {
      have_vendor = hex4_at(line, 0, vendor);
      have_device = false;
      if (have_vendor) ids.vendors_[vendor] = trimmed(std::string_view(line).substr(4));
      continue;
    }
    if (!have_vendor) continue;
    if (line.size() > 1 && line[1] == '\t') {
      uint16_t sv = 0, sd = 0;
      if (have_device && hex4_at(line, 2, sv) && line.size() > 7 && hex4_at(line, 7, sd))
        ids.subsystems_[sub_key(vendor, device, sv, sd)] =
            trimmed(std::string_view(line).substr(11));
      continue;
    }
    have_device = hex4_at(line, 1, device);
    if (have_device)
      ids.devices_[(uint32_t{vendor} << 16) | device] = trimmed(std::string_view(line).substr(5));
  }
  return ids;
}

Result<PciIds> PciIds::load(const fs::path& file, std::string shown_path) {
  auto text = read_file(file);
  if (!text) {
    Error e = text.error();
    e.message = "cannot read the PCI ID list " + shown_path + ": " +
                e.message.substr(e.message.rfind(": ") + 2);
    return e;
  }
  PciIds ids = parse(*text, std::move(shown_path));
  if (ids.vendors_.empty())
    return Error(
        Errc::invalid_argument,
        ids.path_ + " is not a pci.ids file (no vendor lines like \"10de  NVIDIA Corporation\")");
  return ids;
}

std::optional<std::string> PciIds::vendor_name(uint16_t vendor) const {
  auto it = vendors_.find(vendor);
  if (it == vendors_.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> PciIds::device_name(uint16_t vendor, uint16_t device) const {
  auto it = devices_.find((uint32_t{vendor} << 16) | device);
  if (it == devices_.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> PciIds::subsystem_name(uint16_t vendor, uint16_t device,
                                                  uint16_t sub_vendor, uint16_t sub_device) const {
  auto it = subsystems_.find(sub_key(vendor, device, sub_vendor, sub_device));
  if (it == subsystems_.end()) return std::nullopt;
  return it->second;
}

std::string PciIds::describe() const {
  return version_.empty() ? path_ : path_ + " (version " + version_ + ")";
}

const std::vector<std::string>& pci_ids_search_path() {
  static const std::vector<std::string> paths = {"/usr/share/misc/pci.ids",
                                                 "/usr/share/hwdata/pci.ids", "/usr/share/pci.ids"};
  return paths;
}

Result<std::optional<PciIds>> find_pci_ids(const HostRoot& root, const std::string& override_file) {
  if (!override_file.empty()) {
    // --pci-ids is a path on the machine running factory, not under --host-root:
    // it names a file the admin has in hand (e.g. a newer list).
    std::error_code ec;
    if (!fs::exists(override_file, ec))
      return Error(Errc::invalid_argument, "--pci-ids " + override_file +
                                               ": no such file; give the path of a pci.ids "
                                               "file (e.g. from https://pci-ids.ucw.cz)");
    auto ids = PciIds::load(override_file, override_file);
    if (!ids) return ids.error();
    return std::optional<PciIds>(std::move(*ids));
  }
  for (const auto& p : pci_ids_search_path()) {
    std::error_code ec;
    if (!fs::exists(root(p), ec)) continue;
    auto ids = PciIds::load(root(p), p);
    if (!ids) return ids.error();
    return std::optional<PciIds>(std::move(*ids));
  }
  return std::optional<PciIds>();
}

}  // namespace factory::host
