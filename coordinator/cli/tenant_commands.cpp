// `factory tenant create|list|show|delete|retry|restart|upgrade|credentials`: the admin's side of
// TenantService, through the coordinator's API (AdminClient). The one
// exception is `create --dry-run`, which contacts nothing: it builds the
// KubeVirt provider's objects here (coordinator/kubevirt/objects.hpp), from
// the catalog and the config file alone.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <thread>

#include "common/atomic_file.hpp"
#include "common/durations.hpp"
#include "common/net/url.hpp"
#include "common/yaml_json.hpp"
#include "coordinator/catalog/source.hpp"
#include "coordinator/cli/admin_client.hpp"
#include "coordinator/cli/commands.hpp"
#include "coordinator/cli/output.hpp"
#include "coordinator/config/coordinator_config.hpp"
#include "coordinator/enroll/tenant_name.hpp"
#include "coordinator/kubevirt/objects.hpp"
#include "coordinator/tenants/cloud_init.hpp"
#include "coordinator/tenants/k8s_names.hpp"
#include "coordinator/tenants/progress.hpp"
#include "coordinator/tenants/request.hpp"
#include "coordinator/tenants/tenant_objects.hpp"
#include "coordinator/tenants/vm_spec.hpp"

namespace factory::cli {
namespace {

using nlohmann::json;
using namespace factory::tenants;
namespace fs = std::filesystem;

struct CreateOptions {
  std::string name, tier, cpu, memory, disk, image, gpu_resource, ns, catalog_file, project;
  int gpus = 1;
  CLI::Option* gpus_opt = nullptr;
  std::vector<std::string> ssh_keys;
  std::vector<std::string> models;
  int ssh_node_port = 0;
  bool wait = false, dry_run = false;
  std::string timeout = "30m";
  std::string poll = "1s";
  OutputFormat out = OutputFormat::table;
  CLI::Option* out_opt = nullptr;
};

std::string str(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) return "";
  return j[key].is_string() ? j[key].get<std::string>() : j[key].dump();
}

// The admin's public keys: --ssh-key files, else the first of the usual
// ~/.ssh/*.pub, as ssh-copy-id picks them; none for a tier without login
// (a model endpoint) unless --ssh-key asks for key-only login.
Result<std::vector<std::string>> ssh_keys(const CreateOptions& o, bool tier_has_login) {
  std::vector<std::string> files = o.ssh_keys;
  if (files.empty() && !tier_has_login) return std::vector<std::string>{};
  if (files.empty()) {
    const char* home = std::getenv("HOME");
    std::vector<std::string> tried;
    for (const char* f : {"id_ed25519.pub", "id_ecdsa.pub", "id_rsa.pub"}) {
      fs::path p = fs::path(home ? home : "/") / ".ssh" / f;
      tried.push_back(p.string());
      if (fs::exists(p)) {
        files.push_back(p.string());
        break;
      }
    }
    if (files.empty()) {
      std::string list;
      for (const auto& t : tried) list += (list.empty() ? "" : ", ") + t;
      return Error(Errc::invalid_argument,
                   "no SSH public key for the ubuntu user: pass --ssh-key FILE (none of " + list +
                       " exists)");
    }
  }
  std::vector<std::string> keys;
  for (const auto& f : files) {
    auto text = read_file(f);
    if (!text) return text.error().with_context("--ssh-key " + f);
    if (text->find("PRIVATE KEY") != std::string::npos)
      return Error(Errc::invalid_argument,
                   "--ssh-key " + f + " is a private key: give the .pub file beside it");
    auto parsed = parse_ssh_public_keys(*text, "--ssh-key " + f);
    if (!parsed) return parsed.error();
    keys.insert(keys.end(), parsed->begin(), parsed->end());
  }
  return keys;
}

// Whether the tier lets anyone log in, as far as this machine's catalog
// (the config's, else the built-in one) says; a tier it does not know is
// taken to have login, and the coordinator's catalog decides.
bool tier_has_login(const Context& ctx, const CreateOptions& o) {
  auto cat = catalog::load_configured(o.catalog_file, ctx.global.config_path);
  if (!cat) return true;
  const catalog::Tier* t = cat->find(o.tier);
  return t == nullptr || t->access.login;
}

Result<TenantRequest> build_request(const Context& ctx, const CreateOptions& o) {
  // The name first: it is the most likely typo, and says so before anything
  // else is read.
  if (auto st = enroll::validate_tenant_name(o.name); !st.ok())
    return st.error().with_context("tenant name");
  if (auto st = validate_vm_name(o.name); !st.ok()) return st.error();
  if (o.ssh_node_port != 0)
    if (auto st = validate_node_port(o.ssh_node_port); !st.ok()) return st.error();
  TenantRequest r;
  r.name = o.name;
  r.tier = o.tier;
  if (o.gpus_opt && o.gpus_opt->count() > 0) {
    // Checked here too, so a typo is refused before the coordinator is asked.
    if (o.gpus < 0 || o.gpus > kMaxGpusPerVm)
      return Error(Errc::invalid_argument, "--gpus " + std::to_string(o.gpus) +
                                               " is out of range: want 0-" +
                                               std::to_string(kMaxGpusPerVm));
    r.gpus = o.gpus;
  }
  r.cpu = o.cpu;
  r.memory = o.memory;
  r.disk = o.disk;
  r.image = o.image;
  r.gpu_resource = o.gpu_resource;
  r.project = o.project;
  r.ns = o.ns;
  r.ssh_node_port = o.ssh_node_port;
  for (const auto& m : o.models)
    if (auto st = validate_model_name(m); !st.ok()) return st.error().with_context("--model");
  r.models = o.models;
  auto keys = ssh_keys(o, tier_has_login(ctx, o));
  if (!keys) return keys.error();
  r.ssh_authorized_keys = *keys;
  return r;
}

// --dry-run: every object create would make, with the secrets it would
// generate shown as the marked placeholders of cloud_init.hpp.
int dry_run(const Context& ctx, const CreateOptions& o) {
  auto cfg = load_config(ctx.global);
  if (!cfg) return fail(cfg.error());
  auto cat = catalog::load_configured(o.catalog_file, ctx.global.config_path);
  if (!cat) return fail(cat.error());
  auto req = build_request(ctx, o);
  if (!req) return fail(req.error());
  auto vm = resolve_vm_spec(*cat, *req, cfg->kube_namespace, /*fill_gpu_placeholder=*/true);
  if (!vm) return fail(vm.error());
  const catalog::Tier* tier = cat->find(vm->tier);
  CloudInitParams p;
  p.tenant = vm->name;
  p.hostname = vm->name;
  p.ssh_authorized_keys = req->ssh_authorized_keys;
  p.login = tier == nullptr || tier->access.login;
  p.password = p.login ? std::string(kPasswordPlaceholder) : std::string();
  p.coordinator_url = cfg->external_url;
  p.agent_binary_url = cfg->agents_https_url() + "/v1/agent/binary";
  p.ca_pem = kCaPemPlaceholder;
  p.bootstrap_token = kBootstrapTokenPlaceholder;
  p.agent_sha256 = kAgentSha256Placeholder;
  auto ud = render_user_data(p);
  if (!ud) return fail(ud.error());
  auto objects = kubevirt::tenant_objects(*vm, ud->text);
  // With tenants.source: kubernetes the coordinator writes the tenant's
  // Tenant before anything else (TenantService::create_with_object): first
  // here too, as the coordinator would write it.
  const bool with_tenant = cfg->tenants_from_kubernetes();
  if (with_tenant) objects.insert(objects.begin(), api_tenant_object(*req, vm->ns));

  if (o.out == OutputFormat::json) {
    std::cout << json{{"apiVersion", "v1"}, {"kind", "List"}, {"items", objects}}.dump(2) << "\n";
    return 0;
  }
  std::string placeholders;
  for (const auto& n : ud->placeholders) placeholders += (placeholders.empty() ? "" : ", ") + n;
  std::cout << "# factory tenant create " << vm->name << " --dry-run: the objects it would "
            << "create, in order.\n"
            << "# Nothing was contacted and nothing was stored.\n"
            << "# The Namespace is created only if it is missing.\n";
  if (with_tenant)
    std::cout << "# The Tenant first: tenants.source is kubernetes, so the coordinator writes it "
              << "before the rest (the password is never in it).\n";
  std::cout << "# PLACEHOLDERS, filled in when the coordinator creates the tenant:\n"
            << "#   in the Secret's user-data: " << placeholders << " (each written <...>)\n";
  if (vm->endpoint_port != 0)
    std::cout << "#   in Secret " << kubevirt::api_key_secret_name(vm->name)
              << ": the endpoint's API key (`factory tenant credentials " << vm->name
              << "` prints it)\n";
  if (vm->gpu_resource == kAnyAllowlistedGpuPlaceholder)
    std::cout << "#   deviceName " << kAnyAllowlistedGpuPlaceholder << ": tier " << vm->tier
              << " takes any allowlisted GPU; the coordinator picks one with a free card "
              << "(or pass --gpu-resource)\n";
  for (const auto& obj : objects) std::cout << "---\n" << to_yaml(obj);
  return 0;
}

// Polls the tenant until it is ready (0), failed (1) or the time is up.
int wait_for(const AdminClient& client, const std::string& name, std::chrono::seconds timeout,
             std::chrono::milliseconds poll, std::ostream& os) {
  const auto start = std::chrono::steady_clock::now();
  json before;
  std::string last_error;
  auto stamp = [&] {
    auto s =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - start);
    std::string t = format_duration(s);
    return "[" + std::string(t.size() < 6 ? 6 - t.size() : 0, ' ') + t + "] " + name + ": ";
  };
  while (true) {
    auto r = client.call("GET", api_path({"v1", "tenants", name}));
    if (!r) {
      if (r.error().code != Errc::unavailable) return fail(r.error());
      // The coordinator restarting is no reason to give up the wait.
      if (r.error().message != last_error) os << stamp() << r.error().message << "\n";
      last_error = r.error().message;
    } else {
      last_error.clear();
      for (const auto& line : progress_lines(before, *r))
        os << stamp() << display_text(line) << "\n";
      os.flush();
      before = *r;
      std::string phase = str(*r, "phase");
      if (phase == "ready") {
        os << stamp() << "ready\n";
        return 0;
      }
      if (phase == "failed") {
        // The step's own line was printed just above, as it changed.
        for (const auto& line : failure_report(*r, /*with_step_line=*/false))
          os << stamp() << display_text(line) << "\n";
        return fail(Error(Errc::failed_precondition, failure_summary(*r)));
      }
    }
    if (std::chrono::steady_clock::now() - start >= timeout) {
      std::string where = before.is_null() ? "" : " (phase " + str(before, "phase") + ")";
      return fail(Error(Errc::timeout,
                        "tenant " + name + " not ready after " + format_duration(timeout) + where +
                            ": it goes on; follow it with `factory tenant show " + name + "`"));
    }
    std::this_thread::sleep_for(poll);
  }
}

