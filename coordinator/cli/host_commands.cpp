// `factory host ...`: runbook steps 0 and 2 for the admin on the GPU node,
// and step 2 delegated to the GPU Operator (`bind --via gpu-operator`).
#include <unistd.h>

#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include "common/durations.hpp"
#include "coordinator/cli/commands.hpp"
#include "coordinator/cli/output.hpp"
#include "coordinator/host/binder.hpp"
#include "coordinator/host/gpu_operator.hpp"
#include "coordinator/host/preflight.hpp"
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

// ---- bind --via gpu-operator ----

namespace op = factory::host::gpu_operator;
using nlohmann::json;

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
}

}  // namespace factory::cli
