// `factory host ...`: runbook steps 0 and 2 for the admin on the GPU node,
// and step 2 delegated to the GPU Operator (`bind --via gpu-operator`).
#include <unistd.h>

#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include "common/durations.hpp"
#include "contract/xid_catalog.hpp"
#include "coordinator/cli/admin_client.hpp"
#include "coordinator/cli/commands.hpp"
#include "coordinator/cli/output.hpp"
#include "coordinator/host/binder.hpp"
#include "coordinator/host/gpu_operator.hpp"
#include "coordinator/host/preflight.hpp"
#include "coordinator/host/quarantine.hpp"
#include "coordinator/kube/client.hpp"
#include "coordinator/kube/pod_log.hpp"

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
  // bind --via gpu-operator
  std::string via = "driverctl";
  std::string node;
  std::string wait_timeout = "5m";
  int poll_ms = 1000;
  OutputFormat bind_out = OutputFormat::table;
  kube::AccessOptions access;
  // quarantine / release / gpus
  std::string reason;
  OutputFormat card_out = OutputFormat::table;
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

// ---- quarantine, release, gpus ----

namespace op = factory::host::gpu_operator;
using nlohmann::json;

// The one card a quarantine or release is about.
Result<PciAddress> one_card(const HostOptions& o) {
  auto addrs = parse_addresses(o.pci);
  if (!addrs) return addrs.error();
  if (addrs->size() != 1)
    return Error(Errc::invalid_argument, "--pci takes one card at a time here");
  return addrs->front();
}

std::string plan_commands(const HostPlan& plan) {
  std::ostringstream out;
  print_plan(out, plan);
  return out.str();
}

json card_doc(const HostRoot& root, const PciAddress& a, const CardRecord* r, bool dry_run,
              bool changed, const HostPlan& plan) {
  json steps = json::array();
  for (const auto& s : plan.prepare) steps.push_back(s.command);
  for (const auto& c : plan.cards)
    for (const auto& s : c.steps) steps.push_back(s.command);
  FunctionState st = read_function_state(root, a);
  return {{"address", a.str()},
          {"quarantined", r && r->quarantined},
          {"reason", r ? r->reason : ""},
          {"quarantinedAt", r ? r->quarantined_at : ""},
          {"releasedAt", r ? r->released_at : ""},
          {"driver", st.driver.empty() ? "none" : st.driver},
          {"dryRun", dry_run},
          {"changed", changed},
          {"steps", steps}};
}

int quarantine(const HostOptions& o) {
  HostRoot root(o.root);
  auto addr = one_card(o);
  if (!addr) return fail(addr.error());
  if (auto st = check_reason(o.reason); !st) return fail(st.error());
  const uid_t euid = o.euid ? *o.euid : root.is_real() ? ::geteuid() : 0;
  if (!o.dry_run)
    if (auto st = require_root(euid, "quarantine"); !st) return fail(st.error());
  auto ids = find_pci_ids(root, o.pci_ids);
  if (!ids) return fail(ids.error());
  const PciIds* idp = ids->has_value() ? &**ids : nullptr;
  auto cards = read_cards(root);
  if (!cards) return fail(cards.error());
  // Off vfio-pci (back to the host's driver): KubeVirt's device plugin only
  // offers cards on vfio-pci, and the admin's reset or burn-in needs the
  // card on the host. Refuses an address that is no NVIDIA card.
  auto plan = plan_unbind(root, {*addr}, idp);
  if (!plan) return fail(plan.error().with_context("quarantine"));
  const CardRecord* before = find_card(*cards, addr->str());
  const bool recorded = before && before->quarantined;
  const bool table = o.card_out == OutputFormat::table;
  std::ostream& progress = table ? std::cout : std::cerr;
  if (recorded && plan->empty()) {
    if (!print_document(std::cout, o.card_out,
                        card_doc(root, *addr, before, o.dry_run, false, *plan)))
      std::cout << addr->str() << ": already quarantined since " << before->quarantined_at << " ("
                << display_text(before->reason) << "); nothing changed\n";
    return 0;
  }
  if (o.dry_run) {
    CardRecord would = before ? *before : CardRecord{};
    would.address = addr->str();
    would.quarantined = true;
    would.reason = recorded ? before->reason : o.reason;
    if (!print_document(std::cout, o.card_out, card_doc(root, *addr, &would, true, true, *plan))) {
      if (!recorded)
        std::cout << "would record " << addr->str() << " as quarantined (" << display_text(o.reason)
                  << ") in " << kCardsFile << ", so no tenant gets it\n";
      std::cout << plan_commands(*plan) << "dry run: nothing was changed\n";
    }
    return 0;
  }
  // The record first: should the unbind stop half-way, tenants stay off the card.
  if (!recorded) {
    CardRecord& r = card_record(*cards, addr->str());
    r.quarantined = true;
    r.reason = o.reason;
    r.quarantined_at = format_rfc3339(Clock::now());
    if (auto st = write_cards(root, *cards); !st)
      return fail(st.error().with_context("quarantine"));
    progress << "recorded " << addr->str() << " as quarantined in " << kCardsFile << "\n";
  }
  if (!plan->empty())
    if (auto st = execute_plan(root, *plan, progress); !st) return fail(st.error());
  const CardRecord* now = find_card(*cards, addr->str());
  if (!print_document(std::cout, o.card_out, card_doc(root, *addr, now, false, true, *plan))) {
    FunctionState st = read_function_state(root, *addr);
    std::cout << addr->str() << " quarantined: " << describe(st)
              << "; KubeVirt's device plugin no longer offers it and the QEMU provider skips "
                 "it. After the reset or burn-in: factory host release --pci "
              << addr->str() << "\n";
  }
  return 0;
}