int create(const Context& ctx, const CreateOptions& o) {
  if (o.dry_run) {
    if (o.wait)
      return fail(Error(Errc::invalid_argument, "--dry-run and --wait do not go together"));
    return dry_run(ctx, o);
  }
  auto timeout = parse_duration(o.timeout);
  if (!timeout) return fail(timeout.error().with_context("--timeout"));
  auto poll = parse_duration(o.poll);
  if (!poll) return fail(poll.error().with_context("--poll"));
  auto req = build_request(ctx, o);
  if (!req) return fail(req.error());
  auto client = AdminClient::from(ctx.global);
  if (!client) return fail(client.error());
  auto res = client->call("POST", "/v1/tenants", req->to_json());
  if (!res) return fail(res.error());
  json doc = *res;
  const std::string password = str(doc, "password");
  doc.erase("password");
  // Secrets go to stderr once, never into the document a script may keep.
  const std::string api_key = str(doc, "api_key");
  doc.erase("api_key");
  const std::string password_kept_in = str(doc, "password_kept_in");
  const json& t = doc.contains("tenant") ? doc["tenant"] : json::object();
  const json& spec = t.contains("spec") ? t["spec"] : json::object();

  if (!print_document(std::cout, o.out, doc)) {
    if (doc.value("created", false)) {
      std::cout << "tenant " << o.name << " created: tier " << str(spec, "tier") << ", "
                << str(spec, "gpus") << " x "
                << (str(spec, "gpu_resource").empty() ? "no GPU" : str(spec, "gpu_resource"))
                << ", namespace " << str(spec, "namespace");
      int port = t.contains("vm") ? t["vm"].value("ssh_node_port", 0) : 0;
      const std::string ssh_host = t.contains("vm") ? str(t["vm"], "ssh_host") : "";
      if (port && !ssh_host.empty())
        std::cout << ", SSH " << ssh_host << ":" << port;
      else if (port)
        std::cout << ", SSH node port " << port;
      std::cout << "\n";
      for (const auto& obj : doc.value("objects", json::array()))
        std::cout << "  created " << obj.get<std::string>() << "\n";
    }
    if (!str(doc, "tenant_object").empty())
      std::cout << "  wrote Tenant " << str(doc, "tenant_object")
                << " (tenants.source: kubernetes)\n";
  }
  if (!str(doc, "note").empty()) std::cerr << "note: " << str(doc, "note") << "\n";
  if (!password.empty()) {
    std::string kept = password_kept_in;
    if (kept.empty())
      kept = "Secret " + str(spec, "namespace") + "/" + kubevirt::cloud_init_secret_name(o.name);
    std::cerr << "password of ubuntu on " << o.name << " (shown once; kept only in " << kept
              << "): " << password << "\n";
  }
  if (!api_key.empty())
    std::cerr << "API key of " << o.name << "'s endpoint (kept only in Secret "
              << str(spec, "namespace") << "/" << kubevirt::api_key_secret_name(o.name)
              << "; `factory tenant credentials " << o.name << "` prints it again): " << api_key
              << "\n";
  if (!o.wait) return 0;
  // Progress goes to stdout for people, to stderr when stdout holds a document.
  std::ostream& os = o.out == OutputFormat::table ? std::cout : std::cerr;
  return wait_for(*client, o.name, *timeout,
                  std::chrono::duration_cast<std::chrono::milliseconds>(*poll), os);
}

