#include "agent/cli/local_commands.hpp"

#include <cstdio>
#include <iostream>
#include <optional>
#include <sstream>

#include "agent/cli/upgrade_guard_command.hpp"
#include "agent/guest/cluster.hpp"
#include "agent/health/compare.hpp"
#include "agent/health/fault_book.hpp"
#include "agent/health/nvml.hpp"
#include "agent/health/report.hpp"
#include "agent/plan/engine.hpp"
#include "agent/plan/plan_spec.hpp"
#include "agent/steps/builtin.hpp"
#include "common/atomic_file.hpp"
#include "common/cli/app.hpp"
#include "common/cli/output.hpp"
#include "contract/catalog.hpp"
#include "contract/xid_catalog.hpp"

namespace factory::agent {

namespace {

struct Opts {
  std::string root = "/";
  std::string state_dir = "/var/lib/factory-agent/local";
  // The service's state directory, where its fault book is (health, faults).
  std::string agent_state_dir = "/var/lib/factory-agent";
  std::string gpu_uuid;
  int xid = 0;
  std::string ollama_url = "http://127.0.0.1:11434";
  std::string tier = "gpu-vm";
  std::string catalog;
  cli::OutputFormat output = cli::OutputFormat::table;
  bool check_only = false;
  bool reboot = false;
  bool raw = false;
  bool tier_given = false;
  // health-compare
  std::string agent_json, query_csv, q_memory, q_full;
  int watch_seconds = 10;
  std::string fields =
      "memory.total,memory.used,memory.reserved,memory.free,utilization.gpu,"
      "temperature.gpu,power.draw,clocks.sm,clocks.mem,pstate,mig.mode.current";
};

// The plan of --tier from --catalog (or the built-in catalog); on failure
// the reason is printed and nothing is returned (a usage error, exit 2).
std::optional<nlohmann::json> tier_plan(const Opts& o) {
  auto cat = o.catalog.empty() ? catalog::builtin() : catalog::load_file(o.catalog);
  if (!cat) {
    std::cerr << "factory-agent: " << cat.error().message << "\n";
    return std::nullopt;
  }
  auto p = catalog::plan_for(*cat, o.tier);
  if (!p) {
    std::cerr << "factory-agent: " << p.error().message << "\n";
    return std::nullopt;
  }
  return std::move(*p);
}

GuestEnv env_of(const Opts& o) {
  GuestEnv e;
  e.root = o.root;
  e.state_dir = o.state_dir;
  e.ollama_url = o.ollama_url;
  return e;
}

using nlohmann::json;

// A table cell: "-" for what is missing or null, strings as they are.
std::string cell(const json& j, const char* key, const std::string& suffix = "") {
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) return "-";
  return (j[key].is_string() ? j[key].get<std::string>() : j[key].dump()) + suffix;
}

std::string bytes_text(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number()) return "-";
  double v = j[key].get<double>();
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

// `factory-agent health` for people: one short table per part (GPU, Ollama,
// the guest cluster), then every diagnosis with its fix. -o json|yaml
// prints the report itself, as the coordinator receives it.
void print_health_table(const json& h) {
  std::vector<json> diagnoses;
  auto section = [&](const char* title, const json& part, const std::string& summary) {
    std::cout << title << ": " << summary << "\n";
    if (part.contains("error") && part["error"].is_string())
      std::cout << "error: " << part["error"].get<std::string>() << "\n";
    for (const auto& d : part.value("diagnoses", json::array())) diagnoses.push_back(d);
  };
  const json& gpu = h["gpu"];
  std::string gsum = cell(gpu, "source");
  if (gpu.contains("driver_version") && gpu["driver_version"].is_string())
    gsum += ", driver " + gpu["driver_version"].get<std::string>();
  if (gpu.contains("via") && gpu["via"].is_string())
    gsum += ", via " + gpu["via"].get<std::string>();
  section("GPU", gpu, gsum);
  std::vector<std::vector<std::string>> rows;
  for (const auto& g : gpu.value("gpus", json::array()))
    rows.push_back({cell(g, "index"), cell(g, "name"),
                    cell(g, "memory_used_mib") + " / " + cell(g, "memory_total_mib") + " MiB",
                    cell(g, "utilization_percent", "%"), cell(g, "temperature_c", "C"),
                    cell(g, "pci_bus_id")});
  if (rows.empty())
    std::cout << "No GPU found.\n";
  else
    cli::print_table(std::cout, {"index", "name", "memory", "util", "temp", "pci bus id"}, rows);

  if (h.contains("ollama")) {
    const json& o = h["ollama"];
    std::cout << "\n";
    section("Ollama", o,
            o.contains("version") && o["version"].is_string()
                ? "version " + o["version"].get<std::string>()
                : "not answering");
    rows.clear();
    for (const auto& m : o.value("models", json::array()))
      rows.push_back({cell(m, "name"), bytes_text(m, "size"), bytes_text(m, "size_vram"),
                      cell(m, "gpu_percent", "%")});
    if (rows.empty())
      std::cout << "No model loaded.\n";
    else
      cli::print_table(std::cout, {"model", "size", "in vram", "on gpu"}, rows);
  }

  if (h.contains("k8s")) {
    const json& k = h["k8s"];
    std::cout << "\n";
    section("Guest cluster", k,
            cell(k, "resource") + " allocatable " + cell(k, "allocatable") + " of " +
                cell(k, "capacity"));
    rows.clear();
    for (const auto& n : k.value("nodes", json::array()))
      rows.push_back({cell(n, "name"), n.value("ready", false) ? "yes" : "no",
                      cell(n, "allocatable"), cell(n, "capacity"), cell(n, "gpu_label")});
    if (!rows.empty())
      cli::print_table(std::cout, {"node", "ready", "allocatable", "capacity", "gpu label"}, rows);
    rows.clear();
    for (const auto& p : k.value("pods", json::array()))
      rows.push_back({cell(p, "namespace") + "/" + cell(p, "name"), cell(p, "status"),
                      cell(p, "node"), cell(p, "gpus"), cell(p, "gpumem_mib")});
    if (!rows.empty()) {
      std::cout << "\n";
      cli::print_table(std::cout, {"pod", "status", "node", "gpus", "gpumem mib"}, rows);
    }
  }

  if (!diagnoses.empty()) {
    std::cout << "\nDiagnoses:\n";
    for (const auto& d : diagnoses) {
      std::cout << "  " << cell(d, "code") << ": " << cell(d, "summary") << "\n";
      if (d.contains("fix") && d["fix"].is_string())
        std::cout << "    fix: " << d["fix"].get<std::string>() << "\n";
    }
  }
}

// check() and verify() of every step, apply() never: safe on any guest.
int check_plan(const Opts& o, const nlohmann::json& plan) {
  auto spec = parse_plan(plan);
  if (!spec) {
    std::cerr << "factory-agent: " << spec.error().message << "\n";
    return 2;
  }
  StepRegistry reg;
  register_builtin_steps(reg);
  GuestEnv env = env_of(o);
  nlohmann::json steps = nlohmann::json::array();
  bool all_done = true;
  for (auto& s : spec->steps) {
    nlohmann::json row = {{"id", s.id}, {"kind", s.kind}};
    auto step = reg.create(s);
    if (!step) {
      row["state"] = "unsupported";
      row["message"] = step.error().message;
      all_done = false;
      steps.push_back(row);
      continue;
    }
    StepContext ctx{env, s, [](nlohmann::json) {}, std::chrono::steady_clock::now() + s.timeout};
    auto done = (*step)->check(ctx);
    if (!done) {
      row["state"] = "error";
      row["message"] = done.error().message;
      all_done = false;
    } else if (!*done) {
      row["state"] = "not_done";
      all_done = false;
    } else {
      auto v = (*step)->verify(ctx);
      row["state"] = v.ok() ? "done" : "verify_failed";
      if (!v.message.empty()) row["message"] = v.message;
      if (v.diagnosis) row["diagnosis"] = v.diagnosis->to_json();
      if (!v.ok()) all_done = false;
    }
    steps.push_back(row);
  }
  nlohmann::json out = {
      {"tier", spec->tier}, {"plan_hash", spec->hash}, {"steps", steps}, {"complete", all_done}};
  if (cli::print_document(std::cout, o.output, out)) return all_done ? 0 : 1;
  std::cout << "tier " << spec->tier << " (plan " << spec->hash.substr(0, 12) << ")\n";
  std::vector<std::vector<std::string>> rows;
  for (auto& r : steps)
    rows.push_back({cell(r, "id"), cell(r, "kind"), cell(r, "state"), cell(r, "message")});
  cli::print_table(std::cout, {"step", "kind", "state", "message"}, rows);
  bool first = true;
  for (auto& r : steps) {
    if (!r.contains("diagnosis")) continue;
    if (first) std::cout << "\nDiagnoses:\n";
    first = false;
    std::cout << "  " << cell(r, "id") << ": " << cell(r["diagnosis"], "code") << ": "
              << cell(r["diagnosis"], "summary") << "\n    fix: " << cell(r["diagnosis"], "fix")
              << "\n";
  }
  return all_done ? 0 : 1;
}

// `factory-agent faults`: the fault book, as the running agent keeps it.
int list_faults(const Opts& o) {
  FaultBook book(FaultBook::file_in(o.agent_state_dir));
  auto records = book.list();
  if (!records) {
    std::cerr << "factory-agent: " << records.error().message << "\n";
    return 1;
  }
  json list = json::array();
  for (const auto& r : *records) {
    const gpu::XidEntry* e = gpu::find_xid(r.xid);
    list.push_back({{"uuid", r.uuid},
                    {"gpu", r.gpu_index},
                    {"xid", r.xid},
                    {"description", e ? std::string(e->description) : ""},
                    {"impact", e ? std::string(gpu::impact_name(e->impact)) : "unknown"},
                    {"count", r.count},
                    {"first_at", r.first_at},
                    {"last_at", r.last_at}});
  }
  if (cli::print_document(std::cout, o.output, json{{"xids", list}})) return 0;
  if (list.empty()) {
    std::cout << "No Xid recorded (" << book.file().string() << ").\n";
    return 0;
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& x : list)
    rows.push_back({cell(x, "gpu"), cell(x, "uuid"), cell(x, "xid"), cell(x, "description"),
                    cell(x, "impact"), cell(x, "count"), cell(x, "first_at"), cell(x, "last_at")});
  cli::print_table(std::cout,
                   {"gpu", "uuid", "xid", "description", "impact", "count", "first", "last"}, rows);
  return 0;
}

int ack_faults(const Opts& o) {
  FaultBook book(FaultBook::file_in(o.agent_state_dir));
  auto gone = book.acknowledge(o.gpu_uuid, o.xid);
  if (!gone) {
    std::cerr << "factory-agent: " << gone.error().message << "\n";
    return 1;
  }
  if (*gone == 0)
    std::cout << "no Xid recorded matches; nothing changed\n";
  else
    std::cout << "acknowledged " << *gone << " Xid record" << (*gone == 1 ? "" : "s")
              << "; the next health sample no longer reports " << (*gone == 1 ? "it" : "them")
              << "\n";
  return 0;
}

// `factory-agent faults watch`: NVML's event set as the agent registers
// it, waited on for a while, every event printed. Reads the card, changes
// nothing (the fault book is the running agent's; this records nothing).
int watch_faults(const Opts& o) {
  GuestEnv env = env_of(o);
  auto lib = NvmlLibrary::load(nvml_library_candidates(env));
  if (!lib) {
    std::cerr << "factory-agent: " << lib.error().message << "\n";
    return 1;
  }
  auto set = (*lib)->watch_events();
  if (!set) {
    std::cerr << "factory-agent: " << set.error().message << "\n";
    return 1;
  }
  json regs = json::array();
  for (const auto& r : (*set)->registrations())
    regs.push_back({{"gpu", r.index},
                    {"uuid", r.uuid},
                    {"supported", r.supported},
                    {"registered", r.registered},
                    {"error", r.error}});
  const bool table = o.output == cli::OutputFormat::table;
  if (table)
    for (const auto& r : regs)
      std::cout << "GPU " << r["gpu"] << " " << r["uuid"].get<std::string>() << ": registered 0x"
                << std::hex << r["registered"].get<std::uint64_t>() << " of supported 0x"
                << r["supported"].get<std::uint64_t>() << std::dec
                << (r["error"].get<std::string>().empty()
                        ? ""
                        : " (" + r["error"].get<std::string>() + ")")
                << "\n";
  json events = json::array();
  std::string ended = "the time passed";
  int waits = 0, timeouts = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(o.watch_seconds);
  while (std::chrono::steady_clock::now() < until) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    auto e = (*set)->wait(std::min(left, std::chrono::milliseconds(1000)));
    ++waits;
    if (!e) {
      ended = e.error().message;
      break;
    }
    if (!*e) {
      ++timeouts;
      continue;
    }
    const NvmlEvent& ev = **e;
    json j = {{"gpu", ev.gpu_index}, {"uuid", ev.uuid}, {"type", ev.type}, {"xid", ev.xid}};
    if (table) std::cout << "event: " << j.dump() << "\n";
    events.push_back(std::move(j));
  }
  json doc = {{"library", (*lib)->path()}, {"registrations", regs}, {"waits", waits},
              {"timeouts", timeouts},      {"events", events},      {"ended", ended}};
  if (!cli::print_document(std::cout, o.output, doc))
    std::cout << waits << " waits (" << timeouts << " timed out, " << events.size()
              << " events); ended: " << ended << "\n";
  return ended == "the time passed" ? 0 : 1;
}