int release(const HostOptions& o) {
  HostRoot root(o.root);
  auto addr = one_card(o);
  if (!addr) return fail(addr.error());
  const uid_t euid = o.euid ? *o.euid : root.is_real() ? ::geteuid() : 0;
  if (!o.dry_run)
    if (auto st = require_root(euid, "release"); !st) return fail(st.error());
  auto ids = find_pci_ids(root, o.pci_ids);
  if (!ids) return fail(ids.error());
  const PciIds* idp = ids->has_value() ? &**ids : nullptr;
  auto cards = read_cards(root);
  if (!cards) return fail(cards.error());
  const CardRecord* before = find_card(*cards, addr->str());
  const bool recorded = before && before->quarantined;
  auto plan = plan_bind(root, {*addr}, idp);
  if (!plan) return fail(plan.error().with_context("release"));
  const bool table = o.card_out == OutputFormat::table;
  std::ostream& progress = table ? std::cout : std::cerr;
  if (!recorded && plan->empty()) {
    if (!print_document(std::cout, o.card_out,
                        card_doc(root, *addr, before, o.dry_run, false, *plan)))
      std::cout << addr->str()
                << ": not quarantined, and on vfio-pci for tenants; nothing changed\n";
    return 0;
  }
  if (o.dry_run) {
    CardRecord would = before ? *before : CardRecord{};
    would.address = addr->str();
    would.quarantined = false;
    if (!print_document(std::cout, o.card_out, card_doc(root, *addr, &would, true, true, *plan))) {
      std::cout << plan_commands(*plan);
      if (recorded)
        std::cout << "then would mark " << addr->str() << " released in " << kCardsFile
                  << " (its faults until now become history)\n";
      std::cout << "dry run: nothing was changed\n";
    }
    return 0;
  }
  // Back on vfio-pci first; only then is the card offered again.
  if (!plan->empty())
    if (auto st = execute_plan(root, *plan, progress); !st) return fail(st.error());
  CardRecord& r = card_record(*cards, addr->str());
  r.quarantined = false;
  r.released_at = format_rfc3339(Clock::now());
  if (auto st = write_cards(root, *cards); !st) return fail(st.error().with_context("release"));
  if (!print_document(std::cout, o.card_out, card_doc(root, *addr, &r, false, true, *plan)))
    std::cout << addr->str() << " released: " << describe(read_function_state(root, *addr))
              << "; tenants may get it again\n";
  return 0;
}

// A GPU of a tenant's health sample that needs the admin now (the card
// fault rules of coordinator/agents/card_faults.hpp, judged by number).
bool card_fault_now(const json& g) {
  if (!g.is_object()) return false;
  if (g.value("lost", false) == true) return true;
  if (g.contains("remapped_rows_failure") && g["remapped_rows_failure"] == true) return true;
  for (const auto& x : g.value("xids", json::array()))
    if (x.is_object() && x.contains("xid") && x["xid"].is_number_integer() &&
        gpu::xid_faults_card(x["xid"].get<int>()))
      return true;
  return false;
}