std::string gpus_text(const json& spec) {
  if (!spec.is_object() || !spec.contains("gpus")) return "-";
  std::string r = str(spec, "gpu_resource");
  return str(spec, "gpus") + (r.empty() ? "" : " x " + r);
}

// The table of `factory tenant list`.
void print_tenants(const json& res) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& t : res["tenants"]) {
    const json spec = t.value("spec", json::object());
    rows.push_back({str(t, "name"), str(t, "tier").empty() ? "-" : str(t, "tier"), str(t, "phase"),
                    gpus_text(spec), str(spec, "namespace").empty() ? "-" : str(spec, "namespace"),
                    t["agent"].value("connected", false) ? "yes" : "no",
                    age(str(t, "created_at"))});
  }
  if (rows.empty()) {
    std::cout << "No tenants. Create one with `factory tenant create NAME --tier gpu-vm`.\n";
    return;
  }
  print_table(std::cout, {"tenant", "tier", "phase", "gpus", "namespace", "agent", "age"}, rows);
}

std::vector<std::string> tier_upgrade_lines(const json& u);

// `tenant show`'s pins: what the tenant runs, each pin the catalog moves
// marked, and its last tier upgrade.
template <class Row>
void tier_pins_rows(const json& t, Row&& row) {
  const json& v = t["tier_pins"];
  std::map<std::string, std::string> moved;  // what -> the catalog's version
  if (v.contains("changes") && v["changes"].is_object())
    for (const auto& c : v["changes"].value("pins", json::array()))
      moved[str(c, "what")] = str(c, "to").empty() ? "gone" : str(c, "to");
  bool first = true;
  for (const auto& p : v.value("pins", json::array())) {
    std::string line = p.value("pinned", false) ? str(p, "what") + " " + str(p, "version")
                                                : str(p, "what") + ": UNPINNED";
    if (auto m = moved.find(str(p, "what")); m != moved.end())
      line += "  (catalog: " + m->second + ")";
    row(first ? "Pins:" : "", line);
    first = false;
  }
  if (first && !str(v, "note").empty()) row("Pins:", str(v, "note"));
  std::string plan = "runs plan " + str(v, "plan_hash").substr(0, 12);
  if (v.value("differs", false)) {
    size_t runs = v.contains("changes") ? v["changes"].value("runs", json::array()).size() : 0;
    plan += "; the catalog's is " + str(v, "catalog_plan_hash").substr(0, 12) + " (" +
            std::to_string(runs) + " step(s) would run): `factory tenant upgrade " +
            str(t, "name") + " --dry-run`";
  } else if (!str(v, "catalog_plan_hash").empty()) {
    plan += ", the catalog's";
  }
  row("Plan:", plan);
  if (t.contains("tier_upgrade") && t["tier_upgrade"].is_object()) {
    bool head = true;
    for (const auto& l : tier_upgrade_lines(t["tier_upgrade"])) {
      row(head ? "Tier upgrade:" : "", l);
      head = false;
    }
  }
}

