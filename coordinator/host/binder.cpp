#include "coordinator/host/binder.hpp"

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include "common/atomic_file.hpp"
#include "common/subprocess.hpp"
#include "coordinator/host/host_state.hpp"
#include "coordinator/host/inventory.hpp"
#include "coordinator/host/sysfs.hpp"

namespace factory::host {
namespace fs = std::filesystem;

namespace {

constexpr const char* kVfioPci = "vfio-pci";

std::string dev_dir(const PciAddress& a) {
  return "/sys/bus/pci/devices/" + a.str();
}

std::string binder_join(const std::vector<std::string>& v, const std::string& sep) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

std::string current_driver(const HostRoot& root, const PciAddress& a) {
  return read_link_name(root, dev_dir(a) + "/driver").value_or("");
}

std::string current_override(const HostRoot& root, const PciAddress& a) {
  auto ov = read_attr(root, dev_dir(a) + "/driver_override");
  if (!ov || *ov == "(null)") return "";
  return *ov;
}

std::string on(const std::string& driver) {
  return driver.empty() ? "no driver" : driver;
}

// Runs a host tool found on PATH (modprobe, systemctl, driverctl) without a shell.
Status run_tool(const std::vector<std::string>& argv) {
  CommandSpec spec;
  spec.argv = argv;
  spec.timeout = std::chrono::minutes(2);
  auto r = run_checked(spec);
  if (!r) return r.error().with_context(binder_join(argv, " "));
  return ok_status();
}

// ---- host-wide steps ----

Step modprobe_step(const HostRoot& root, const std::string& module) {
  Step s;
  s.command = "modprobe " + module;
  s.apply = [root, module]() -> Result<bool> {
    if (auto st = run_tool({"modprobe", module}); !st) return st.error();
    // probe_vfio_modules counts modules.builtin too, so a built-in module passes.
    bool loaded = false;
    for (const auto& m : probe_vfio_modules(root))
      if (m.name == module) loaded = m.loaded;
    if (!loaded)
      return Error(Errc::failed_precondition,
                   "modprobe " + module + " succeeded but /sys/module/" + module + " is not there");
    return true;
  };
  return s;
}

Step modules_load_step(const HostRoot& root, const std::vector<std::string>& missing) {
  Step s;
  const std::string file(kVfioModulesLoadFile);
  std::error_code ec;
  const bool exists = fs::exists(root(file), ec);
  s.command = "printf '%s\\n' " + binder_join(missing, " ") + (exists ? " >> " : " > ") + file;
  s.note = "so the modules are there at boot for driverctl's override";
  s.apply = [root, missing, file]() -> Result<bool> {
    std::string text;
    if (auto cur = read_file(root(file))) text = *cur;
    if (!text.empty() && text.back() != '\n') text += "\n";
    for (const auto& m : missing) text += m + "\n";
    if (auto st = ensure_dir(root("/etc/modules-load.d")); !st) return st.error();
    if (auto st = write_file_atomic(root(file), text, 0644); !st) return st.error();
    return true;
  };
  return s;
}

// ---- per-function bind steps; each undo puts back only what its apply changed ----

Step unbind_driver_step(const HostRoot& root, const PciAddress& a, const std::string& driver) {
  Step s;
  s.command = echo_command(a.str(), dev_dir(a) + "/driver/unbind");
  s.apply = [root, a, driver]() -> Result<bool> {
    if (auto st = write_attr(root, dev_dir(a) + "/driver/unbind", a.str()); !st) return st.error();
    if (!wait_until([&] { return current_driver(root, a).empty(); }))
      return Error(Errc::failed_precondition,
                   a.str() + " is still on " + current_driver(root, a) + " after the unbind");
    return true;
  };
  s.undo = [root, a, driver]() -> Status {
    std::string cur = current_driver(root, a);
    if (cur == driver) return ok_status();
    if (!cur.empty())
      return Error(Errc::failed_precondition, a.str() + " is on " + cur + ", not " + driver);
    if (auto st = write_attr(root, "/sys/bus/pci/drivers/" + driver + "/bind", a.str()); !st)
      return st;
    if (!wait_until([&] { return current_driver(root, a) == driver; }))
      return Error(Errc::failed_precondition, a.str() + " did not go back to " + driver);
    return ok_status();
  };
  return s;
}

Step set_override_step(const HostRoot& root, const PciAddress& a, const std::string& previous) {
  Step s;
  s.command = echo_command(kVfioPci, dev_dir(a) + "/driver_override");
  s.note = "so that only vfio-pci may take it";
  s.apply = [root, a]() -> Result<bool> {
    if (auto st = write_attr(root, dev_dir(a) + "/driver_override", kVfioPci); !st)
      return st.error();
    if (current_override(root, a) != kVfioPci)
      return Error(Errc::failed_precondition,
                   dev_dir(a) + "/driver_override does not read vfio-pci");
    return true;
  };
  s.undo = [root, a, previous]() -> Status {
    return write_attr(root, dev_dir(a) + "/driver_override", previous);
  };
  return s;
}

Step bind_vfio_step(const HostRoot& root, const PciAddress& a) {
  Step s;
  s.command = echo_command(a.str(), "/sys/bus/pci/drivers/vfio-pci/bind");
  s.apply = [root, a]() -> Result<bool> {
    if (auto st = write_attr(root, "/sys/bus/pci/drivers/vfio-pci/bind", a.str()); !st)
      return st.error();
    if (!wait_until([&] { return current_driver(root, a) == kVfioPci; }))
      return Error(Errc::failed_precondition, a.str() + " did not bind to vfio-pci (it is on " +
                                                  on(current_driver(root, a)) +
                                                  "); the kernel log (dmesg) says why");
    return true;
  };
  s.undo = [root, a]() -> Status {
    if (current_driver(root, a) != kVfioPci) return ok_status();
    if (auto st = write_attr(root, dev_dir(a) + "/driver/unbind", a.str()); !st) return st;
    if (!wait_until([&] { return current_driver(root, a).empty(); }))
      return Error(Errc::failed_precondition, a.str() + " is still on vfio-pci");
    return ok_status();
  };
  return s;
}

Step driverctl_set_step(const HostRoot& root, const PciAddress& a,
                        const std::optional<std::string>& previous) {
  Step s;
  s.command = "driverctl set-override " + a.str() + " vfio-pci";
  s.note = "a driver_override in sysfs is gone after a reboot; driverctl re-applies it at boot";
  s.apply = [root, a]() -> Result<bool> {
    if (auto st = run_tool({"driverctl", "set-override", a.str(), kVfioPci}); !st)
      return st.error();
    auto saved = driverctl_override(root, a);
    if (!saved || *saved != kVfioPci)
      return Error(Errc::failed_precondition, "driverctl set-override succeeded but " +
                                                  driverctl_override_path(a) +
                                                  " does not say vfio-pci");
    // driverctl unbinds and reprobes as it saves; the card must land on vfio-pci again.
    if (!wait_until([&] { return current_driver(root, a) == kVfioPci; }))
      return Error(Errc::failed_precondition, "after driverctl set-override " + a.str() +
                                                  " is on " + on(current_driver(root, a)) +
                                                  ", not vfio-pci");
    return true;
  };
  s.undo = [root, a, previous]() -> Status {
    if (previous) return run_tool({"driverctl", "set-override", a.str(), *previous});
    return run_tool({"driverctl", "unset-override", a.str()});
  };
  return s;
}

// ---- per-function unbind steps; each re-reads the state, since the real
// driverctl unset-override already clears the override and reprobes ----

Step driverctl_unset_step(const HostRoot& root, const PciAddress& a) {
  Step s;
  s.command = "driverctl unset-override " + a.str();
  s.apply = [root, a]() -> Result<bool> {
    if (auto st = run_tool({"driverctl", "unset-override", a.str()}); !st) return st.error();
    if (driverctl_override(root, a))
      return Error(Errc::failed_precondition, "driverctl unset-override succeeded but " +
                                                  driverctl_override_path(a) + " is still there");
    return true;
  };
  return s;
}

Step clear_override_step(const HostRoot& root, const PciAddress& a) {
  Step s;
  s.command = echo_command("", dev_dir(a) + "/driver_override");
  s.note = "skipped when driverctl already cleared it";
  s.apply = [root, a]() -> Result<bool> {
    if (current_override(root, a).empty()) return false;
    if (auto st = write_attr(root, dev_dir(a) + "/driver_override", ""); !st) return st.error();
    if (!current_override(root, a).empty())
      return Error(Errc::failed_precondition, dev_dir(a) + "/driver_override is not cleared");
    return true;
  };
  return s;
}

Step unbind_vfio_step(const HostRoot& root, const PciAddress& a) {
  Step s;
  s.command = echo_command(a.str(), dev_dir(a) + "/driver/unbind");
  s.note = "only while it is on vfio-pci";
  s.apply = [root, a]() -> Result<bool> {
    if (current_driver(root, a) != kVfioPci) return false;
    if (auto st = write_attr(root, dev_dir(a) + "/driver/unbind", a.str()); !st) return st.error();
    if (!wait_until([&] { return current_driver(root, a).empty(); }))
      return Error(Errc::failed_precondition, a.str() + " is still on vfio-pci after the unbind");
    return true;
  };
  return s;
}

Step reprobe_step(const HostRoot& root, const PciAddress& a) {
  Step s;
  s.command = echo_command(a.str(), "/sys/bus/pci/drivers_probe");
  s.note = "the host driver takes it back";
  s.apply = [root, a]() -> Result<bool> {
    if (!current_driver(root, a).empty()) return false;
    if (auto st = write_attr(root, "/sys/bus/pci/drivers_probe", a.str()); !st) return st.error();
    // No driver may claim it (none installed): that is reported, not an error.
    wait_until([&] { return !current_driver(root, a).empty(); });
    if (current_driver(root, a) == kVfioPci)
      return Error(Errc::failed_precondition, a.str() + " went back to vfio-pci on reprobe");
    return true;
  };
  return s;
}

std::string card_summary(const PciFunction& f, const PciIds* ids,
                         const std::vector<PciAddress>& with) {
  std::string s = f.vendor_id() + ":" + f.device_id();
  if (ids)
    if (auto n = ids->device_name(f.vendor, f.device)) s += " " + *n;
  s += ", on " + on(f.driver);
  if (f.iommu_group) s += ", IOMMU group " + std::to_string(*f.iommu_group);
  std::vector<std::string> others;
  for (const auto& a : with)
    if (a != f.address) others.push_back(a.str());
  if (!others.empty()) s += ", with " + binder_join(others, ", ");
  return s;
}

Result<const PciFunction*> find_nvidia(const HostInventory& inv, const PciBus& bus,
                                       const PciAddress& a, const std::string& verb) {
  const PciFunction* f = inv.find(a);
  if (!f) {
    auto r = bus.function(a);  // its not_found message names the sysfs path
    return r ? Error(Errc::not_found, "no PCI function " + a.str() + " on this host") : r.error();
  }
  if (!f->is_nvidia())
    return Error(Errc::invalid_argument,
                 a.str() + " is not an NVIDIA function (" + f->vendor_id() + ":" + f->device_id() +
                     ", class " + f->class_id() + "): factory host " + verb +
                     " only moves NVIDIA GPUs; list them with factory host check");
  return f;
}

}  // namespace

Status require_root(uid_t euid, const std::string& what) {
  if (euid != 0)
    return Error(Errc::permission_denied,
                 "factory host " + what +
                     " writes /sys and /etc, so it must run as root: run it "
                     "with sudo (or try --dry-run first)");
  return ok_status();
}

Result<HostPlan> plan_bind(const HostRoot& root, const std::vector<PciAddress>& cards,
                           const PciIds* ids) {
  PciBus bus(root);
  auto inv = take_inventory(bus, ids);
  if (!inv) return inv.error();

  // Validate every address before planning anything, so a bad one changes nothing.
  std::map<unsigned, std::vector<PciAddress>> by_group;
  for (const auto& a : cards) {
    auto f = find_nvidia(*inv, bus, a, "bind");
    if (!f) return f.error();
    if (!(*f)->iommu_group)
      return Error(Errc::failed_precondition,
                   a.str() +
                       " has no IOMMU group: the IOMMU is off (or this is a VM without a virtual "
                       "IOMMU), so no card can be passed through here; see factory host check");
    auto& g = by_group[*(*f)->iommu_group];
    if (std::find(g.begin(), g.end(), a) == g.end()) g.push_back(a);
  }

  const auto modules = probe_vfio_modules(root);
  for (const auto& m : modules)
    if (m.available && !*m.available) {
      std::string rel = kernel_release(root);
      return Error(Errc::failed_precondition,
                   "this kernel has no " + m.name + " module (not in /lib/modules/" + rel +
                       "/modules.dep): install the kernel's extra modules (Ubuntu: apt-get install "
                       "linux-modules-extra-" +
                       (rel.empty() ? std::string("$(uname -r)") : rel) + ")");
    }
  const auto persistenced = persistenced_process(root);

  HostPlan plan;
  plan.verb = "bind";
  plan.rollback = true;
  bool needs_driverctl = false, stop_persistenced = false;
  std::set<PciAddress> moving_all;
  for (const auto& [group, asked] : by_group) {
    GroupAnalysis ga = analyze_group(*inv, bus, group, {asked.begin(), asked.end()});
    if (!ga.blockers().empty())
      return Error(
          Errc::failed_precondition,
          asked.front().str() + ": " + ga.blocker_text() +
              "; KubeVirt needs every function of the group on vfio-pci (\"group not "
              "viable\"), so bind refuses: put the card in a slot with an IOMMU group of its "
              "own (or enable ACS in the firmware)");
    CardPlan cp;
    cp.card = asked.front();
    cp.functions = asked;
    for (const auto& a : ga.to_move())
      if (std::find(cp.functions.begin(), cp.functions.end(), a) == cp.functions.end())
        cp.functions.push_back(a);
    cp.summary = card_summary(*inv->find(cp.card), ids, cp.functions);
    for (const auto& a : cp.functions) {
      moving_all.insert(a);
      const PciFunction* fn = inv->find(a);
      FunctionState st = read_function_state(root, a);
      cp.before.push_back(st);
      if (fn->driver == "nvidia") {
        // Unbinding nvidia from a card that a process holds open blocks in the
        // kernel until the process exits: refuse instead of hanging.
        std::optional<unsigned> minor = nvidia_device_minor(root, a);
        bool persistenced_holds = persistenced.has_value() && !minor;
        if (minor) {
          std::vector<std::string> users;
          for (const auto& p : nvidia_device_holders(root, *minor)) {
            if (persistenced && p.pid == persistenced->pid)
              persistenced_holds = true;
            else
              users.push_back(p.comm + " (pid " + std::to_string(p.pid) + ")");
          }
          if (!users.empty())
            return Error(Errc::failed_precondition,
                         a.str() + " is open by " + binder_join(users, ", ") +
                             " through /dev/nvidia" + std::to_string(*minor) +
                             "; unbinding nvidia now would hang until " +
                             "they exit: stop them and run bind again");
        }
        if (persistenced_holds) stop_persistenced = true;
      }
      if (st.driver != kVfioPci && !st.driver.empty())
        cp.steps.push_back(unbind_driver_step(root, a, st.driver));
      if (st.driver_override != kVfioPci)
        cp.steps.push_back(set_override_step(root, a, st.driver_override));
      if (st.driver != kVfioPci) cp.steps.push_back(bind_vfio_step(root, a));
      if (!st.driverctl || *st.driverctl != kVfioPci) {
        cp.steps.push_back(driverctl_set_step(root, a, st.driverctl));
        needs_driverctl = true;
      }
    }
    if (cp.steps.empty())
      plan.unchanged.push_back(cp.card.str() +
                               ": already bound to vfio-pci and kept there by "
                               "driverctl; nothing changed");
    else
      plan.cards.push_back(std::move(cp));
  }
  if (needs_driverctl && which("driverctl").empty())
    return Error(
        Errc::failed_precondition,
        "driverctl is not installed, and bind needs it to keep the binding across reboots: "
        "apt-get install -y driverctl");

  // Host-wide preparation, each only when needed, so a second run changes nothing.
  std::vector<std::string> not_at_boot;
  for (const auto& m : modules) {
    if (!m.loaded && !plan.cards.empty()) plan.prepare.push_back(modprobe_step(root, m.name));
    if (m.boot_file.empty() && !m.builtin) not_at_boot.push_back(m.name);
  }
  if (!not_at_boot.empty()) plan.prepare.push_back(modules_load_step(root, not_at_boot));
  if (stop_persistenced) {
    auto stopped = std::make_shared<bool>(false);
    Step stop;
    stop.command = "systemctl stop nvidia-persistenced";
    stop.note = "it holds the nvidia cards open, which makes the unbind fail";
    stop.apply = [root, stopped]() -> Result<bool> {
      auto p = persistenced_process(root);
      if (!p) return false;
      if (auto st = run_tool({"systemctl", "stop", "nvidia-persistenced"}); !st) return st.error();
      if (!wait_until([&] { return !persistenced_process(root); }, std::chrono::seconds(10)))
        return Error(Errc::failed_precondition,
                     "nvidia-persistenced (pid " + std::to_string(p->pid) +
                         ") still runs after systemctl stop: stop it (kill " +
                         std::to_string(p->pid) + ") and run bind again");
      *stopped = true;
      return true;
    };
    plan.prepare.push_back(std::move(stop));
    // The cards that stay on the host keep their persistence daemon.
    std::vector<std::string> staying;
    for (const auto& g : inv->nvidia)
      if (g.fn.driver == "nvidia" && !moving_all.count(g.fn.address))
        staying.push_back(g.fn.address.str());
    Step start;
    start.command = "systemctl start nvidia-persistenced";
    start.note = staying.empty()
                     ? "only if a card is left on nvidia"
                     : "for the cards that stay on nvidia: " + binder_join(staying, ", ");
    start.apply = [root, stopped]() -> Result<bool> {
      if (!*stopped) return false;
      auto fns = PciBus(root).functions();
      bool any = fns && std::any_of(fns->begin(), fns->end(), [](const PciFunction& f) {
                   return f.is_nvidia() && f.driver == "nvidia";
                 });
      if (!any) return false;
      if (auto st = run_tool({"systemctl", "start", "nvidia-persistenced"}); !st) return st.error();
      return true;
    };
    if (!staying.empty())
      plan.finish.push_back(std::move(start));
    else {
      // Still needed if a card fails and rolls back to nvidia.
      start.note = "only if a card rolls back to nvidia";
      plan.finish.push_back(std::move(start));
    }
  }
  return plan;
}

Result<HostPlan> plan_unbind(const HostRoot& root, const std::vector<PciAddress>& cards,
                             const PciIds* ids) {
  PciBus bus(root);
  auto inv = take_inventory(bus, ids);
  if (!inv) return inv.error();
  for (const auto& a : cards) {
    auto f = find_nvidia(*inv, bus, a, "unbind");
    if (!f) return f.error();
  }
  HostPlan plan;
  plan.verb = "unbind";
  plan.rollback = false;
  std::set<PciAddress> seen;
  bool needs_driverctl = false;
  for (const auto& a : cards) {
    if (seen.count(a)) continue;
    const PciFunction* card = inv->find(a);
    CardPlan cp;
    cp.card = a;
    // The card and its own functions that vfio holds (its audio went with it).
    std::vector<PciAddress> fns{a};
    for (const auto& f : inv->functions)
      if (f.is_nvidia() && f.address != a && f.address.same_slot(a)) fns.push_back(f.address);
    for (const auto& f : fns) {
      if (seen.count(f)) continue;
      FunctionState st = read_function_state(root, f);
      bool held = st.driver == kVfioPci || !st.driver_override.empty() || st.driverctl;
      if (!held) continue;
      seen.insert(f);
      cp.functions.push_back(f);
      cp.before.push_back(st);
      if (st.driverctl) {
        cp.steps.push_back(driverctl_unset_step(root, f));
        needs_driverctl = true;
      }
      cp.steps.push_back(clear_override_step(root, f));
      cp.steps.push_back(unbind_vfio_step(root, f));
      cp.steps.push_back(reprobe_step(root, f));
    }
    seen.insert(a);
    if (cp.steps.empty()) {
      plan.unchanged.push_back(a.str() + ": not bound to vfio-pci (on " + on(card->driver) +
                               "); nothing changed");
      continue;
    }
    cp.summary = card_summary(*card, ids, cp.functions);
    plan.cards.push_back(std::move(cp));
  }
  if (needs_driverctl && which("driverctl").empty())
    return Error(
        Errc::failed_precondition,
        "driverctl is not installed, but it holds an override for the card: apt-get install "
        "-y driverctl, or remove the file in /etc/driverctl.d by hand");
  return plan;
}

}  // namespace factory::host