std::string text_of(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_string()) return "";
  return j[key].get<std::string>();
}

// The GPUs of a tenant's latest health sample (none when it has none).
json guest_gpus(const json& tenant) {
  if (!tenant.is_object() || !tenant.contains("health") || !tenant["health"].is_object())
    return json::array();
  json gpu = tenant["health"].value("gpu", json::object());
  json gs = gpu.is_object() ? gpu.value("gpus", json::array()) : json::array();
  return gs.is_array() ? gs : json::array();
}

// The newest fault a tenant recorded for this card (by UUID; any of the
// tenant's faults when it has one card whose UUID is not known), or null.
json newest_fault(const json& tenants, const std::string& uuid, const std::string& only_tenant) {
  json best;
  for (const auto& t : tenants) {
    if (!only_tenant.empty() && text_of(t, "name") != only_tenant) continue;
    const json& book = t.value("gpu_faults", json::object());
    if (!book.is_object()) continue;
    for (auto& [key, f] : book.items()) {
      if (!f.is_object()) continue;
      if (!uuid.empty() && text_of(f, "uuid") != uuid) continue;
      if (uuid.empty() && only_tenant.empty()) continue;
      if (best.is_null() || text_of(f, "first_seen") > text_of(best, "first_seen")) {
        best = f;
        best["tenant"] = text_of(t, "name");
      }
    }
  }
  return best;
}