int show(const Context& ctx, const std::string& name, OutputFormat out) {
  auto res = call_coordinator(ctx.global, "GET", api_path({"v1", "tenants", name}));
  if (!res) return fail(res.error());
  if (print_document(std::cout, out, *res)) return 0;
  const json& t = *res;
  const json spec = t.value("spec", json::object());
  auto row = [](const std::string& k, const std::string& v) {
    // v holds what the agent reported (its version, step messages): shown
    // escaped, like every table cell.
    std::cout << k << std::string(k.size() < 11 ? 11 - k.size() : 1, ' ')
              << (v.empty() ? "-" : display_text(v)) << "\n";
  };
  row("Tenant:", str(t, "name"));
  row("Tier:", str(t, "tier"));
  row("Phase:", str(t, "phase"));
  row("Created:", str(t, "created_at"));
  if (spec.contains("gpus")) {
    row("Shape:", str(spec, "cpu") + " CPU, " + str(spec, "memory") + " memory, " +
                      str(spec, "disk") + " disk, " + gpus_text(spec) + " GPU");
    row("Namespace:", str(spec, "namespace"));
  }
  if (t.contains("vm")) {
    const json& vm = t["vm"];
    std::string v;
    if (!str(vm, "error").empty())
      v = "unknown (" + str(vm, "error") + ")";
    else if (!vm.value("exists", false))
      v = "not found in the cluster";
    else if (str(vm, "provider") == "qemu") {
      // A QEMU process on this host: its state as QMP reports it, who keeps
      // it running, and where its SSH port listens.
      v = str(vm, "status");
      if (vm.value("pid", 0)) v += ", QEMU pid " + str(vm, "pid");
      v += str(vm, "supervisor") == "systemd" ? ", unit factory-vm-" + str(t, "name")
                                              : ", supervised by the coordinator";
      if (!str(vm, "node").empty()) v += " on " + str(vm, "node");
      if (vm.value("ssh_node_port", 0))
        v += ", SSH " + str(vm, "ssh_host") + ":" + str(vm, "ssh_node_port");
      if (vm.value("restarts", 0)) v += ", restarted " + str(vm, "restarts") + "x";
      if (!str(vm, "reason").empty()) v += " (" + str(vm, "reason") + ")";
    } else {
      v = str(vm, "status");
      if (!str(vm, "phase").empty()) v += ", VMI " + str(vm, "phase");
      if (!str(vm, "node").empty()) v += " on " + str(vm, "node");
      if (!str(vm, "ip").empty()) v += ", IP " + str(vm, "ip");
      if (vm.value("ssh_node_port", 0)) v += ", SSH node port " + str(vm, "ssh_node_port");
      if (!str(vm, "reason").empty()) v += " (" + str(vm, "reason") + ")";
    }
    row("VM:", v);
    if (!str(vm, "accelerator").empty()) {
      std::string a = str(vm, "accelerator") == "kvm" ? "KVM" : "TCG (emulated CPU)";
      if (!str(vm, "accelerator_reason").empty()) a += ": " + str(vm, "accelerator_reason");
      row("Accel:", a);
    }
    if (vm.contains("gpus") && vm["gpus"].is_array() && !vm["gpus"].empty()) {
      std::string g;
      for (const auto& a : vm["gpus"]) g += (g.empty() ? "" : ", ") + a.get<std::string>();
      row("Cards:", g + " (vfio-pci)");
    }
  }
  if (spec.contains("guest_ranges") && spec["guest_ranges"].is_object()) {
    // The guest cluster's ranges and what they were picked around: what the
    // agent chose when it has reported, else what the coordinator planned.
    const json& gr = spec["guest_ranges"];
    json reported;
    for (const auto& st : t.value("plan_steps", json::array()))
      if (st.contains("ranges") && st["ranges"].is_object()) reported = st["ranges"];
    const json r = reported.is_object() ? reported : gr.value("planned", json::object());
    std::string how = reported.is_object()
                          ? (gr.value("fixed", false) ? "fixed by the catalog, checked by the agent"
                                                      : "chosen by the agent")
                      : gr.value("fixed", false)
                          ? "fixed by the catalog, checked against the host"
                          : "planned around the host; the agent adds the guest's own networks";
    row("Ranges:", "pods " + str(r, "cluster-cidr") + ", services " + str(r, "service-cidr") +
                       ", DNS " + str(r, "cluster-dns") + " (" + how + ")");
    const json around = reported.is_object() ? reported.value("around", json::array())
                                             : gr.value("avoid", json::array());
    bool first = true;
    for (const auto& f : around) {
      row(first ? "Around:" : "", str(f, "range") + "  " + str(f, "source"));
      first = false;
    }
    if (first) row("Around:", "nothing seen");
  }
  // What the tenant runs, pin by pin, and what the catalog has instead.
  if (t.contains("tier_pins") && t["tier_pins"].is_object()) {
    tier_pins_rows(t, row);
  } else if (t.contains("pins") && t["pins"].is_array()) {
    // What the tier pins, and what it leaves to whatever is newest.
    bool first = true;
    for (const auto& p : t["pins"]) {
      std::string v = p.value("pinned", false) ? str(p, "what") + " " + str(p, "version")
                                               : str(p, "what") + ": UNPINNED";
      if (!str(p, "note").empty()) v += " (" + str(p, "note") + ")";
      row(first ? "Pins:" : "", v);
      first = false;
    }
  }
  if (t.contains("endpoint") && t["endpoint"].is_object()) {
    const json& e = t["endpoint"];
    std::string v = str(e, "url").empty() ? "no URL yet" : str(e, "url");
    if (e.value("answers", false))
      v += " (answers: GET /v1/models " + str(e, "status") + " in " + str(e, "latency_ms") + " ms)";
    else
      v += " (NOT answering: " + str(e, "error") + ")";
    row("Endpoint:", v);
    row("", "key: `factory tenant credentials " + str(t, "name") + "` (rotated " +
                (str(e, "rotated_at").empty() ? "never" : str(e, "rotated_at")) + ")");
  }
  if (t.contains("kube") && !str(t["kube"], "error").empty())
    row("Error:", str(t["kube"], "error"));
  if (t.contains("restart_offer") && t["restart_offer"].is_object()) {
    // A card fault since the VM last started: the move, or why none now.
    const json& o = t["restart_offer"];
    if (!str(o, "command").empty())
      row("Fix:", "`" + str(o, "command") + "` would " + str(o, "would"));
    else
      row("Fix:", "no move to a healthy card now: " + str(o, "why_not"));
  }
  if (t.contains("restart") && t["restart"].is_object()) {
    const json& rs = t["restart"];
    std::string v = str(rs, "state") + " (asked " + str(rs, "requested_at");
    if (!str(rs, "finished_at").empty()) v += ", ended " + str(rs, "finished_at");
    v += ")";
    if (!str(rs, "error").empty())
      v += ": " + str(rs, "error");
    else if (!str(rs, "note").empty())
      v += ": " + str(rs, "note");
    row("Restart:", v);
  }
  const json& a = t["agent"];
  std::string agent = a.value("connected", false) ? "connected" : "not connected";
  if (!str(a, "version").empty()) agent += ", factory-agent " + str(a, "version");
  if (!str(a, "last_seen").empty()) agent += ", last seen " + str(a, "last_seen");
  row("Agent:", agent);
  if (t.contains("agent_upgrade") && t["agent_upgrade"].is_object()) {
    // The latest self-update ordered for this agent (docs/agent-rollouts.md).
    const json& u = t["agent_upgrade"];
    std::string v = str(u, "state") == "rolled_back" ? "rolled back" : str(u, "state");
    v += ", " + (str(u, "from_version").empty() ? "?" : str(u, "from_version")) + " -> " +
         str(u, "to_version") + " (" + str(u, "upgrade_id");
    if (!str(u, "done_at").empty())
      v += ", ended " + str(u, "done_at");
    else if (!str(u, "sent_at").empty())
      v += ", ordered " + str(u, "sent_at");
    v += ")";
    if (!str(u, "reason").empty()) v += ": " + str(u, "reason");
    row("Upgrade:", v);
  }
  if (t.contains("plan")) {
    const json& p = t["plan"];
    std::string h = str(p, "hash");
    row("Plan:", str(p, "state") + " (" + str(p, "steps_done") + "/" + str(p, "steps_total") +
                     " steps, hash " + h.substr(0, 12) + ")");
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& s : t.value("plan_steps", json::array())) {
    std::string progress = s.contains("percent") ? str(s, "percent") + "%" : "-";
    std::string msg = str(s, "message");
    if (msg.size() > 80) msg = msg.substr(0, 77) + "...";
    rows.push_back({str(s, "id"), str(s, "kind").empty() ? "-" : str(s, "kind"), str(s, "state"),
                    progress, msg.empty() ? "-" : msg});
  }
  if (!rows.empty()) {
    std::cout << "\n";
    print_table(std::cout, {"step", "kind", "state", "progress", "message"}, rows);
  }
  if (t.contains("diagnoses") && t["diagnoses"].is_object() && !t["diagnoses"].empty()) {
    std::cout << "\nDiagnoses:\n";
    for (const auto& [code, d] : t["diagnoses"].items()) {
      std::cout << "  " << display_text(code) << ": " << display_text(str(d, "summary")) << "\n";
      if (!str(d, "fix").empty()) std::cout << "    fix: " << display_text(str(d, "fix")) << "\n";
    }
  }
  if (str(t, "phase") == "failed") {
    std::cout << "\n";
    for (const auto& line : failure_report(t)) std::cout << display_text(line) << "\n";
  }
  return 0;
}

