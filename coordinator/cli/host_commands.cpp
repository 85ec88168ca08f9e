// `factory host ...`: runbook steps 0 and 2 for the admin on the GPU node.
#include <unistd.h>

#include <iostream>
#include <memory>
#include <optional>
#include <sstream>

#include "coordinator/cli/commands.hpp"
#include "coordinator/cli/output.hpp"
#include "coordinator/host/binder.hpp"
#include "coordinator/host/preflight.hpp"

namespace factory::cli {
namespace {

using namespace factory::host;

struct HostOptions {
  std::string root = "/";
  std::string pci_ids;
  OutputFormat check_out = OutputFormat::table;
  std::vector<std::string> pci;
  bool dry_run = false;
  std::optional<uid_t> euid;  // --euid: whose root check (default: the process's)
};

std::string or_dash(const std::optional<std::string>& s) {
  return s ? *s : "-";
}

int check(const HostOptions& o) {
  auto report = check_host(HostRoot(o.root), CheckOptions{o.pci_ids});
  if (!report) return fail(report.error());
  const int status = report->passthrough_possible() ? 0 : 1;
  if (print_document(std::cout, o.check_out, to_json(*report))) return status;

  std::vector<std::vector<std::string>> rows;
  for (const auto& c : report->checks)
    rows.push_back({c.name, verdict_name(c.verdict), c.detail, c.fix});
  print_table(std::cout, {"check", "verdict", "detail", "fix"}, rows);
  std::cout << "\n";
  rows.clear();
  for (const auto& g : report->gpus) {
    std::string members;
    for (const auto& m : g.group_members) members += (members.empty() ? "" : ",") + m.str();
    rows.push_back({g.fn.address.str(), g.fn.vendor_id() + ":" + g.fn.device_id(),
                    g.fn.subsystem_id(), or_dash(g.name), g.fn.driver.empty() ? "-" : g.fn.driver,
                    g.fn.iommu_group ? std::to_string(*g.fn.iommu_group) : "-",
                    members.empty() ? "-" : members, or_dash(g.override_driver), g.resource.name});
  }
  if (rows.empty())
    std::cout << "No NVIDIA PCI functions.\n";
  else
    print_table(std::cout,
                {"address", "id", "subsystem", "name", "driver", "iommu group", "group members",
                 "override", "resource name"},
                rows);
  std::cout << "\n"
            << (status == 0
                    ? "Passthrough can work on this machine."
                    : "Passthrough cannot work on this machine as it is: see the failed checks.")
            << "\n";
  return status;
}

// --pci takes addresses one per flag, several after one flag, or a list in one
// argument ("0000:01:00.0 0000:41:00.0", as the runbook's PCI_ADDRS).
Result<std::vector<PciAddress>> parse_addresses(const std::vector<std::string>& args) {
  std::vector<PciAddress> out;
  for (const auto& arg : args) {
    std::string a = arg;
    for (auto& c : a)
      if (c == ',') c = ' ';
    std::istringstream words(a);
    std::string w;
    while (words >> w) {
      auto p = PciAddress::parse(w);
      if (!p) return p.error();
      if (std::find(out.begin(), out.end(), *p) == out.end()) out.push_back(*p);
    }
  }
  if (out.empty()) return Error(Errc::invalid_argument, "no PCI address given: --pci 0000:01:00.0");
  return out;
}

int move_cards(const HostOptions& o, bool bind) {
  const std::string verb = bind ? "bind" : "unbind";
  HostRoot root(o.root);
  auto addrs = parse_addresses(o.pci);
  if (!addrs) return fail(addrs.error());
  // The tree under --host-root is the caller's own files: binding there needs
  // no root, so the check is made as though by root, unless --euid says who.
  const uid_t euid = o.euid ? *o.euid : root.is_real() ? ::geteuid() : 0;
  if (!o.dry_run)
    if (auto st = require_root(euid, verb); !st) return fail(st.error());
  auto ids = find_pci_ids(root, o.pci_ids);
  if (!ids) return fail(ids.error());
  const PciIds* idp = ids->has_value() ? &**ids : nullptr;
  auto plan = bind ? plan_bind(root, *addrs, idp) : plan_unbind(root, *addrs, idp);
  if (!plan) return fail(plan.error().with_context(verb));
  if (o.dry_run) {
    print_plan(std::cout, *plan);
    std::cout << "dry run: nothing was changed\n";
    return 0;
  }
  if (plan->empty()) {
    for (const auto& u : plan->unchanged) std::cout << u << "\n";
    return 0;
  }
  if (auto st = execute_plan(root, *plan, std::cout); !st) return fail(st.error());
  // Say where every moved function ended up, read back from sysfs.
  for (const auto& c : plan->cards)
    for (const auto& f : c.functions) {
      FunctionState st = read_function_state(root, f);
      std::cout << f.str() << ": " << describe(st);
      // The runbook's host needs no NVIDIA driver, so nothing may take the card back.
      if (!bind && st.driver.empty())
        std::cout << " (no host driver took it; load one, e.g. modprobe nvidia, then echo "
                  << f.str() << " > /sys/bus/pci/drivers_probe)";
      std::cout << "\n";
    }
  return 0;
}

}  // namespace

void add_host_commands(CLI::App& app, Context& ctx) {
  auto opts = std::make_shared<HostOptions>();
  auto* host = app.add_subcommand(
      "host",
      "The GPU node: passthrough preflight, NVIDIA card inventory, vfio-pci binding (as root)");
  host->require_subcommand(1);
  host->add_option(
          "--host-root", opts->root,
          "Find /sys, /proc, /dev, /etc and pci.ids under DIR instead of / (captured trees, "
          "tests); modprobe, systemctl and driverctl still run from PATH")
      ->capture_default_str();
  host->add_option("--pci-ids", opts->pci_ids,
                   "pci.ids file naming the cards (default: /usr/share/misc/pci.ids, "
                   "/usr/share/hwdata/pci.ids or /usr/share/pci.ids)");
  // Hidden: lets the tests, which run as root on a tree, see the refusal a
  // user without root gets on the real machine.
  host->add_option("--euid", opts->euid, "Effective uid the root check sees")->group("");

  auto* c = host->add_subcommand(
      "check",
      "Can this machine pass a GPU through? Verdicts with fixes, and every NVIDIA function");
  add_output_option(*c, opts->check_out);
  set_examples(*c, {{"factory host check", "this machine"},
                    {"factory host --host-root ./capture check -o json", "a captured tree"}});
  c->callback([&ctx, opts] { ctx.run = [opts] { return check(*opts); }; });

  for (bool bind : {true, false}) {
    auto* m = host->add_subcommand(
        bind ? "bind" : "unbind",
        bind ? "Move cards to vfio-pci by address and keep them there across reboots (driverctl)"
             : "Give cards back to the host driver and remove the driverctl override");
    m->add_option("--pci", opts->pci, "PCI address of a card, e.g. 0000:01:00.0 (repeatable)")
        ->required();
    m->add_flag("--dry-run", opts->dry_run, "Print each action and change nothing");
    const std::string verb = bind ? "bind" : "unbind";
    set_examples(*m, {{"factory host " + verb + " --pci 0000:01:00.0 --dry-run",
                       "what it would do (no root needed)"},
                      {"factory host " + verb + " --pci '0000:01:00.0 0000:41:00.0'",
                       "two cards, as root"}});
    m->callback([&ctx, opts, bind] { ctx.run = [opts, bind] { return move_cards(*opts, bind); }; });
  }
}

}  // namespace factory::cli