int gpus(const HostOptions& o, const GlobalOptions& g) {
  HostRoot root(o.root);
  auto ids = find_pci_ids(root, o.pci_ids);
  if (!ids) return fail(ids.error());
  const PciIds* idp = ids->has_value() ? &**ids : nullptr;
  PciBus bus(root);
  auto inv = take_inventory(bus, idp);
  if (!inv) return fail(inv.error().with_context("reading the host's PCI devices"));
  auto cards = read_cards(root);
  if (!cards) return fail(cards.error());
  std::string node = op::host_node_name(root).value_or("");

  // The coordinator's view: tenants, what their guests report, which host
  // cards a QEMU tenant holds. Without it the host's own view is shown.
  json tenants = json::array();
  std::string coordinator_error;
  auto list = call_coordinator(g, "GET", "/v1/tenants");
  if (!list) {
    coordinator_error = list.error().message;
  } else {
    for (const auto& t : list->value("tenants", json::array())) {
      auto one = call_coordinator(g, "GET", "/v1/tenants/" + text_of(t, "name"));
      tenants.push_back(one ? *one : t);
    }
  }
  std::map<std::string, std::string> held;  // host address -> tenant (QEMU)
  std::map<std::string, const json*> holder;
  bool kubevirt_here = false;
  for (const auto& t : tenants) {
    const json& vm = t.value("vm", json::object());
    if (!vm.is_object()) continue;
    if (text_of(vm, "provider") == "qemu") {
      for (const auto& a : vm.value("gpus", json::array()))
        if (a.is_string()) {
          held[a.get<std::string>()] = text_of(t, "name");
          holder[a.get<std::string>()] = &t;
        }
    } else if (!vm.value("gpus", json::array()).empty() || text_of(vm, "node") == node ||
               text_of(vm, "provider") == "kubevirt") {
      kubevirt_here |= text_of(vm, "node").empty() || text_of(vm, "node") == node;
    }
  }

  json rows = json::array();
  bool learnt = false;
  for (const auto& gr : inv->nvidia) {
    if (!gr.fn.is_display()) continue;
    const std::string addr = gr.fn.address.str();
    CardRecord* rec = nullptr;
    for (auto& c : *cards)
      if (c.address == addr) rec = &c;
    json row = {{"node", node},
                {"pci_address", addr},
                {"model", gr.name.value_or(gr.fn.vendor_id() + ":" + gr.fn.device_id())},
                {"resource", gr.resource.name},
                {"driver", gr.fn.driver.empty() ? "none" : gr.fn.driver},
                {"uuid", rec ? rec->uuid : ""},
                {"serial", rec ? rec->serial : ""},
                {"tenant", ""},
                {"last_fault", nullptr}};
    const bool passthrough =
        gr.fn.driver == "vfio-pci" && gr.override_driver && *gr.override_driver == "vfio-pci";
    std::string state = passthrough ? (kubevirt_here ? "pool" : "free") : "host";
    bool active = false;
    if (auto h = held.find(addr); h != held.end()) {
      row["tenant"] = h->second;
      state = "in-use";
      const json& t = *holder[addr];
      const json gs = guest_gpus(t);
      const json vm_gpus = t.value("vm", json::object()).value("gpus", json::array());
      // Which guest GPU is this card: certain only when the tenant has one.
      if (vm_gpus.size() == 1 && gs.size() == 1) {
        const json& gg = gs[0];
        if (!text_of(gg, "uuid").empty()) {
          row["uuid"] = text_of(gg, "uuid");
          row["serial"] = text_of(gg, "serial");
          CardRecord& r = card_record(*cards, addr);
          if (r.uuid != text_of(gg, "uuid") || r.serial != text_of(gg, "serial")) {
            r.uuid = text_of(gg, "uuid");
            r.serial = text_of(gg, "serial");
            learnt = true;
          }
          rec = &r;
        }
        active = card_fault_now(gg);
      } else {
        for (const auto& gg : gs) active |= card_fault_now(gg);
      }
      json f = newest_fault(tenants, text_of(row, "uuid"),
                            text_of(row, "uuid").empty() && vm_gpus.size() == 1 ? h->second : "");
      if (!f.is_null()) row["last_fault"] = f;
    } else if (!text_of(row, "uuid").empty()) {
      json f = newest_fault(tenants, text_of(row, "uuid"), "");
      if (!f.is_null()) row["last_fault"] = f;
    }
    // Faulted: a card fault in its guest now, or one recorded since its last release.
    const json& lf = row["last_fault"];
    const bool since_release = !lf.is_null() && (!rec || rec->released_at.empty() ||
                                                 text_of(lf, "first_seen") > rec->released_at);
    if (active || since_release) state = "faulted";
    if (rec && rec->quarantined) {
      state = "quarantined";
      row["reason"] = rec->reason;
      row["quarantined_at"] = rec->quarantined_at;
    }
    row["state"] = state;
    rows.push_back(std::move(row));
  }
  // The cards of tenants whose host address the API does not give
  // (KubeVirt: the device plugin chose it; docs/gpu-faults.md says how the
  // admin finds it), by node, model and UUID.
  for (const auto& t : tenants) {
    const json& vm = t.value("vm", json::object());
    if (vm.is_object() && text_of(vm, "provider") == "qemu") continue;
    for (const auto& gg : guest_gpus(t)) {
      json row = {{"node", vm.is_object() ? text_of(vm, "node") : ""},
                  {"pci_address", ""},
                  {"model", text_of(gg, "name")},
                  {"resource", ""},
                  {"driver", ""},
                  {"uuid", text_of(gg, "uuid")},
                  {"serial", text_of(gg, "serial")},
                  {"tenant", text_of(t, "name")},
                  {"guest_pci_bus_id", text_of(gg, "pci_bus_id")},
                  {"last_fault", nullptr}};
      json f = newest_fault(tenants, text_of(gg, "uuid"), "");
      if (!f.is_null()) row["last_fault"] = f;
      row["state"] = card_fault_now(gg) ? "faulted" : "in-use";
      rows.push_back(std::move(row));
    }
  }
  // What a guest said a card is, kept for when its tenant has moved on
  // (best effort: a reader without write access learns nothing).
  if (learnt) (void)write_cards(root, *cards);

  json doc = {{"gpus", rows}};
  if (!coordinator_error.empty()) doc["coordinator_error"] = coordinator_error;
  if (print_document(std::cout, o.card_out, doc)) return 0;
  if (!coordinator_error.empty())
    std::cerr << "factory: the coordinator did not answer (" << display_text(coordinator_error)
              << "): tenants and faults are not shown\n";
  std::vector<std::vector<std::string>> table;
  std::vector<std::string> fixes;
  for (const auto& r : rows) {
    std::string fault = "-";
    const json& lf = r["last_fault"];
    if (lf.is_object()) {
      fault = text_of(lf, "code") + " " + text_of(lf, "first_seen");
      if (r["state"] == "faulted" && !text_of(lf, "fix").empty())
        fixes.push_back(text_of(r, "pci_address").empty()
                            ? text_of(r, "uuid") + ": " + text_of(lf, "fix")
                            : text_of(r, "pci_address") + ": " + text_of(lf, "fix"));
    }
    std::string state = text_of(r, "state");
    if (state == "quarantined") state += " (" + text_of(r, "reason") + ")";
    auto dash = [](const std::string& s) { return s.empty() ? std::string("-") : s; };
    table.push_back({dash(text_of(r, "node")), dash(text_of(r, "pci_address")),
                     dash(text_of(r, "model")), dash(text_of(r, "uuid")),
                     dash(text_of(r, "tenant")), display_text(state), display_text(fault)});
  }
  if (table.empty()) {
    std::cout << "No NVIDIA GPU on this host, and no tenant reports one.\n";
    return 0;
  }
  print_table(std::cout, {"node", "pci address", "model", "uuid", "tenant", "state", "last fault"},
              table);
  for (const auto& f : fixes) std::cout << "fix " << display_text(f) << "\n";
  return 0;
}