int remove(const Context& ctx, const std::string& name, const std::string& ns) {
  if (auto st = enroll::validate_tenant_name(name); !st.ok())
    return fail(st.error().with_context("tenant name"));
  std::string path = api_path({"v1", "tenants", name});
  if (!ns.empty()) path += "?namespace=" + net::percent_encode(ns);
  auto res = call_coordinator(ctx.global, "DELETE", path);
  if (!res) return fail(res.error());
  if (!res->value("found", false)) {
    std::cout << "tenant " << name << ": nothing to delete (no record, no objects)\n";
    return 0;
  }
  const json deleted = res->value("deleted", json::array());
  std::cout << "tenant " << name << " deleted: " << deleted.size() << " object(s) removed, agent "
            << "certificate and unused tokens revoked\n";
  for (const auto& d : deleted) std::cout << "  deleted " << d.get<std::string>() << "\n";
  const json tenant_object = res->value("tenant_object", json::object());
  if (tenant_object.value("found", false))
    std::cout << "  deleted " << str(tenant_object, "ref") << "\n";
  return 0;
}

// The tier upgrade's journal and its pin changes, as lines.
std::vector<std::string> tier_upgrade_lines(const json& u) {
  std::vector<std::string> out;
  std::string head = str(u, "state") + " (" + str(u, "id") + ", plan " +
                     str(u, "from_hash").substr(0, 12) + " -> " + str(u, "to_hash").substr(0, 12) +
                     ")";
  out.push_back(head);
  if (!str(u, "failed_step").empty()) out.push_back("step " + str(u, "failed_step"));
  if (!str(u, "message").empty()) out.push_back(str(u, "message"));
  if (u.contains("diagnosis") && u["diagnosis"].is_object()) {
    const json& d = u["diagnosis"];
    out.push_back(str(d, "code") + ": " + str(d, "summary"));
    if (!str(d, "fix").empty()) out.push_back("fix: " + str(d, "fix"));
  }
  return out;
}

