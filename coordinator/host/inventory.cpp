#include "coordinator/host/inventory.hpp"

#include <algorithm>

#include "coordinator/host/host_state.hpp"

namespace factory::host {

const PciFunction* HostInventory::find(const PciAddress& a) const {
  for (const auto& f : functions)
    if (f.address == a) return &f;
  return nullptr;
}

Result<HostInventory> take_inventory(const PciBus& bus, const PciIds* ids) {
  HostInventory inv;
  auto fns = bus.functions();
  if (!fns) return fns.error();
  inv.functions = std::move(*fns);
  for (const auto& f : inv.functions) {
    if (!f.is_nvidia()) continue;
    GpuReport g;
    g.fn = f;
    if (ids) g.name = ids->device_name(f.vendor, f.device);
    if (f.iommu_group)
      for (const auto& m : bus.iommu_group_members(*f.iommu_group))
        if (m != f.address) g.group_members.push_back(m);
    g.override_driver = driverctl_override(bus.root(), f.address);
    g.resource = kubevirt_resource_name(ids, f.device);
    inv.nvidia.push_back(std::move(g));
  }
  return inv;
}

bool driver_leaves_group_viable(const std::string& driver) {
  // vfio's own drivers, and pci-stub, which the kernel's vfio group check
  // allows because it only exists to keep other drivers off a device.
  return driver.empty() || driver == "vfio-pci" || driver == "pci-stub";
}

GroupAnalysis analyze_group(const HostInventory& inv, const PciBus& bus, unsigned group,
                            const std::set<PciAddress>& moving) {
  GroupAnalysis ga;
  ga.group = group;
  for (const auto& addr : bus.iommu_group_members(group)) {
    const PciFunction* f = inv.find(addr);
    if (!f) continue;
    GroupMember m;
    m.fn = *f;
    bool asked = moving.count(addr) > 0;
    bool sibling =
        f->is_nvidia() && std::any_of(moving.begin(), moving.end(),
                                      [&](const PciAddress& c) { return c.same_slot(addr); });
    if (asked || sibling)
      m.role = MemberRole::card;
    else if (f->is_bridge())
      m.role = MemberRole::bridge;
    else if (driver_leaves_group_viable(f->driver))
      m.role = MemberRole::idle;
    else
      m.role = MemberRole::in_use;
    ga.members.push_back(std::move(m));
  }
  return ga;
}

std::vector<PciAddress> GroupAnalysis::to_move() const {
  std::vector<PciAddress> out;
  for (const auto& m : members)
    if (m.role == MemberRole::card) out.push_back(m.fn.address);
  return out;
}

std::vector<const GroupMember*> GroupAnalysis::blockers() const {
  std::vector<const GroupMember*> out;
  for (const auto& m : members)
    if (m.role == MemberRole::in_use) out.push_back(&m);
  return out;
}

std::string GroupAnalysis::blocker_text() const {
  std::string s;
  for (const auto* m : blockers()) {
    if (!s.empty()) s += ", ";
    s += m->fn.address.str() + " (" + m->fn.vendor_id() + ":" + m->fn.device_id() + ", class " +
         m->fn.class_id() + ", driver " + m->fn.driver + ")";
  }
  if (s.empty()) return s;
  return "IOMMU group " + std::to_string(group) + " also holds " + s + ", which the host is using";
}

}  // namespace factory::host