// ---- bind --via gpu-operator ----

// The GPU Operator's ClusterPolicy (cluster-scoped; in the kube module's table).
const kube::Kind kClusterPolicy{"nvidia.com/v1", "ClusterPolicy"};

json gpus_doc(const op::HostHandover& h) {
  json out = json::array();
  for (const auto& g : h.gpus)
    out.push_back({{"address", g.address.str()},
                   {"id", g.id},
                   {"name", g.name},
                   {"driver", g.driver.empty() ? "none" : g.driver},
                   {"resourceName", g.resource.name}});
  return out;
}

std::string every_gpu_sentence(const std::string& node, const op::HostHandover& h) {
  std::string list;
  for (const auto& g : h.gpus)
    list += (list.empty() ? "" : ", ") + g.address.str() + " (" + g.id +
            (g.name.empty() ? "" : " " + g.name) + ")";
  return "this mode takes every GPU of node " + node + ": the GPU Operator's vfio-manager binds " +
         (h.gpus.size() == 1 ? std::string("its one NVIDIA GPU")
                             : "all " + std::to_string(h.gpus.size()) + " NVIDIA GPUs") +
         " to vfio-pci, per node, not per card: " + list;
}

// The expected resource per card model: the name (by the plugin's rule,
// from this host's pci.ids) and how many cards of it.
std::map<std::string, std::pair<std::string, long long>> expected_resources(
    const op::HostHandover& h) {
  std::map<std::string, std::pair<std::string, long long>> out;  // selector -> name, count
  for (const auto& g : h.gpus) {
    std::string sel = g.id;
    for (auto& c : sel) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    auto& e = out[sel];
    e.first = g.resource.name;
    ++e.second;
  }
  return out;
}

struct Reading {
  op::Observation obs;
  std::string summary;
};

Result<Reading> read_cluster(kube::KubeClient& client, const std::string& node,
                             std::map<std::string, int>& logged_restarts) {
  Reading r;
  auto policies = client.list(kClusterPolicy, "");
  // No such kind: the GPU Operator's CRD is not installed (no ClusterPolicy).
  if (!policies && policies.error().code != Errc::not_found) return policies.error();
  r.obs.policy = op::read_policy(policies ? *policies : json::object());
  auto n = client.get(kube::kNode, "", node);
  if (!n) return n.error();
  r.obs.node = std::move(*n);
  auto pods = client.list(kube::kPod, "", {.field_selector = "spec.nodeName=" + node});
  if (!pods) return pods.error();
  r.obs.pods = op::read_operand_pods(*pods);
  for (const auto& p : r.obs.pods) {
    r.summary += (r.summary.empty() ? "" : ", ") + p.operand + " " + p.state;
    if (!p.failing) continue;
    // A crash-looping container's reason is in its previous instance's log;
    // read it again only when it restarted since.
    const std::string key = p.name + "/" + p.failing->container;
    if (logged_restarts.count(key) && logged_restarts[key] == p.failing->restarts) continue;
    auto log =
        kube::pod_log(client.access(), p.ns, p.name,
                      {.container = p.failing->container, .previous = true, .tail_lines = 20});
    if (!log)
      log = kube::pod_log(client.access(), p.ns, p.name,
                          {.container = p.failing->container, .tail_lines = 20});
    if (log) r.obs.logs[key] = *log;
    logged_restarts[key] = p.failing->restarts;
  }
  auto adv = op::advertised(r.obs.node);
  std::string a;
  for (const auto& [k, v] : adv) a += (a.empty() ? "" : ", ") + k + ": " + std::to_string(v);
  r.summary = (r.summary.empty() ? std::string("no operand pods on the node yet") : r.summary) +
              "; node advertises " + (a.empty() ? std::string("no GPU yet") : a);
  return r;
}