int tier_upgrade(const Context& ctx, const std::string& name, bool dry_run, bool wait,
                 const std::string& timeout_text, const std::string& poll_text, OutputFormat out) {
  if (dry_run && wait)
    return fail(Error(Errc::invalid_argument, "--dry-run and --wait do not go together"));
  auto timeout = parse_duration(timeout_text);
  if (!timeout) return fail(timeout.error().with_context("--timeout"));
  auto poll = parse_duration(poll_text);
  if (!poll) return fail(poll.error().with_context("--poll"));
  auto res = call_coordinator(ctx.global, "POST", api_path({"v1", "tenants", name, "tier-upgrade"}),
                              json{{"dry_run", dry_run}});
  if (!res) return fail(res.error());
  const json& r = *res;
  if (!print_document(std::cout, out, r)) {
    std::cout << "tenant " << name << ": plan " << str(r, "from_hash").substr(0, 12) << " -> "
              << str(r, "to_hash").substr(0, 12) << "\n";
    for (const auto& p : r.value("pins", json::array()))
      std::cout << "  pin   " << display_text(str(p, "what")) << ": "
                << (str(p, "from").empty() ? "-" : display_text(str(p, "from"))) << " -> "
                << (str(p, "to").empty() ? "-" : display_text(str(p, "to"))) << "\n";
    for (const auto& s : r.value("steps", json::array())) {
      std::string change = str(s, "change");
      std::string line = "  step  " + display_text(str(s, "id")) + " (" +
                         display_text(str(s, "kind")) + "): " + change;
      if (change == "changed") {
        std::string fields;
        for (const auto& f : s.value("fields", json::array()))
          fields += (fields.empty() ? "" : ", ") + display_text(f.get<std::string>());
        line += " " + fields +
                (s.value("can_go_back", false) ? "; a failure goes back to the previous pins"
                                               : "; a failure leaves the tenant degraded");
      } else if (change == "removed") {
        line += "; what it installed stays in the guest";
      }
      std::cout << line << "\n";
    }
    for (const auto& sec : r.value("sections", json::array()))
      std::cout << "  plan  " << display_text(sec.get<std::string>()) << " section changes\n";
    if (!str(r, "note").empty()) std::cout << display_text(str(r, "note")) << "\n";
    if (r.value("upgraded", false))
      std::cout << "tier upgrade " << str(r, "upgrade_id")
                << (r.value("sent", false) ? " sent to the agent"
                                           : " journaled; the agent gets it when it connects")
                << "; follow it with `factory tenant show " << name << "`\n";
  }
  if (!wait || !r.value("upgraded", false)) return 0;

  const std::string id = str(r, "upgrade_id");
  auto client = AdminClient::from(ctx.global);
  if (!client) return fail(client.error());
  const auto start = std::chrono::steady_clock::now();
  std::string last;
  while (true) {
    auto t = client->call("GET", api_path({"v1", "tenants", name}));
    if (t && t->contains("tier_upgrade") && str((*t)["tier_upgrade"], "id") == id) {
      const json& u = (*t)["tier_upgrade"];
      const std::string state = str(u, "state");
      if (state != last) std::cerr << name << ": tier upgrade " << state << "\n";
      last = state;
      auto lines = tier_upgrade_lines(u);
      if (state == "succeeded") {
        std::cerr << name << ": ready on plan " << str(u, "to_hash").substr(0, 12) << "\n";
        return 0;
      }
      if (state == "rolled_back" || state == "failed" || state == "refused") {
        for (size_t i = 1; i < lines.size(); ++i)
          std::cerr << "  " << display_text(lines[i]) << "\n";
        std::string what =
            state == "rolled_back" ? "went back: the tenant is ready on its previous pins"
            : state == "refused"   ? "refused by the agent: nothing changed"
                                   : "failed and could not go back: the tenant is degraded; "
                                     "fix the cause, then `factory tenant retry " +
                                       name + "`";
        return fail(Error(
            Errc::failed_precondition,
            "tier upgrade of " + name + " " + what +
                (str(u, "message").empty() ? std::string() : " (" + str(u, "message") + ")")));
      }
    } else if (!t && t.error().code != Errc::unavailable) {
      return fail(t.error());
    }
    if (std::chrono::steady_clock::now() - start >= *timeout)
      return fail(Error(Errc::timeout, "tier upgrade of " + name + " not finished after " +
                                           format_duration(*timeout) +
                                           ": it goes on; follow it with `factory tenant show " +
                                           name + "`"));
    std::this_thread::sleep_for(std::chrono::duration_cast<std::chrono::milliseconds>(*poll));
  }
}

int retry(const Context& ctx, const std::string& name, const std::string& step) {
  json body = json::object();
  if (!step.empty()) body["step"] = step;
  auto res = call_coordinator(ctx.global, "POST", api_path({"v1", "tenants", name, "retry"}), body);
  if (!res) return fail(res.error());
  std::cout << "asked the agent of " << name << " to retry its plan"
            << (step.empty() ? " from the failed step" : " from step " + step)
            << "; follow it with `factory tenant show " << name << "`\n";
  return 0;
}

std::string card_list(const json& v) {
  std::string out;
  if (v.is_array())
    for (const auto& a : v)
      if (a.is_string()) out += (out.empty() ? "" : ", ") + a.get<std::string>();
  return out.empty() ? "-" : out;
}

int restart(const Context& ctx, const std::string& name, bool dry_run, OutputFormat out) {
  if (!dry_run)
    std::cerr << "restarting the VM of " << name
              << " (stop, then start on healthy cards; its disk stays)...\n";
  auto res = call_coordinator(ctx.global, "POST", api_path({"v1", "tenants", name, "restart"}),
                              json{{"dry_run", dry_run}});
  if (!res) return fail(res.error());
  if (print_document(std::cout, out, *res)) return 0;
  const json& r = *res;
  if (dry_run) {
    std::cout << "would " << display_text(str(r, "would")) << "\n";
    if (!r.value("avoid_gpus", json::array()).empty())
      std::cout << "  leaving " << display_text(card_list(r["avoid_gpus"]))
                << ": a card fault was recorded since the tenant last started\n";
    return 0;
  }
  if (!r.value("restarted", false)) {
    std::cout << "tenant " << name << ": nothing to do, " << display_text(str(r, "note")) << "\n";
    return 0;
  }
  std::cout << "tenant " << name << " restarted: " << display_text(str(r, "note")) << "\n";
  std::cout << "  the agent reconnects once the guest has booted; follow it with `factory tenant "
               "show "
            << name << "`\n";
  return 0;
}

