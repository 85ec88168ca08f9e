// `factory kubevirt allowlist`: runbook step 3's allowlist, then the wait for
// the node to advertise the cards ("utho  nvidia.com/AD104GL_L4: 2").
#include <iostream>
#include <memory>

#include "common/durations.hpp"
#include "coordinator/cli/commands.hpp"
#include "coordinator/cli/output.hpp"
#include "coordinator/host/gpu_operator.hpp"
#include "coordinator/host/inventory.hpp"
#include "coordinator/host/pci.hpp"
#include "coordinator/host/pci_ids.hpp"
#include "coordinator/kube/client.hpp"
#include "coordinator/kubevirt/allowlist.hpp"

namespace factory::cli {
namespace {

using namespace factory::kubevirt;
using kube::AccessOptions;
using nlohmann::json;

struct AllowlistOptions {
  AccessOptions access;
  std::string ns = "kubevirt";
  std::string pci_id;
  std::string resource_name;
  std::string host_root = "/";
  std::string pci_ids;
  std::string wait_timeout = "2m";
  bool dry_run = false;
  std::string via = "auto";
  OutputFormat out = OutputFormat::table;
};

// Who advertises the cards: virt-handler (driverctl bound them), or the GPU
// Operator's device plugin on nodes handed to it. auto: the operator when a
// node carries its vm-passthrough label (`factory host bind --via
// gpu-operator` sets it), since KubeVirt's flag is per model, cluster-wide.
Result<std::pair<bool, std::string>> external_provider(kube::KubeClient& client,
                                                       const std::string& via) {
  namespace op = factory::host::gpu_operator;
  if (via == "driverctl") return std::pair<bool, std::string>{false, "--via driverctl"};
  if (via == "gpu-operator") return std::pair<bool, std::string>{true, "--via gpu-operator"};
  const std::string selector =
      std::string(op::kWorkloadLabel) + "=" + std::string(op::kVmPassthrough);
  auto nodes = client.list(kube::kNode, "", {.label_selector = selector});
  if (!nodes) return nodes.error();
  std::string names;
  for (const auto& n : (*nodes)["items"])
    names += (names.empty() ? "" : ", ") + n["metadata"].value("name", "");
  if (names.empty()) return std::pair<bool, std::string>{false, "no node is labelled " + selector};
  return std::pair<bool, std::string>{
      true, "node " + names + " " + ((*nodes)["items"].size() > 1 ? "are" : "is") + " labelled " +
                selector + " (the GPU Operator binds and advertises its GPUs)"};
}

// The models to allowlist: from the flags, or from this host's inventory.
Result<std::vector<GpuModel>> choose_models(const AllowlistOptions& o) {
  host::HostRoot root(o.host_root);
  if (!o.pci_id.empty()) {
    std::string resource = o.resource_name;
    if (resource.empty()) {
      // Name it as NVIDIA's device plugin would, from this machine's pci.ids.
      auto ids = host::find_pci_ids(root, o.pci_ids);
      if (!ids) return ids.error();
      if (!ids->has_value())
        return Error(Errc::invalid_argument,
                     "no pci.ids on this machine to name " + o.pci_id +
                         " by: pass --resource-name (e.g. nvidia.com/AD104GL_L4)");
      auto check = model_from_flags(o.pci_id, "nvidia.com/x");
      if (!check) return check.error();
      uint16_t device = static_cast<uint16_t>(std::stoul(o.pci_id.substr(5), nullptr, 16));
      resource = host::kubevirt_resource_name(&**ids, device).name;
    }
    auto m = model_from_flags(o.pci_id, resource);
    if (!m) return m.error();
    return std::vector<GpuModel>{*m};
  }
  if (!o.resource_name.empty())
    return Error(Errc::invalid_argument, "--resource-name needs --pci-id (the card it names)");
  auto ids = host::find_pci_ids(root, o.pci_ids);
  if (!ids) return ids.error();
  host::PciBus bus(root);
  auto inv = host::take_inventory(bus, ids->has_value() ? &**ids : nullptr);
  if (!inv) return inv.error().with_context("host inventory");
  return models_from_inventory(*inv);
}

int allowlist(const AllowlistOptions& o) {
  auto timeout = parse_duration(o.wait_timeout);
  if (!timeout) return fail(timeout.error().with_context("--wait-timeout"));
  auto models = choose_models(o);
  if (!models) return fail(models.error());
  auto client = kube::connect(o.access);
  if (!client) return fail(client.error());
  auto mode = external_provider(*client, o.via);
  if (!mode) return fail(mode.error());
  for (auto& m : *models) m.external = mode->first;

  auto res = ensure_allowlisted(*client, o.ns, *models, o.dry_run);
  if (!res) return fail(res.error());
  const std::string cr = res->cr_namespace + "/" + res->cr_name;

  json doc = {{"kubevirt", {{"namespace", res->cr_namespace}, {"name", res->cr_name}}},
              {"dryRun", o.dry_run},
              {"via", mode->first ? "gpu-operator" : "driverctl"},
              {"added", res->merge.added},
              {"madeExternal", res->merge.updated},
              {"alreadyListed", res->merge.present},
              {"warnings", res->merge.warnings},
              {"pciHostDevices", res->merge.entries}};
  json models_doc = json::array();
  for (const auto& m : *models) {
    json jm = {{"pciVendorSelector", m.pci_vendor_selector},
               {"resourceName", m.resource_name},
               {"externalResourceProvider", m.external}};
    if (m.from_inventory) {
      jm["name"] = m.name;
      jm["onVfioPci"] = m.on_vfio;
      jm["notOnVfioPci"] = m.not_on_vfio;
    }
    models_doc.push_back(jm);
  }
  doc["models"] = models_doc;

  const bool table = o.out == OutputFormat::table;
  if (table) {
    for (const auto& m : *models)
      if (!m.note.empty()) std::cout << "note: " << m.note << "\n";
    if (mode->first)
      std::cout << "advertised by the GPU Operator's device plugin: " << display_text(mode->second)
                << "\n";
    const std::string ext = mode->first ? " (externalResourceProvider: true)" : "";
    for (const auto& a : res->merge.added)
      std::cout << "KubeVirt " << cr << ": " << (o.dry_run ? "would allowlist " : "allowlisted ")
                << a << ext << "\n";
    for (const auto& u : res->merge.updated)
      std::cout << "KubeVirt " << cr << ": " << (o.dry_run ? "would mark " : "marked ") << u << ext
                << "\n";
    for (const auto& p : res->merge.present)
      std::cout << "KubeVirt " << cr << ": " << p << " already allowlisted\n";
    for (const auto& w : res->merge.warnings) std::cout << "warning: " << w << "\n";
  }
  if (o.dry_run) {
    // The server checked the patch (dryRun=All) and stored nothing; there is
    // nothing to wait for.
    if (!print_document(std::cout, o.out, doc))
      std::cout << "dry run: the KubeVirt CR was not changed\n";
    return 0;
  }

  auto report = wait_for_advertised(
      *client, o.ns, *models, std::chrono::duration_cast<std::chrono::milliseconds>(*timeout));
  if (!report) return fail(report.error());
  json nodes = json::array();
  for (const auto& n : report->nodes)
    nodes.push_back({{"node", n.node}, {"resource", n.resource}, {"allocatable", n.allocatable}});
  doc["nodes"] = nodes;
  doc["advertised"] = report->satisfied;
  doc["problems"] = report->problems;
  if (!print_document(std::cout, o.out, doc)) {
    for (const auto& n : report->nodes)
      std::cout << n.node << "  " << n.resource << ": " << n.allocatable << "\n";
  }
  if (report->satisfied) return 0;
  // Short after the wait: one line per reason on stderr, and a failure exit,
  // so a script does not go on to create VMs that can never schedule.
  for (size_t i = 0; i + 1 < report->problems.size(); ++i)
    std::cerr << "factory: " << report->problems[i] << "\n";
  return fail(Error(Errc::failed_precondition, report->problems.empty()
                                                   ? "the cards are not advertised"
                                                   : report->problems.back()));
}

}  // namespace

void add_kubevirt_commands(CLI::App& app, Context& ctx) {
  auto* kv = app.add_subcommand("kubevirt", "The host cluster's KubeVirt: GPU allowlist");
  kv->require_subcommand(1);
  auto o = std::make_shared<AllowlistOptions>();
  auto* a = kv->add_subcommand(
      "allowlist",
      "Allow this host's GPU models in the KubeVirt CR (permittedHostDevices.pciHostDevices) and "
      "wait until a node advertises them");
  a->add_flag("--dry-run", o->dry_run,
              "Show the change and have the API server check it (dryRun=All); change nothing");
  a->add_option("--pci-id", o->pci_id,
                "Card model as VENDOR:DEVICE (e.g. 10de:27b8) instead of this host's inventory");
  a->add_option("--resource-name", o->resource_name,
                "Resource name for --pci-id (default: from pci.ids, as NVIDIA's device plugin "
                "names it, e.g. nvidia.com/AD104GL_L4)");
  a->add_option("--namespace,-n", o->ns, "Namespace of the KubeVirt CR")
      ->capture_default_str()
      ->check(namespace_rule());
  restrict_to(
      a->add_option("--via", o->via,
                    "Who advertises the cards: driverctl (virt-handler does), gpu-operator (its "
                    "device plugin does: externalResourceProvider: true), or auto (gpu-operator "
                    "when a node is labelled nvidia.com/gpu.workload.config=vm-passthrough)"),
      {"auto", "driverctl", "gpu-operator"}, "a binding mode")
      ->capture_default_str();
  a->add_option("--wait-timeout", o->wait_timeout,
                "How long to wait for a node to advertise the cards")
      ->capture_default_str();
  a->add_option("--host-root", o->host_root,
                "Read the host inventory (sysfs, pci.ids) under DIR instead of / (tests)")
      ->capture_default_str();
  a->add_option("--pci-ids", o->pci_ids, "pci.ids file naming the cards");
  add_kube_flags(*a, o->access);
  add_output_option(*a, o->out);
  set_examples(*a, {{"factory kubevirt allowlist", "this host's cards, then wait for the node"},
                    {"factory kubevirt allowlist --dry-run", "the change, checked by the server"},
                    {"factory kubevirt allowlist --pci-id 10de:27b8 --kubeconfig ~/.kube/config",
                     "one model, named by its PCI id"}});
  a->callback([&ctx, o] { ctx.run = [o] { return allowlist(*o); }; });
}

}  // namespace factory::cli