int bind_via_gpu_operator(const HostOptions& o) {
  auto timeout = parse_duration(o.wait_timeout);
  if (!timeout) return fail(timeout.error().with_context("--wait-timeout"));
  const auto poll = std::chrono::milliseconds(std::max(10, o.poll_ms));
  if (!o.pci.empty())
    return fail(Error(Errc::invalid_argument,
                      "--pci and --via gpu-operator do not go together: the operator binds every "
                      "GPU of the node; drop --pci, or bind per card with driverctl (--via "
                      "driverctl)"));
  HostRoot root(o.root);
  std::string node = o.node;
  if (node.empty()) {
    auto h = op::host_node_name(root);
    if (!h)
      return fail(
          Error(Errc::invalid_argument, "cannot tell this host's node name: pass --node NODE"));
    node = *h;
  }
  auto ids = find_pci_ids(root, o.pci_ids);
  if (!ids) return fail(ids.error());
  auto host = op::read_host(root, ids->has_value() ? &**ids : nullptr);
  if (!host) return fail(host.error().with_context("host inventory"));
  if (host->gpus.empty())
    return fail(Error(Errc::failed_precondition,
                      "no NVIDIA GPU on this host: run factory host bind --via gpu-operator on "
                      "the GPU node (its sysfs is what the operator will bind)"));
  const bool table = o.bind_out == OutputFormat::table;
  std::ostream& progress = table ? std::cout : std::cerr;
  const std::string every = every_gpu_sentence(node, *host);
  progress << display_text(every) << "\n";
  if (!host->in_use.empty()) {
    for (size_t i = 0; i + 1 < host->in_use.size(); ++i)
      std::cerr << "factory: " << display_text(host->in_use[i]) << "\n";
    return fail(Error(Errc::failed_precondition,
                      host->in_use.back() +
                          ": bind --via gpu-operator refuses, since the operator would take it "
                          "from the host with the node's other GPUs; free it first, or bind "
                          "other cards per card with factory host bind --pci ADDRESS"));
  }
  if (host->host_driver) {
    std::vector<std::string> on_nvidia;
    for (const auto& g : host->gpus)
      if (g.driver == "nvidia") on_nvidia.push_back(g.address.str());
    return fail(Error(Errc::failed_precondition, op::host_driver_loaded(node, on_nvidia).line()));
  }

  auto client = kube::connect(o.access);
  if (!client) return fail(client.error());
  std::map<std::string, int> logged;
  auto first = read_cluster(*client, node, logged);
  if (!first) {
    if (first.error().code == Errc::not_found &&
        first.error().message.find("nodes") != std::string::npos)
      return fail(Error(Errc::not_found, "the host cluster has no node " + node +
                                             ": pass --node with its name (kubectl get nodes)"));
    return fail(first.error());
  }
  const bool labelled = op::is_labelled(first->obs.node);
  if (auto d = op::policy_problem(first->obs.policy, node, labelled))
    return fail(Error(Errc::failed_precondition, d->line()));

  json change = {
      {"apiVersion", "v1"},
      {"kind", "Node"},
      {"metadata",
       {{"name", node},
        {"labels", {{std::string(op::kWorkloadLabel), std::string(op::kVmPassthrough)}}}}}};
  json doc = {
      {"via", "gpu-operator"},
      {"node", node},
      {"dryRun", o.dry_run},
      {"clusterPolicy",
       {{"name", first->obs.policy.name},
        {"sandboxWorkloads",
         {{"enabled", first->obs.policy.sandbox_enabled}, {"mode", first->obs.policy.mode}}}}},
      {"takesEveryGpu", true},
      {"note", every},
      {"gpus", gpus_doc(*host)},
      {"alreadyLabelled", labelled},
      {"change", labelled ? json(nullptr) : change}};
  const std::string label = std::string(op::kWorkloadLabel) + "=" + std::string(op::kVmPassthrough);
  if (o.dry_run) {
    // The API server checks the patch (dryRun=All) and stores nothing.
    if (!labelled)
      if (auto w = client->merge_patch(kube::kNode, "", node, op::label_patch(), {.dry_run = true});
          !w)
        return fail(w.error());
    if (!print_document(std::cout, o.bind_out, doc)) {
      std::cout << (labelled ? "node " + node + " is already labelled " + label
                             : "would label node " + node + " " + label)
                << "\n"
                << "then wait for the GPU Operator's sandbox validator and for the node to "
                   "advertise the GPUs\n"
                << "dry run: nothing was changed\n";
    }
    return 0;
  }
  if (!labelled) {
    auto w = client->merge_patch(kube::kNode, "", node, op::label_patch());
    if (!w) return fail(w.error());
    progress << "labelled node " << display_text(node) << " " << label << "\n";
  } else {
    progress << "node " << display_text(node) << " is already labelled " << label << "\n";
  }

  // Bounded wait, with a line each time the picture changes.
  const auto want = expected_resources(*host);
  const auto deadline = std::chrono::steady_clock::now() + *timeout;
  std::string last_summary;
  std::optional<Reading> last;
  for (;;) {
    auto r = read_cluster(*client, node, logged);
    if (!r) return fail(r.error());
    if (r->summary != last_summary) {
      progress << "waiting: " << display_text(r->summary) << "\n";
      last_summary = r->summary;
    }
    bool validator_ready = false, plugin_ready = false;
    int validator_restarts = 0;
    for (const auto& p : r->obs.pods) {
      if (p.operand == "sandbox-validator") {
        validator_ready = p.ready;
        if (p.failing) validator_restarts = p.failing->restarts;
      }
      if (p.operand == "sandbox-device-plugin") plugin_ready = p.ready;
    }
    auto adv = op::advertised(r->obs.node);
    bool all = validator_ready;
    for (const auto& [sel, e] : want)
      if (!adv.count(e.first) || adv[e.first] < e.second) all = false;
    if (all) {
      json advd = json::object();
      for (const auto& [k, v] : adv) advd[k] = v;
      doc["validatorReady"] = true;
      doc["advertised"] = advd;
      doc["change"] = change;
      doc["alreadyLabelled"] = labelled;
      if (!print_document(std::cout, o.bind_out, doc)) {
        for (const auto& [sel, e] : want)
          std::cout << display_text(node) << "  " << e.first << ": " << adv[e.first]
                    << " (advertised by the GPU Operator's device plugin)\n";
        std::cout << "next: factory kubevirt allowlist (it marks these entries "
                     "externalResourceProvider: true)\n";
      }
      return 0;
    }
    auto d = op::diagnose(r->obs, node);
    // The validator may fail once or twice while vfio-manager is still
    // binding; three restarts is a crash loop, not a race.
    if (d && (d->name != "sandbox-validator-crashloop" || validator_restarts >= 3))
      return fail(Error(Errc::failed_precondition, d->line()));
    if (validator_ready && plugin_ready)
      for (const auto& [sel, e] : want)
        if (auto m = op::resource_name_mismatch(node, sel, e.first, adv))
          return fail(Error(Errc::failed_precondition, m->line()));
    last = std::move(*r);
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(poll);
  }
  if (auto d = op::diagnose(last->obs, node)) return fail(Error(Errc::timeout, d->line()));
  return fail(Error(Errc::timeout,
                    "the GPU Operator did not finish handing node " + node + " over within " +
                        o.wait_timeout + " (" + last_summary +
                        "): see kubectl get pods -A -o wide --field-selector spec.nodeName=" +
                        node + ", or wait longer with --wait-timeout"));
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
  add_host_maintenance_commands(host, ctx);

  for (bool bind : {true, false}) {
    auto* m = host->add_subcommand(
        bind ? "bind" : "unbind",
        bind ? "Move cards to vfio-pci by address and keep them there across reboots "
               "(driverctl), or hand the whole node to the GPU Operator (--via gpu-operator)"
             : "Give cards back to the host driver and remove the driverctl override");
    auto* pci =
        m->add_option("--pci", opts->pci, "PCI address of a card, e.g. 0000:01:00.0 (repeatable)");
    m->add_flag("--dry-run", opts->dry_run, "Print each action and change nothing");
    const std::string verb = bind ? "bind" : "unbind";
    if (!bind) {
      pci->required();
      set_examples(
          *m, {{"factory host unbind --pci 0000:01:00.0 --dry-run",
                "what it would do (no root needed)"},
               {"factory host unbind --pci '0000:01:00.0 0000:41:00.0'", "two cards, as root"}});
      m->callback([&ctx, opts] { ctx.run = [opts] { return move_cards(*opts, false); }; });
      continue;
    }
    restrict_to(
        m->add_option("--via", opts->via,
                      "driverctl: bind the --pci cards here; gpu-operator: label the node "
                      "nvidia.com/gpu.workload.config=vm-passthrough so the GPU Operator's "
                      "vfio-manager binds EVERY GPU of the node (needs sandboxWorkloads.enabled)"),
        {"driverctl", "gpu-operator"}, "a binding mode")
        ->capture_default_str();
    m->add_option("--node", opts->node,
                  "--via gpu-operator: this host's Kubernetes node (default: its hostname)");
    m->add_option("--wait-timeout", opts->wait_timeout,
                  "--via gpu-operator: how long to wait for the sandbox validator and the "
                  "advertised GPUs")
        ->capture_default_str();
    m->add_option("--poll-ms", opts->poll_ms, "How often the wait reads the cluster (ms)")
        ->group("");
    add_output_option(*m, opts->bind_out);
    add_kube_flags(*m, opts->access);
    set_examples(*m, {{"factory host bind --pci 0000:01:00.0 --dry-run",
                       "what it would do (no root needed)"},
                      {"factory host bind --pci '0000:01:00.0 0000:41:00.0'", "two cards, as root"},
                      {"factory host bind --via gpu-operator --dry-run -o yaml",
                       "the node label it would set, checked by the API server"},
                      {"factory host bind --via gpu-operator --node utho",
                       "hand every GPU of node utho to the GPU Operator, and wait"}});
    m->callback([&ctx, opts, pci] {
      if (opts->via == "gpu-operator") {
        ctx.run = [opts] { return bind_via_gpu_operator(*opts); };
        return;
      }
      if (pci->count() == 0)
        throw CLI::RequiredError(
            "--pci (or --via gpu-operator, which takes every GPU of the node)");
      ctx.run = [opts] { return move_cards(*opts, true); };
    });
  }

  auto* q = host->add_subcommand(
      "quarantine",
      "Take a card out of the pool after a fault: recorded, then off vfio-pci, so no new "
      "tenant gets it (as root; idempotent)");
  q->add_option("--pci", opts->pci, "PCI address of the card, e.g. 0000:01:00.0")->required();
  q->add_option("--reason", opts->reason, "Why, as the admin says it (shown in host gpus)")
      ->required();
  q->add_flag("--dry-run", opts->dry_run, "Print each action and change nothing");
  add_output_option(*q, opts->card_out);
  set_examples(*q, {{"factory host quarantine --pci 0000:01:00.0 --reason 'Xid 79' --dry-run",
                     "what it would do (no root needed)"},
                    {"factory host quarantine --pci 0000:01:00.0 --reason 'Xid 79 on tenant-1'",
                     "as root: no tenant gets the card until it is released"}});
  q->callback([&ctx, opts] { ctx.run = [opts] { return quarantine(*opts); }; });

  auto* rel = host->add_subcommand(
      "release",
      "Return a quarantined card to the pool after its reset or burn-in: back on vfio-pci, "
      "then no longer quarantined (as root; idempotent)");
  rel->add_option("--pci", opts->pci, "PCI address of the card, e.g. 0000:01:00.0")->required();
  rel->add_flag("--dry-run", opts->dry_run, "Print each action and change nothing");
  add_output_option(*rel, opts->card_out);
  set_examples(*rel, {{"factory host release --pci 0000:01:00.0 --dry-run", "what it would do"},
                      {"factory host release --pci 0000:01:00.0", "as root"}});
  rel->callback([&ctx, opts] { ctx.run = [opts] { return release(*opts); }; });

  auto* gl = host->add_subcommand(
      "gpus",
      "Every passthrough card: node, PCI address, model, UUID (once a guest saw it), tenant, "
      "state (free, in-use, faulted, quarantined; pool: KubeVirt's, holder not in its API; "
      "host: not on vfio-pci) and its last fault, with the fix");
  add_output_option(*gl, opts->card_out);
  set_examples(*gl, {{"factory host gpus", "this node's cards, with what the coordinator knows"},
                     {"factory host gpus -o json", "the same for scripts"}});
  gl->callback([&ctx, opts] { ctx.run = [&ctx, opts] { return gpus(*opts, ctx.global); }; });
}

}  // namespace factory::cli