int credentials(const Context& ctx, const std::string& name, bool rotate, OutputFormat out) {
  if (auto st = enroll::validate_tenant_name(name); !st.ok())
    return fail(st.error().with_context("tenant name"));
  auto res = rotate ? call_coordinator(ctx.global, "POST",
                                       api_path({"v1", "tenants", name, "credentials", "rotate"}),
                                       json::object())
                    : call_coordinator(ctx.global, "GET",
                                       api_path({"v1", "tenants", name, "credentials"}));
  if (!res) return fail(res.error());
  if (print_document(std::cout, out, *res)) return 0;
  const json& c = *res;
  if (c.value("rotated", false))
    std::cerr << "rotated: the old key "
              << (c.value("guest_told", false) ? "is refused from now on"
                                               : "still works until the guest's agent reconnects")
              << "\n";
  if (!str(c, "note").empty()) std::cerr << "note: " << str(c, "note") << "\n";
  std::cout << "URL:      " << (str(c, "url").empty() ? "- (no node port yet)" : str(c, "url"))
            << "\n"
            << "API key:  " << str(c, "api_key") << "\n"
            << "Rotated:  " << (str(c, "rotated_at").empty() ? "-" : str(c, "rotated_at")) << "\n"
            << "CA:       the endpoint CA below (or -o json: .ca)\n"
            << str(c, "ca");
  if (!str(c, "url").empty())
    std::cout << "\nTry:      curl --cacert endpoint-ca.crt -H 'Authorization: Bearer <key>' "
              << str(c, "url") << "/v1/models\n";
  return 0;
}

}  // namespace

