#include "coordinator/qemu/gpus.hpp"

#include <algorithm>
#include <cstdio>
#include <set>

#include "contract/mig_cards.hpp"
#include "coordinator/host/host_state.hpp"
#include "coordinator/host/inventory.hpp"
#include "coordinator/host/pci.hpp"
#include "coordinator/host/pci_ids.hpp"
#include "coordinator/host/quarantine.hpp"

namespace factory::qemu {

Result<std::vector<HostCard>> host_cards(const host::HostRoot& root) {
  host::PciBus bus(root);
  auto ids = host::find_pci_ids(root, "");
  const host::PciIds* idp = ids && ids->has_value() ? &ids->value() : nullptr;
  auto inv = host::take_inventory(bus, idp);
  if (!inv) return inv.error().with_context("reading the host's PCI devices");
  // A quarantined card is out of the pool whatever its driver: the record
  // comes before the card leaves vfio-pci and goes after it is back.
  auto records = host::read_cards(root);
  if (!records) return records.error().with_context("reading the quarantined cards");
  std::vector<HostCard> out;
  for (const auto& g : inv->nvidia) {
    if (!g.fn.is_display()) continue;  // the card's audio or USB functions stay behind
    HostCard c;
    c.address = g.fn.address.str();
    c.resource = g.resource.name;
    c.name = g.name.value_or("");
    c.driver = g.fn.driver;
    c.vendor = g.fn.vendor;
    c.device = g.fn.device;
    const bool on_vfio = g.fn.driver == "vfio-pci";
    const bool kept = g.override_driver && *g.override_driver == "vfio-pci";
    c.passthrough = on_vfio && kept && g.fn.iommu_group.has_value();
    const host::CardRecord* q = host::find_card(*records, c.address);
    if (q && q->quarantined) {
      c.passthrough = false;
      c.quarantined = true;
      c.why_not = c.address + " is quarantined since " + q->quarantined_at + " (" + q->reason +
                  "): `factory host release --pci " + c.address + "` returns it";
    } else if (!c.passthrough) {
      if (!g.fn.iommu_group)
        c.why_not = c.address + " has no IOMMU group (is the IOMMU on? `factory host check`)";
      else if (!on_vfio)
        c.why_not = c.address + " is on " + (c.driver.empty() ? "no driver" : c.driver) +
                    ": `factory host bind " + c.address + "` puts it on vfio-pci";
      else
        c.why_not = c.address +
                    " is on vfio-pci without driverctl's override (not bound by `factory host "
                    "bind`, so not kept across reboots): run `factory host bind " +
                    c.address + "`";
    }
    out.push_back(std::move(c));
  }
  return out;
}

Result<std::vector<HostCard>> mig_capable(const std::vector<HostCard>& cards,
                                          const std::string& tier) {
  std::vector<HostCard> out;
  std::string others;
  for (const auto& c : cards) {
    if (mig_chip(c.vendor, c.device)) {
      out.push_back(c);
      continue;
    }
    char id[16];
    std::snprintf(id, sizeof id, "%04x:%04x", c.vendor, c.device);
    others += (others.empty() ? "" : ", ") + (c.name.empty() ? c.resource : c.name) + " (" + id +
              ") at " + c.address;
  }
  if (out.empty())
    return Error(Errc::failed_precondition,
                 "tier " + tier + " needs a MIG-capable GPU (A30, A100, H100, H200, B200): " +
                     (others.empty() ? std::string("this host has no NVIDIA GPU")
                                     : "this host has " + others + ", without MIG") +
                     "; put a MIG-capable card on this host or choose a tier without MIG");
  return out;
}

Result<GpuPick> pick_gpus(const std::vector<HostCard>& cards, const std::string& resource,
                          int count, const std::string& tenant,
                          const std::map<std::string, std::string>& held) {
  std::vector<std::string> resources;
  if (!resource.empty()) {
    resources.push_back(resource);
  } else {
    for (const auto& c : cards)
      if (c.passthrough &&
          std::find(resources.begin(), resources.end(), c.resource) == resources.end())
        resources.push_back(c.resource);
  }
  std::vector<std::string> shortfalls;
  for (const auto& r : resources) {
    GpuPick pick;
    pick.resource = r;
    int passthrough = 0;
    std::set<std::string> users;
    int in_use = 0;
    for (const auto& c : cards) {
      if (c.resource != r || !c.passthrough) continue;
      ++passthrough;
      auto h = held.find(c.address);
      if (h != held.end() && h->second != tenant) {
        ++in_use;
        users.insert(h->second + " (" + c.address + ")");
        continue;
      }
      if (static_cast<int>(pick.addresses.size()) < count) pick.addresses.push_back(c.address);
    }
    if (static_cast<int>(pick.addresses.size()) == count) return pick;
    int free = passthrough - in_use;
    std::string line = (free <= 0 ? "no free " + r
                                  : "only " + std::to_string(free) + " free " + r + " (want " +
                                        std::to_string(count) + ")") +
                       " on this host: " + std::to_string(passthrough) + " on vfio-pci";
    if (in_use > 0) {
      std::string who;
      for (const auto& u : users) who += (who.empty() ? "" : ", ") + u;
      line += ", " + std::to_string(in_use) + " in use by " + who;
    }
    shortfalls.push_back(line);
  }
  std::string msg;
  if (resources.empty())
    msg = "no GPU on this host is on vfio-pci for tenants (want " + std::to_string(count) + ")";
  for (const auto& s : shortfalls) msg += (msg.empty() ? "" : "; ") + s;
  std::vector<std::string> hints;
  for (const auto& c : cards)
    if (!c.passthrough && (resource.empty() || c.resource == resource)) hints.push_back(c.why_not);
  if (cards.empty()) hints.push_back("the host has no NVIDIA GPU (`factory host check`)");
  for (const auto& h : hints) msg += "; " + h;
  return Error(Errc::failed_precondition, msg);
}

}  // namespace factory::qemu
