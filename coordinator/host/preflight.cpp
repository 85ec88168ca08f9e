#include "coordinator/host/preflight.hpp"

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "common/subprocess.hpp"
#include "coordinator/host/host_state.hpp"
#include "coordinator/host/sysfs.hpp"

namespace factory::host {
namespace fs = std::filesystem;

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::ok:
      return "ok";
    case Verdict::warn:
      return "warn";
    case Verdict::fail:
      return "fail";
  }
  return "fail";
}

bool HostReport::passthrough_possible() const {
  return std::none_of(checks.begin(), checks.end(),
                      [](const Check& c) { return c.verdict == Verdict::fail; });
}

namespace {

Check ok(std::string name, std::string detail) {
  return {std::move(name), Verdict::ok, std::move(detail), ""};
}
Check warn(std::string name, std::string detail, std::string fix) {
  return {std::move(name), Verdict::warn, std::move(detail), std::move(fix)};
}
Check fail(std::string name, std::string detail, std::string fix) {
  return {std::move(name), Verdict::fail, std::move(detail), std::move(fix)};
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

bool is_amd(const CpuVirtualization& cpu) {
  return cpu.flag == "svm" || cpu.vendor == "AuthenticAMD";
}

Check cpu_check(const CpuVirtualization& cpu) {
  if (!cpu.readable)
    return warn("cpu-virtualization",
                "cannot read /proc/cpuinfo, so hardware virtualization is unknown",
                "run the check on the host itself (with /proc mounted)");
  if (cpu.flag == "svm") return ok("cpu-virtualization", "AMD-V (svm flag in /proc/cpuinfo)");
  if (cpu.flag == "vmx") return ok("cpu-virtualization", "Intel VT-x (vmx flag in /proc/cpuinfo)");
  return fail(
      "cpu-virtualization",
      "no svm or vmx flag in /proc/cpuinfo: hardware virtualization is off in the firmware, "
      "or this is a VM without nested virtualization",
      "enable SVM (AMD) or VT-x (Intel) in the firmware setup and reboot");
}

Check kvm_check(const HostRoot& root, const CpuVirtualization& cpu) {
  std::error_code ec;
  if (!fs::exists(root("/dev/kvm"), ec)) {
    std::string mod = is_amd(cpu) ? "kvm_amd" : "kvm_intel";
    return fail("kvm", "no /dev/kvm: KubeVirt cannot start hardware-accelerated VMs",
                "enable virtualization in the firmware, then modprobe " + mod);
  }
  std::vector<std::string> mods;
  for (const char* m : {"kvm_amd", "kvm_intel"})
    if (fs::is_directory(root(std::string("/sys/module/") + m), ec)) mods.push_back(m);
  return ok("kvm", mods.empty() ? "/dev/kvm present"
                                : "/dev/kvm present (" + join(mods, ", ") + " loaded)");
}

Check iommu_check(const PciBus& bus, const std::vector<std::string>& units) {
  size_t groups = bus.iommu_group_count();
  if (groups == 0)
    return fail(
        "iommu",
        "no IOMMU groups in /sys/kernel/iommu_groups: the IOMMU is off, or this is a virtual "
        "machine without a virtual IOMMU; this machine cannot pass a card through",
        "enable the IOMMU (AMD-Vi / VT-d) in the firmware and boot with amd_iommu=on "
        "iommu=pt (AMD) or intel_iommu=on iommu=pt (Intel)");
  std::string kind;
  if (std::any_of(units.begin(), units.end(), [](auto& u) { return u.rfind("ivhd", 0) == 0; }))
    kind = "AMD-Vi, ";
  else if (std::any_of(units.begin(), units.end(), [](auto& u) { return u.rfind("dmar", 0) == 0; }))
    kind = "Intel VT-d, ";
  return ok("iommu", kind + std::to_string(groups) + " IOMMU groups" +
                         (units.empty() ? "" : ", units " + join(units, " ")));
}

Check cmdline_check(const HostRoot& root, const PciBus& bus, const CpuVirtualization& cpu) {
  auto cmdline = read_attr(root, "/proc/cmdline");
  const std::string amd_fix =
      "add amd_iommu=on iommu=pt to GRUB_CMDLINE_LINUX in /etc/default/grub, "
      "run update-grub and reboot";
  const std::string intel_fix =
      "add intel_iommu=on iommu=pt to GRUB_CMDLINE_LINUX in "
      "/etc/default/grub, run update-grub and reboot";
  if (!cmdline)
    return warn("kernel-cmdline", "cannot read /proc/cmdline", "run the check on the host itself");
  std::istringstream in(*cmdline);
  std::vector<std::string> words, hints;
  std::string w;
  while (in >> w) words.push_back(w);
  for (const auto& x : words) {
    if (x == "intel_iommu=off" || x == "amd_iommu=off" || x == "iommu=off")
      return fail("kernel-cmdline", x + " on the kernel command line turns the IOMMU off",
                  "remove " + x +
                      " from GRUB_CMDLINE_LINUX in /etc/default/grub, run update-grub "
                      "and reboot");
    if (x.rfind("intel_iommu=", 0) == 0 || x.rfind("amd_iommu=", 0) == 0 ||
        x.rfind("iommu=", 0) == 0)
      hints.push_back(x);
  }
  const std::string found = hints.empty() ? "no IOMMU options" : join(hints, " ");
  if (bus.iommu_groups_present())
    return ok("kernel-cmdline", found + " on the kernel command line; the IOMMU is on");
  // No groups: on Intel the kernel often needs intel_iommu=on; AMD enables it
  // by default, so there it is the firmware setting.
  return warn("kernel-cmdline", found + " on the kernel command line and no IOMMU groups",
              is_amd(cpu) ? amd_fix : intel_fix);
}

Check modules_check(const std::vector<ModuleState>& mods, const std::string& release) {
  std::vector<std::string> missing, unknown, not_loaded;
  for (const auto& m : mods) {
    if (m.available && !*m.available)
      missing.push_back(m.name);
    else if (!m.available)
      unknown.push_back(m.name);
    else if (!m.loaded)
      not_loaded.push_back(m.name);
  }
  if (!missing.empty())
    return fail("vfio-modules",
                join(missing, ", ") + " not in /lib/modules/" + release +
                    "/modules.dep: this kernel cannot bind a card to vfio-pci",
                "install the kernel's extra modules (Ubuntu: apt-get install linux-modules-extra-" +
                    (release.empty() ? std::string("$(uname -r)") : release) + ")");
  if (!unknown.empty())
    return warn("vfio-modules",
                "cannot tell whether " + join(unknown, ", ") + " exist (no readable /lib/modules/" +
                    (release.empty() ? std::string("<release>") : release) + "/modules.dep)",
                "check with modinfo vfio_pci");
  if (!not_loaded.empty())
    return ok("vfio-modules", "available; " + join(not_loaded, ", ") +
                                  " not loaded yet (factory host bind loads them)");
  return ok("vfio-modules", "vfio, vfio_iommu_type1, vfio_pci loaded");
}

Check boot_modules_check(const std::vector<ModuleState>& mods, bool any_on_vfio) {
  std::vector<std::string> missing, files, builtin;
  for (const auto& m : mods) {
    if (m.builtin)
      builtin.push_back(m.name);
    else if (m.boot_file.empty())
      missing.push_back(m.name);
    else if (std::find(files.begin(), files.end(), m.boot_file) == files.end())
      files.push_back(m.boot_file);
  }
  if (missing.empty()) {
    std::vector<std::string> parts;
    if (!files.empty()) parts.push_back("listed in " + join(files, ", "));
    if (!builtin.empty()) parts.push_back(join(builtin, ", ") + " built into the kernel");
    return ok("vfio-modules-at-boot", join(parts, "; "));
  }
  const std::string detail = join(missing, ", ") + " not in any modules-load.d file";
  if (!any_on_vfio) return ok("vfio-modules-at-boot", detail + " (factory host bind adds them)");
  return warn(
      "vfio-modules-at-boot",
      detail + ": after a reboot vfio-pci may not be there to take the cards",
      "printf '%s\\n' vfio vfio_iommu_type1 vfio_pci > " + std::string(kVfioModulesLoadFile));
}

Check driverctl_check() {
  std::string p = which("driverctl");
  if (p.empty())
    return warn("driverctl",
                "driverctl is not installed: a binding written only to sysfs is lost at reboot",
                "apt-get install -y driverctl");
  return ok("driverctl", p);
}

Check persistenced_check(const HostRoot& root) {
  auto p = persistenced_process(root);
  if (!p) return ok("nvidia-persistenced", "not running");
  return ok("nvidia-persistenced",
            "running (pid " + std::to_string(p->pid) +
                "); factory host bind stops it before moving a card off nvidia");
}

Check pci_ids_check(const std::optional<PciIds>& ids, const std::vector<GpuReport>& gpus) {
  std::vector<std::string> notes;
  for (const auto& g : gpus)
    if (!g.resource.from_pci_ids && g.fn.is_display())
      notes.push_back(g.fn.address.str() + ": " + g.resource.note);
  if (!ids)
    return warn("pci-ids",
                "no pci.ids under " + join(pci_ids_search_path(), ", ") +
                    (notes.empty() ? std::string() : "; " + join(notes, "; ")),
                "apt-get install -y pciutils, or give a list with --pci-ids FILE");
  if (!notes.empty())
    return warn(
        "pci-ids", join(notes, "; "),
        "give a newer list with --pci-ids FILE (NVIDIA's KubeVirt device plugin bundles one)");
  return ok("pci-ids", ids->describe());
}

std::string describe_state(const GpuReport& g) {
  std::string where = g.fn.driver.empty() ? "no driver" : g.fn.driver;
  return "on " + where;
}

Check gpu_check(const GpuReport& g, const HostInventory& inv, const PciBus& bus,
                const HostRoot& root) {
  const std::string name = "gpu " + g.fn.address.str();
  const std::string addr = g.fn.address.str();
  if (!g.fn.iommu_group)
    return fail(name, addr + " has no IOMMU group, so it cannot be passed through",
                "turn the IOMMU on (see the iommu check)");
  GroupAnalysis ga = analyze_group(inv, bus, *g.fn.iommu_group, {g.fn.address});
  if (!ga.blockers().empty())
    return fail(
        name,
        ga.blocker_text() +
            "; KubeVirt needs every function of the group on vfio-pci (\"group not viable\")",
        "move the card to a slot with an IOMMU group of its own (or enable ACS in the firmware)");
  std::string group = "IOMMU group " + std::to_string(*g.fn.iommu_group);
  auto moved = ga.to_move();
  if (moved.size() > 1) {
    std::vector<std::string> others;
    for (const auto& a : moved)
      if (a != g.fn.address) others.push_back(a.str());
    group += " (with its own " + join(others, ", ") + ")";
  }
  const bool on_vfio = g.fn.driver == "vfio-pci";
  const bool persisted = g.override_driver && *g.override_driver == "vfio-pci";
  if (on_vfio) {
    // Half a bind: the card on vfio-pci, its own audio still on the host driver.
    std::vector<std::string> stray;
    for (const auto& m : ga.members)
      if (m.role == MemberRole::card && m.fn.address != g.fn.address &&
          !driver_leaves_group_viable(m.fn.driver))
        stray.push_back(m.fn.address.str() + " on " + m.fn.driver);
    if (!stray.empty())
      return fail(name,
                  "on vfio-pci, but its own " + join(stray, ", ") +
                      " is not: KubeVirt fails the VM with \"group not viable\"; " + group,
                  "factory host bind --pci " + addr);
  }
  if (on_vfio && !persisted)
    return warn(
        name,
        "on vfio-pci now, but driverctl holds no override: the host driver takes it back at "
        "the next boot; " +
            group,
        "factory host bind --pci " + addr);
  if (!on_vfio && persisted)
    return warn(name, describe_state(g) + " although driverctl's override says vfio-pci; " + group,
                "factory host bind --pci " + addr);
  if (!on_vfio && g.fn.driver == "nvidia") {
    if (auto minor = nvidia_device_minor(root, g.fn.address)) {
      std::vector<std::string> users;
      for (const auto& p : nvidia_device_holders(root, *minor))
        if (p.comm.rfind("nvidia-persiste", 0) != 0)
          users.push_back(p.comm + " (pid " + std::to_string(p.pid) + ")");
      if (!users.empty())
        return warn(name,
                    "in use on the host by " + join(users, ", ") + " through /dev/nvidia" +
                        std::to_string(*minor) + "; " + group,
                    "stop those processes before factory host bind --pci " + addr);
    }
  }
  if (on_vfio) return ok(name, "on vfio-pci, kept across reboots by driverctl; " + group);
  return ok(name, describe_state(g) + " (the host keeps it until factory host bind --pci " + addr +
                      "); " + group);
}

}  // namespace

Result<HostReport> check_host(const HostRoot& root, const CheckOptions& opts) {
  auto ids = find_pci_ids(root, opts.pci_ids_file);
  if (!ids) return ids.error();
  PciBus bus(root);
  auto inv = take_inventory(bus, ids->has_value() ? &**ids : nullptr);
  if (!inv) return inv.error();

  HostReport r;
  r.gpus = inv->nvidia;
  const auto cpu = probe_cpu_virtualization(root);
  const auto mods = probe_vfio_modules(root);
  bool any_on_vfio = std::any_of(r.gpus.begin(), r.gpus.end(), [](const GpuReport& g) {
    return g.fn.driver == "vfio-pci" || g.override_driver;
  });
  r.checks.push_back(cpu_check(cpu));
  r.checks.push_back(kvm_check(root, cpu));
  r.checks.push_back(iommu_check(bus, iommu_units(root)));
  r.checks.push_back(cmdline_check(root, bus, cpu));
  r.checks.push_back(modules_check(mods, kernel_release(root)));
  r.checks.push_back(boot_modules_check(mods, any_on_vfio));
  r.checks.push_back(driverctl_check());
  r.checks.push_back(persistenced_check(root));
  r.checks.push_back(pci_ids_check(*ids, r.gpus));
  std::vector<const GpuReport*> cards;
  for (const auto& g : r.gpus)
    if (g.fn.is_display()) cards.push_back(&g);
  if (cards.empty())
    r.checks.push_back(
        fail("nvidia-gpus", "no NVIDIA GPU on the PCI bus (/sys/bus/pci/devices)",
             "check that the card is seated and powered and that lspci -d 10de: lists it"));
  else {
    std::vector<std::string> list;
    for (const auto* g : cards)
      list.push_back(g->fn.address.str() + " " + g->fn.vendor_id() + ":" + g->fn.device_id() +
                     (g->name ? " " + *g->name : std::string()));
    r.checks.push_back(ok("nvidia-gpus", std::to_string(cards.size()) + ": " + join(list, ", ")));
  }
  for (const auto* g : cards) r.checks.push_back(gpu_check(*g, *inv, bus, root));
  return r;
}

nlohmann::json to_json(const HostReport& r) {
  using nlohmann::json;
  json checks = json::array();
  for (const auto& c : r.checks)
    checks.push_back({{"name", c.name},
                      {"verdict", verdict_name(c.verdict)},
                      {"detail", c.detail},
                      {"fix", c.fix.empty() ? json(nullptr) : json(c.fix)}});
  json gpus = json::array();
  for (const auto& g : r.gpus) {
    json members = json::array();
    for (const auto& m : g.group_members) members.push_back(m.str());
    gpus.push_back({{"address", g.fn.address.str()},
                    {"vendor_id", g.fn.vendor_id()},
                    {"device_id", g.fn.device_id()},
                    {"subsystem_id", g.fn.subsystem_id()},
                    {"name", g.name ? json(*g.name) : json(nullptr)},
                    {"driver", g.fn.driver.empty() ? json(nullptr) : json(g.fn.driver)},
                    {"iommu_group", g.fn.iommu_group ? json(*g.fn.iommu_group) : json(nullptr)},
                    {"group_members", members},
                    {"override", g.override_driver ? json(*g.override_driver) : json(nullptr)},
                    {"resource_name", g.resource.name}});
  }
  return {{"checks", checks}, {"gpus", gpus}};
}

}  // namespace factory::host