void add_tenant_commands(CLI::App& app, Context& ctx) {
  auto* group = app.add_subcommand("tenant", "Tenants: a GPU VM per customer, from a catalog tier");
  group->require_subcommand(1);

  auto o = std::make_shared<CreateOptions>();
  auto* c = group->add_subcommand(
      "create",
      "Create a tenant: its cloud-init Secret, VirtualMachine and SSH Service (a model "
      "endpoint: its API key Secret and endpoint Service, no login) (idempotent: running it "
      "again finishes an interrupted create)");
  c->add_option("NAME", o->name, "Tenant name (DNS-1123 label, starting with a letter)")
      ->required()
      ->check(tenant_name_rule());
  c->add_option("--tier", o->tier, "Catalog tier, e.g. gpu-vm or gpu-k8s (factory catalog list)")
      ->required();
  o->gpus_opt = c->add_option("--gpus", o->gpus, "GPUs for the VM (default: the tier's)");
  c->add_option("--cpu", o->cpu, "CPU request, e.g. 8 (default: the tier's)");
  c->add_option("--memory", o->memory, "Memory, e.g. 16Gi (default: the tier's)");
  c->add_option("--disk", o->disk, "Root disk size, e.g. 100Gi (default: the tier's)");
  c->add_option("--image", o->image, "Cloud image URL CDI imports (default: the tier's)");
  c->add_option("--gpu-resource", o->gpu_resource,
                "Allowlisted GPU resource, e.g. nvidia.com/AD104GL_L4 (default: the tier's, or "
                "any allowlisted one with a free card)");
  c->add_option("--ssh-key", o->ssh_keys,
                "Public key file for the ubuntu user, repeatable (default: ~/.ssh/id_ed25519.pub, "
                "id_ecdsa.pub or id_rsa.pub; none on a tier without login, where it gives the "
                "admin key-only login)");
  c->add_option("--model", o->models,
                "Ollama model to serve instead of the tier's, repeatable (e.g. llama3.2:1b)");
  c->add_option("--ssh-node-port", o->ssh_node_port,
                "NodePort for SSH, 30000-32767 (default: Kubernetes picks a free one)");
  c->add_option("--namespace", o->ns,
                "Namespace for the tenant's objects (default: the "
                "coordinator's kube.namespace, tenants)")
      ->check(namespace_rule());
  c->add_option("--project", o->project,
                "Project whose GPU quota and usage the tenant counts under (default: default; "
                "docs/usage.md)")
      ->check(project_rule());
  c->add_flag("--wait", o->wait,
              "Follow the VM and then the agent's plan, step by step, until the tenant is ready");
  c->add_option("--timeout", o->timeout, "How long --wait waits, e.g. 30m")->capture_default_str();
  c->add_option("--poll", o->poll, "How often --wait asks the coordinator")->capture_default_str();
  c->add_flag("--dry-run", o->dry_run,
              "Print every object it would create (multi-document YAML, secrets as marked "
              "placeholders); contacts nothing, stores nothing");
  c->add_option("--catalog", o->catalog_file,
                "With --dry-run: catalog file (default: the config's 'catalog' key, else the "
                "built-in one); a real create uses the coordinator's catalog");
  o->out_opt = add_output_option(*c, o->out);
  set_examples(*c, {{"factory tenant create alice --tier gpu-vm --wait",
                     "a GPU VM with Ollama, followed until ready"},
                    {"factory tenant create bob --tier gpu-k8s --ssh-key ~/.ssh/id_ed25519.pub",
                     "a GPU VM running its own Kubernetes"},
                    {"factory tenant create alice --tier gpu-vm --dry-run",
                     "the objects it would create, contacting nothing"},
                    {"factory tenant create carol --tier gpu-vm --project ml",
                     "counted against project ml's GPU quota"},
                    {"factory tenant create t5 --tier model-endpoint --wait",
                     "a keyed model API, no login; then `factory tenant credentials t5`"}});
  c->callback([&ctx, o] {
    ctx.run = [&ctx, o] {
      // A dry run prints manifests: YAML unless told otherwise.
      if (o->dry_run && o->out_opt->count() == 0) o->out = OutputFormat::yaml;
      return create(ctx, *o);
    };
  });

  auto list_out = std::make_shared<OutputFormat>(OutputFormat::table);
  auto* l = group->add_subcommand("list", "List tenants: tier, phase, GPUs, agent");
  add_output_option(*l, *list_out);
  set_examples(*l, {{"factory tenant list", "every tenant"},
                    {"factory tenant list -o yaml", "with everything the API knows"}});
  l->callback([&ctx, list_out] {
    ctx.run = [&ctx, list_out] {
      return list_from_coordinator(ctx.global, "/v1/tenants", *list_out, print_tenants);
    };
  });

  struct NameOpts {
    std::string name, ns, step;
    OutputFormat out = OutputFormat::table;
  };
  auto so = std::make_shared<NameOpts>();
  auto* s = group->add_subcommand(
      "show", "Show one tenant: its VM in the cluster, its agent, its plan step by step");
  s->add_option("NAME", so->name, "Tenant name")->required()->check(tenant_name_rule());
  add_output_option(*s, so->out);
  set_examples(*s, {{"factory tenant show alice", "VM, agent, plan steps, diagnoses"},
                    {"factory tenant show alice -o json", "the same as the API answers it"}});
  s->callback([&ctx, so] { ctx.run = [&ctx, so] { return show(ctx, so->name, so->out); }; });

  auto dopt = std::make_shared<NameOpts>();
  auto* d = group->add_subcommand(
      "delete",
      "Delete a tenant: every object Factory made for it, its agent certificate and unused "
      "tokens, its record (idempotent)");
  d->add_option("NAME", dopt->name, "Tenant name")->required()->check(tenant_name_rule());
  d->add_option("--namespace", dopt->ns,
                "Where to look for its objects when the coordinator has no record of it")
      ->check(namespace_rule());
  set_examples(*d, {{"factory tenant delete alice", "everything made for alice"}});
  d->callback(
      [&ctx, dopt] { ctx.run = [&ctx, dopt] { return remove(ctx, dopt->name, dopt->ns); }; });

  auto ro = std::make_shared<NameOpts>();
  auto* r = group->add_subcommand(
      "retry", "Ask the tenant's agent to re-run its failed plan from the failed step");
  r->add_option("NAME", ro->name, "Tenant name")->required()->check(tenant_name_rule());
  r->add_option("--step", ro->step, "Re-run from this step instead (an id from `tenant show`)");
  set_examples(*r, {{"factory tenant retry alice", "from the step that failed"},
                    {"factory tenant retry alice --step ollama", "from the step named"}});
  r->callback([&ctx, ro] { ctx.run = [&ctx, ro] { return retry(ctx, ro->name, ro->step); }; });

  struct RestartOpts {
    std::string name;
    bool dry_run = false;
    OutputFormat out = OutputFormat::table;
  };
  auto rso = std::make_shared<RestartOpts>();
  auto* rs = group->add_subcommand(
      "restart",
      "Stop the tenant's VM and start it again on healthy cards, keeping its disk and identity "
      "(the fix for a tenant on a faulted card); announced on the feed, finished after a "
      "coordinator restart if cut short");
  rs->add_option("NAME", rso->name, "Tenant name")->required()->check(tenant_name_rule());
  rs->add_flag("--dry-run", rso->dry_run,
               "Say what the restart would do (which cards it would leave and take); change "
               "nothing");
  add_output_option(*rs, rso->out);
  set_examples(*rs, {{"factory tenant restart alice --dry-run", "where alice's VM would come back"},
                     {"factory tenant restart alice",
                      "after `factory host quarantine`: alice comes back on a healthy card"}});
  rs->callback([&ctx, rso] {
    ctx.run = [&ctx, rso] { return restart(ctx, rso->name, rso->dry_run, rso->out); };
  });

  struct TierUpgradeOpts {
    std::string name;
    bool dry_run = false, wait = false;
    std::string timeout = "60m";
    std::string poll = "2s";
    OutputFormat out = OutputFormat::table;
  };
  auto uo = std::make_shared<TierUpgradeOpts>();
  auto* up = group->add_subcommand(
      "upgrade",
      "Move a running tenant to its tier's pins in the catalog now: the steps whose pins changed "
      "run in the guest, journaled like the first boot; a failed driver goes back to the "
      "previous one, any other failure leaves the tenant degraded (docs/tier-upgrades.md)");
  up->add_option("NAME", uo->name, "Tenant name")->required()->check(tenant_name_rule());
  up->add_flag("--dry-run", uo->dry_run,
               "Say which pins move and which steps would run; change nothing");
  up->add_flag("--wait", uo->wait,
               "Follow the upgrade to its end: exit 0 on the new pins, 1 when it went back, "
               "failed or was refused");
  up->add_option("--timeout", uo->timeout, "How long --wait waits, e.g. 60m")
      ->capture_default_str();
  up->add_option("--poll", uo->poll, "How often --wait asks the coordinator")
      ->capture_default_str();
  add_output_option(*up, uo->out);
  set_examples(*up, {{"factory tenant upgrade alice --dry-run", "the pins that differ, the steps"},
                     {"factory tenant upgrade alice --dry-run -o json", "the same for scripts"},
                     {"factory tenant upgrade alice --wait",
                      "a new driver through its reboot; back to the old one if it fails"}});
  up->callback([&ctx, uo] {
    ctx.run = [&ctx, uo] {
      return tier_upgrade(ctx, uo->name, uo->dry_run, uo->wait, uo->timeout, uo->poll, uo->out);
    };
  });

  struct CredOpts {
    std::string name;
    bool rotate = false;
    OutputFormat out = OutputFormat::table;
  };
  auto co = std::make_shared<CredOpts>();
  auto* cr = group->add_subcommand(
      "credentials",
      "Print a model endpoint's URL, API key and CA; --rotate makes a new key first (the old one "
      "is refused as soon as the guest's agent is told, at once when it is connected)");
  cr->add_option("NAME", co->name, "Tenant name (a tier with an endpoint, e.g. model-endpoint)")
      ->required()
      ->check(tenant_name_rule());
  cr->add_flag("--rotate", co->rotate, "Replace the API key");
  add_output_option(*cr, co->out);
  set_examples(*cr, {{"factory tenant credentials t5", "URL, key and CA of t5's endpoint"},
                     {"factory tenant credentials t5 --rotate", "a new key; the old one stops"},
                     {"factory tenant credentials t5 -o json | jq -r .ca > endpoint-ca.crt",
                      "the CA a caller trusts"}});
  cr->callback([&ctx, co] {
    ctx.run = [&ctx, co] { return credentials(ctx, co->name, co->rotate, co->out); };
  });
  add_tenant_keys_commands(group, ctx);
}

}  // namespace factory::cli
