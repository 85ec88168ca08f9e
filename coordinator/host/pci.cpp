#include "coordinator/host/pci.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "coordinator/host/sysfs.hpp"

namespace factory::host {
namespace fs = std::filesystem;

namespace {

bool parse_hex(std::string_view s, size_t min_digits, size_t max_digits, uint32_t max_value,
               uint32_t& out) {
  if (s.size() < min_digits || s.size() > max_digits) return false;
  uint32_t v = 0;
  for (char c : s) {
    int d = (c >= '0' && c <= '9')   ? c - '0'
            : (c >= 'a' && c <= 'f') ? c - 'a' + 10
            : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                     : -1;
    if (d < 0) return false;
    v = v * 16 + static_cast<uint32_t>(d);
  }
  if (v > max_value) return false;
  out = v;
  return true;
}

Error malformed(std::string_view text, const std::string& why) {
  return Error(Errc::invalid_argument,
               "malformed PCI address \"" + std::string(text) + "\": " + why +
                   "; expected DOMAIN:BUS:DEVICE.FUNCTION like 0000:01:00.0 (see lspci -D)");
}

}  // namespace

Result<PciAddress> PciAddress::parse(std::string_view text) {
  if (text.empty()) return malformed(text, "empty");
  std::string_view rest = text;
  PciAddress a;
  // Split off ".F".
  size_t dot = rest.rfind('.');
  if (dot == std::string_view::npos) return malformed(text, "no \".FUNCTION\"");
  uint32_t v = 0;
  if (!parse_hex(rest.substr(dot + 1), 1, 1, 7, v))
    return malformed(text, "the function must be 0-7");
  a.function = static_cast<uint8_t>(v);
  rest = rest.substr(0, dot);
  // "DOMAIN:BUS:DEVICE" or "BUS:DEVICE".
  std::vector<std::string_view> parts;
  size_t start = 0;
  for (;;) {
    size_t colon = rest.find(':', start);
    parts.push_back(rest.substr(start, colon == std::string_view::npos ? colon : colon - start));
    if (colon == std::string_view::npos) break;
    start = colon + 1;
  }
  if (parts.size() != 2 && parts.size() != 3) return malformed(text, "wrong number of fields");
  size_t i = 0;
  if (parts.size() == 3) {
    // The kernel prints the domain with %04x; VMD domains go past 0xffff.
    if (!parse_hex(parts[0], 4, 8, 0xffffffffu, v))
      return malformed(text, "the domain must be 4 or more hex digits");
    a.domain = v;
    i = 1;
  }
  if (!parse_hex(parts[i], 2, 2, 0xff, v)) return malformed(text, "the bus must be 2 hex digits");
  a.bus = static_cast<uint8_t>(v);
  if (!parse_hex(parts[i + 1], 2, 2, 0x1f, v))
    return malformed(text, "the device must be 2 hex digits, 00-1f");
  a.device = static_cast<uint8_t>(v);
  return a;
}

std::string PciAddress::str() const {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.%x", domain, bus, device, function);
  return buf;
}

std::string PciAddress::slot() const {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%04x:%02x:%02x", domain, bus, device);
  return buf;
}

std::string hex4(uint16_t v) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04x", v);
  return buf;
}

std::string PciFunction::vendor_id() const {
  return hex4(vendor);
}
std::string PciFunction::device_id() const {
  return hex4(device);
}
std::string PciFunction::subsystem_id() const {
  return hex4(subsystem_vendor) + ":" + hex4(subsystem_device);
}
std::string PciFunction::class_id() const {
  return hex4(static_cast<uint16_t>(class_code >> 8));
}

Result<PciFunction> PciBus::function(const PciAddress& addr) const {
  PciFunction f;
  f.address = addr;
  const std::string dir = f.sysfs_dir();
  std::error_code ec;
  if (!fs::exists(root_(dir), ec))
    return Error(Errc::not_found, "no PCI function " + addr.str() + " on this host (nothing at " +
                                      dir + "); list them with lspci -D or factory host check");
  auto vendor = read_hex_attr(root_, dir + "/vendor");
  if (!vendor) return vendor.error();
  auto device = read_hex_attr(root_, dir + "/device");
  if (!device) return device.error();
  auto cls = read_hex_attr(root_, dir + "/class");
  if (!cls) return cls.error();
  f.vendor = static_cast<uint16_t>(*vendor);
  f.device = static_cast<uint16_t>(*device);
  f.class_code = static_cast<uint32_t>(*cls);
  // Subsystem IDs are absent on some bridges; they are informational.
  if (auto sv = read_hex_attr(root_, dir + "/subsystem_vendor"))
    f.subsystem_vendor = static_cast<uint16_t>(*sv);
  if (auto sd = read_hex_attr(root_, dir + "/subsystem_device"))
    f.subsystem_device = static_cast<uint16_t>(*sd);
  f.driver = read_link_name(root_, dir + "/driver").value_or("");
  if (auto g = read_link_name(root_, dir + "/iommu_group")) {
    try {
      f.iommu_group = static_cast<unsigned>(std::stoul(*g));
    } catch (const std::exception&) {
      return Error(Errc::protocol,
                   dir + "/iommu_group points at \"" + *g + "\", which is not a group number");
    }
  }
  if (auto ov = read_attr(root_, dir + "/driver_override")) {
    if (*ov != "(null)") f.driver_override = *ov;
  }
  return f;
}

Result<std::vector<PciFunction>> PciBus::functions() const {
  std::vector<PciAddress> addrs;
  std::error_code ec;
  fs::directory_iterator it(root_("/sys/bus/pci/devices"), ec);
  if (ec)
    return Error(Errc::not_found,
                 "cannot list /sys/bus/pci/devices: " + ec.message() + " (is sysfs mounted?)");
  for (const auto& e : it) {
    auto a = PciAddress::parse(e.path().filename().string());
    if (a) addrs.push_back(*a);
  }
  std::sort(addrs.begin(), addrs.end());
  std::vector<PciFunction> out;
  for (const auto& a : addrs) {
    auto f = function(a);
    if (!f) return f.error();
    out.push_back(std::move(*f));
  }
  return out;
}

std::vector<PciAddress> PciBus::iommu_group_members(unsigned group) const {
  std::vector<PciAddress> out;
  std::error_code ec;
  fs::directory_iterator it(root_("/sys/kernel/iommu_groups/" + std::to_string(group) + "/devices"),
                            ec);
  if (ec) return out;
  for (const auto& e : it) {
    auto a = PciAddress::parse(e.path().filename().string());
    if (a) out.push_back(*a);
  }
  std::sort(out.begin(), out.end());
  return out;
}

size_t PciBus::iommu_group_count() const {
  std::error_code ec;
  fs::directory_iterator it(root_("/sys/kernel/iommu_groups"), ec);
  if (ec) return 0;
  size_t n = 0;
  for (const auto& e : it) {
    (void)e;
    ++n;
  }
  return n;
}

bool PciBus::iommu_groups_present() const {
  return iommu_group_count() > 0;
}

}  // namespace factory::host