int run_plan(const Opts& o, const nlohmann::json& plan) {
  StepRegistry reg;
  register_builtin_steps(reg);
  if (auto st = ensure_dir(o.state_dir, 0700); !st.ok()) {
    std::cerr << "factory-agent: " << st.error().message << "\n";
    return 1;
  }
  PlanEventSink sink = [](nlohmann::json e) { std::cout << e.dump() << std::endl; };
  RebootHook hook = o.reboot ? system_reboot_hook() : RebootHook([]() -> Status {
    std::cerr << "factory-agent: a step needs a reboot; reboot the guest and run this again "
                 "(or pass --reboot)\n";
    return {};
  });
  PlanEngine engine(env_of(o), std::move(reg), sink, hook);
  auto outcome = engine.run(plan);
  std::cerr << "factory-agent: plan " << PlanEngine::to_string(outcome) << "\n";
  return outcome == PlanEngine::Outcome::succeeded ? 0 : 1;
}

}  // namespace

void add_local_commands(CLI::App& app, LocalCommand& chosen) {
  auto o = std::make_shared<Opts>();
  auto* health = app.add_subcommand(
      "health",
      "Print one health sample: this guest's GPU (NVML or nvidia-smi), and Ollama and "
      "the guest cluster as its tier says (or as found, without --tier)");
  health->add_option("--root", o->root, "Filesystem root of the guest");
  health->add_option("--ollama-url", o->ollama_url, "Ollama's API");
  cli::add_output_option(*health, o->output);
  cli::set_examples(*health, {{"factory-agent health", "GPU, Ollama and cluster as tables"},
                              {"factory-agent health -o json", "the report the coordinator gets"}});
  health->add_option("--tier", o->tier, "Catalog tier whose health section chooses the collectors")
      ->each([o](const std::string&) { o->tier_given = true; });
  health->add_option("--catalog", o->catalog, "Catalog file (default: the built-in catalog)");
  health
      ->add_option("--state-dir", o->agent_state_dir,
                   "The agent's state directory, whose fault book (Xids) the sample shows")
      ->capture_default_str();
  health->add_flag("--raw", o->raw,
                   "Add NVML's memory info in bytes (v1 and v2) as `nvml_raw`, to check the MiB "
                   "figures against nvidia-smi's");
  health->callback([&chosen, o] {
    chosen.run = [o] {
      GuestEnv env = env_of(*o);
      env.state_dir = o->agent_state_dir;
      HealthCollectors c;
      if (o->tier_given) {
        auto p = tier_plan(*o);
        if (!p) return 2;
        c = HealthCollectors::from_plan(*p);
      } else {
        // No tier: ask Ollama, and the guest's own cluster when it has one.
        c.ollama = true;
        std::error_code ec;
        c.k8s = std::filesystem::exists(env.path(kRke2Kubeconfig), ec);
      }
      nlohmann::json h = collect_health(env, c);
      if (o->raw) {
        nlohmann::json raw;
        auto r = read_gpus_via_nvml(env, &raw);
        h["nvml_raw"] = r ? raw : nlohmann::json({{"error", r.error().message}});
      }
      if (!cli::print_document(std::cout, o->output, h)) print_health_table(h);
      return h["gpu"].value("gpus", nlohmann::json::array()).empty() ? 1 : 0;
    };
  });

  auto* cmp = app.add_subcommand(
      "health-compare",
      "Compare a `health -o json` sample with nvidia-smi's --query-gpu and -q -d MEMORY output "
      "taken in the same run: memory exact, other figures within a stated tolerance");
  cmp->add_option("--agent", o->agent_json, "The agent's sample (factory-agent health -o json)")
      ->required();
  cmp->add_option("--query-gpu", o->query_csv,
                  "nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits output")
      ->required();
  cmp->add_option("--fields", o->fields, "The FIELDS that query asked for, in order")
      ->capture_default_str();
  cmp->add_option("--q-memory", o->q_memory, "nvidia-smi -q -d MEMORY output")->required();
  cmp->add_option("--q", o->q_full,
                  "nvidia-smi -q output: also compare the fault figures (serial, PCIe replays, "
                  "clock event reasons, ECC counts, retired pages, remapped rows), exactly");
  cli::add_output_option(*cmp, o->output);
  cmp->callback([&chosen, o] {
    chosen.run = [o] {
      auto agent = read_file(o->agent_json);
      auto csv = read_file(o->query_csv);
      auto mem = read_file(o->q_memory);
      for (auto* r : {&agent, &csv, &mem})
        if (!*r) {
          std::cerr << "factory-agent: " << r->error().message << "\n";
          return 2;
        }
      auto doc = nlohmann::json::parse(*agent, nullptr, false);
      if (doc.is_discarded()) {
        std::cerr << "factory-agent: " << o->agent_json << " is not JSON\n";
        return 2;
      }
      std::vector<std::string> fields;
      std::stringstream fs(o->fields);
      for (std::string f; std::getline(fs, f, ',');) fields.push_back(f);
      auto smi = parse_nvidia_smi_csv(*csv, fields);
      if (!smi) {
        std::cerr << "factory-agent: " << smi.error().message << "\n";
        return 2;
      }
      auto result = compare_with_nvidia_smi(doc, *smi, fields, parse_nvidia_smi_q_memory(*mem));
      if (!o->q_full.empty()) {
        auto q = read_file(o->q_full);
        if (!q) {
          std::cerr << "factory-agent: " << q.error().message << "\n";
          return 2;
        }
        compare_faults(result, doc, parse_nvidia_smi_q_faults(*q));
      }
      if (!cli::print_document(std::cout, o->output, result.to_json()))
        std::cout << result.to_text();
      return result.ok() ? 0 : 1;
    };
  });

  auto* faults = app.add_subcommand(
      "faults",
      "The Xids this guest's GPUs reported, kept (with their count and first and last time) "
      "until acknowledged; `faults ack` acknowledges them");
  faults->add_option("--state-dir", o->agent_state_dir, "The agent's state directory")
      ->capture_default_str();
  cli::add_output_option(*faults, o->output);
  cli::set_examples(*faults, {{"factory-agent faults", "every Xid not yet acknowledged"},
                              {"factory-agent faults ack --xid 13",
                               "forget Xid 13 on every GPU once its program is fixed"},
                              {"factory-agent faults ack", "forget them all (after a reset)"},
                              {"factory-agent faults watch --seconds 30",
                               "NVML's event set, registered and waited on"}});
  auto* ack = faults->add_subcommand(
      "ack", "Acknowledge Xids: the next health sample no longer reports them");
  ack->add_option("--gpu", o->gpu_uuid, "Only this GPU (its UUID)");
  ack->add_option("--xid", o->xid, "Only this Xid")->check(CLI::Range(1, 999));
  ack->add_option("--state-dir", o->agent_state_dir, "The agent's state directory")
      ->capture_default_str();
  ack->callback([&chosen, o] { chosen.run = [o] { return ack_faults(*o); }; });
  auto* watch = faults->add_subcommand(
      "watch",
      "Register NVML's Xid and ECC events as the agent does and wait on them for a while, "
      "printing each event (records nothing)");
  watch->add_option("--seconds", o->watch_seconds, "How long to wait")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  watch->add_option("--root", o->root, "Filesystem root of the guest");
  cli::add_output_option(*watch, o->output);
  watch->callback([&chosen, o] { chosen.run = [o] { return watch_faults(*o); }; });
  faults->callback([&chosen, o, ack, watch] {
    if (ack->parsed() || watch->parsed()) return;
    chosen.run = [o] { return list_faults(*o); };
  });

  auto* plan = app.add_subcommand(
      "plan", "Run (or only check) a catalog tier's plan on this guest, without a coordinator");
  plan->add_option("--tier", o->tier, "Catalog tier")->capture_default_str();
  plan->add_option("--catalog", o->catalog, "Catalog file (default: the built-in catalog)");
  plan->add_option("--root", o->root, "Filesystem root of the guest");
  plan->add_option("--state-dir", o->state_dir, "Where the local plan journal goes")
      ->capture_default_str();
  plan->add_option("--ollama-url", o->ollama_url, "Ollama's API");
  plan->add_flag("--check-only", o->check_only, "Run every step's check and verify, never apply");
  plan->add_flag("--reboot", o->reboot, "Reboot the guest when a step asks for it");
  cli::add_output_option(*plan, o->output)
      ->description("Output format of --check-only (default: table)");
  cli::set_examples(*plan, {{"factory-agent plan --tier gpu-vm --check-only",
                             "which steps are done, applying nothing"},
                            {"factory-agent plan --tier gpu-vm --reboot",
                             "run the whole plan here, rebooting as asked"}});
  plan->callback([&chosen, o] {
    chosen.run = [o] {
      auto p = tier_plan(*o);
      if (!p) return 2;
      return o->check_only ? check_plan(*o, *p) : run_plan(*o, *p);
    };
  });

  add_upgrade_guard_command(app, chosen);
}

}  // namespace factory::agent
