#include "agent/cli/local_commands.hpp"

#include <iostream>
#include <sstream>

#include "agent/guest/cluster.hpp"
#include "agent/health/compare.hpp"
#include "agent/health/nvml.hpp"
#include "agent/health/report.hpp"
#include "agent/plan/engine.hpp"
#include "agent/plan/plan_spec.hpp"
#include "agent/steps/builtin.hpp"
#include "common/atomic_file.hpp"
#include "common/catalog.hpp"
#include "common/yaml_json.hpp"

namespace factory::agent {

namespace {

struct Opts {
  std::string root = "/";
  std::string state_dir = "/var/lib/factory-agent/local";
  std::string ollama_url = "http://127.0.0.1:11434";
  std::string tier = "gpu-vm";
  std::string catalog;
  std::string output = "text";
  bool check_only = false;
  bool reboot = false;
  bool raw = false;
  bool tier_given = false;
  // health-compare
  std::string agent_json, query_csv, q_memory;
  std::string fields =
      "memory.total,memory.used,memory.reserved,memory.free,utilization.gpu,"
      "temperature.gpu,power.draw,clocks.sm,clocks.mem,pstate,mig.mode.current";
};

GuestEnv env_of(const Opts& o) {
  GuestEnv e;
  e.root = o.root;
  e.state_dir = o.state_dir;
  e.ollama_url = o.ollama_url;
  return e;
}

void print(const nlohmann::json& j, const std::string& fmt) {
  if (fmt == "yaml")
    std::cout << to_yaml(j);
  else
    std::cout << j.dump(2) << "\n";
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
  if (o.output == "text") {
    std::cout << "tier " << spec->tier << " (plan " << spec->hash.substr(0, 12) << ")\n";
    for (auto& r : steps) {
      std::cout << "  " << r["id"].get<std::string>() << ": " << r["state"].get<std::string>();
      if (r.contains("message")) std::cout << " - " << r["message"].get<std::string>();
      std::cout << "\n";
      if (r.contains("diagnosis"))
        std::cout << "    diagnosis " << r["diagnosis"]["code"].get<std::string>() << ": "
                  << r["diagnosis"]["summary"].get<std::string>()
                  << "\n    fix: " << r["diagnosis"]["fix"].get<std::string>() << "\n";
    }
  } else {
    print(out, o.output);
  }
  return all_done ? 0 : 1;
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
  health->add_option("--tier", o->tier, "Catalog tier whose health section chooses the collectors")
      ->each([o](const std::string&) { o->tier_given = true; });
  health->add_option("--catalog", o->catalog, "Catalog file (default: the built-in catalog)");
  health->add_flag("--raw", o->raw,
                   "Add NVML's memory info in bytes (v1 and v2) as `nvml_raw`, to check the MiB "
                   "figures against nvidia-smi's");
  health->add_option("-o,--output", o->output, "json|yaml")
      ->check(CLI::IsMember({"json", "yaml", "text"}));
  health->callback([&chosen, o] {
    chosen.run = [o] {
      GuestEnv env = env_of(*o);
      HealthCollectors c;
      if (o->tier_given) {
        auto cat = o->catalog.empty() ? catalog::builtin() : catalog::load_file(o->catalog);
        if (!cat) {
          std::cerr << "factory-agent: " << cat.error().message << "\n";
          return 2;
        }
        auto p = catalog::plan_for(*cat, o->tier);
        if (!p) {
          std::cerr << "factory-agent: " << p.error().message << "\n";
          return 2;
        }
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
      print(h, o->output == "text" ? "json" : o->output);
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
  cmp->add_option("-o,--output", o->output, "text|json")->check(CLI::IsMember({"json", "text"}));
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
      if (o->output == "json")
        std::cout << result.to_json().dump(2) << "\n";
      else
        std::cout << result.to_text();
      return result.ok() ? 0 : 1;
    };
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
  plan->add_option("-o,--output", o->output, "text|json|yaml (with --check-only)")
      ->check(CLI::IsMember({"json", "yaml", "text"}));
  plan->callback([&chosen, o] {
    chosen.run = [o] {
      auto cat = o->catalog.empty() ? catalog::builtin() : catalog::load_file(o->catalog);
      if (!cat) {
        std::cerr << "factory-agent: " << cat.error().message << "\n";
        return 2;
      }
      auto p = catalog::plan_for(*cat, o->tier);
      if (!p) {
        std::cerr << "factory-agent: " << p.error().message << "\n";
        return 2;
      }
      return o->check_only ? check_plan(*o, *p) : run_plan(*o, *p);
    };
  });
}

}  // namespace factory::agent
