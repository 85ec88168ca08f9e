#include "agent/health/compare.hpp"

#include <cmath>
#include <iomanip>
#include <sstream>

namespace factory::agent {

using nlohmann::json;

const std::vector<std::pair<std::string, Tolerance>>& figure_tolerances() {
  // Memory is exact: the acceptance. The rest are read a second or two
  // apart by two programs, and an idle GPU moves its clocks and power the
  // moment something asks it anything.
  static const std::vector<std::pair<std::string, Tolerance>> t = {
      {"memory.total", {0, 0, "exact"}},
      {"memory.reserved", {0, 0, "exact"}},
      {"memory.used", {0, 0, "exact"}},
      {"memory.free", {0, 0, "exact"}},
      {"utilization.gpu", {10, 0, "+/-10 points"}},
      {"utilization.memory", {10, 0, "+/-10 points"}},
      {"temperature.gpu", {3, 0, "+/-3 C"}},
      {"temperature.memory", {3, 0, "+/-3 C"}},
      {"power.draw", {15, 0.10, "+/-15 W or 10%"}},
      {"power.limit", {0.5, 0, "+/-0.5 W"}},
      {"clocks.sm", {0, 0.20, "+/-20%"}},
      {"clocks.current.sm", {0, 0.20, "+/-20%"}},
      {"clocks.mem", {0, 0.05, "+/-5%"}},
      {"clocks.current.memory", {0, 0.05, "+/-5%"}},
      {"pstate", {0, 0, "exact"}},
      {"mig.mode.current", {0, 0, "exact"}},
      {"ecc.errors.uncorrected.volatile.total", {0, 0, "exact"}},
  };
  return t;
}

namespace {

// The agent's key for each figure, from the GPU's JSON.
const char* agent_key(const std::string& figure) {
  static const std::map<std::string, const char*> m = {
      {"memory.total", "memory_total_mib"},
      {"memory.reserved", "memory_reserved_mib"},
      {"memory.used", "memory_used_mib"},
      {"memory.free", "memory_free_mib"},
      {"utilization.gpu", "utilization_percent"},
      {"utilization.memory", "memory_utilization_percent"},
      {"temperature.gpu", "temperature_c"},
      {"temperature.memory", "memory_temperature_c"},
      {"power.draw", "power_draw_w"},
      {"power.limit", "power_limit_w"},
      {"clocks.sm", "sm_clock_mhz"},
      {"clocks.current.sm", "sm_clock_mhz"},
      {"clocks.mem", "memory_clock_mhz"},
      {"clocks.current.memory", "memory_clock_mhz"},
      {"pstate", "pstate"},
      {"mig.mode.current", "mig_mode"},
      {"ecc.errors.uncorrected.volatile.total", "ecc_errors_uncorrected_volatile"},
  };
  auto it = m.find(figure);
  return it == m.end() ? nullptr : it->second;
}

std::string show(const json& v) {
  if (v.is_null()) return "unknown";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) {
    std::ostringstream o;
    o << std::fixed << std::setprecision(2) << v.get<double>();
    return o.str();
  }
  return v.dump();
}

void check(SmiComparison& out, int gpu, const std::string& figure, const std::string& source,
           const json& agent, const json& smi, const Tolerance& tol) {
  FigureCheck c;
  c.gpu = gpu;
  c.figure = figure;
  c.source = source;
  c.agent = show(agent);
  c.nvidia_smi = show(smi);
  c.tolerance = tol.text;
  if (smi.is_null()) {
    // nvidia-smi itself has no value ([N/A]): the agent must not invent one.
    c.ok = agent.is_null();
  } else if (agent.is_null()) {
    c.ok = false;
  } else if (smi.is_number() && agent.is_number()) {
    double a = agent.get<double>(), s = smi.get<double>();
    double allowed = std::max(tol.absolute, tol.relative * std::fabs(s));
    c.ok = std::fabs(a - s) <= allowed + 1e-9;
  } else {
    c.ok = agent == smi;
  }
  out.checks.push_back(std::move(c));
}

}  // namespace

bool SmiComparison::ok() const {
  if (!problems.empty() || checks.empty()) return false;
  for (const auto& c : checks)
    if (!c.ok) return false;
  return true;
}

json SmiComparison::to_json() const {
  json cs = json::array();
  for (const auto& c : checks)
    cs.push_back({{"gpu", c.gpu},
                  {"figure", c.figure},
                  {"source", c.source},
                  {"agent", c.agent},
                  {"nvidia_smi", c.nvidia_smi},
                  {"tolerance", c.tolerance},
                  {"ok", c.ok}});
  return {{"verdict", ok() ? "agree" : "differ"}, {"checks", cs}, {"problems", problems}};
}

std::string SmiComparison::to_text() const {
  std::ostringstream o;
  o << std::left << std::setw(5) << "GPU" << std::setw(40) << "FIGURE" << std::setw(14) << "FROM"
    << std::setw(12) << "AGENT" << std::setw(12) << "NVIDIA-SMI" << std::setw(14) << "TOLERANCE"
    << "OK\n";
  for (const auto& c : checks)
    o << std::left << std::setw(5) << c.gpu << std::setw(40) << c.figure << std::setw(14)
      << c.source << std::setw(12) << c.agent << std::setw(12) << c.nvidia_smi << std::setw(14)
      << c.tolerance << (c.ok ? "yes" : "NO") << "\n";
  for (const auto& p : problems) o << "problem: " << p << "\n";
  size_t bad = 0;
  for (const auto& c : checks) bad += c.ok ? 0 : 1;
  if (ok())
    o << "VERDICT: agree (" << checks.size() << " figures; memory exact)\n";
  else
    o << "VERDICT: differ (" << bad << " of " << checks.size() << " figures outside tolerance"
      << (problems.empty() ? "" : ", " + std::to_string(problems.size()) + " problem(s)") << ")\n";
  return o.str();
}

SmiComparison compare_with_nvidia_smi(const json& agent_health, const GpuReport& smi,
                                      const std::vector<std::string>& fields,
                                      const std::vector<FbMemory>& memory) {
  SmiComparison out;
  json agent_gpus = json::array();
  if (agent_health.is_object() && agent_health.contains("gpu") && agent_health["gpu"].is_object() &&
      agent_health["gpu"].contains("gpus") && agent_health["gpu"]["gpus"].is_array())
    agent_gpus = agent_health["gpu"]["gpus"];
  else
    out.problems.push_back("the agent's output has no gpu.gpus list");
  if (agent_gpus.size() != smi.gpus.size())
    out.problems.push_back("the agent sees " + std::to_string(agent_gpus.size()) +
                           " GPU(s), nvidia-smi " + std::to_string(smi.gpus.size()));
  for (size_t i = 0; i < smi.gpus.size(); ++i) {
    const GpuReading& s = smi.gpus[i];
    const json* a = nullptr;
    for (const auto& g : agent_gpus)
      if (!s.uuid.empty() && g.value("uuid", json()).is_string() && g["uuid"] == s.uuid) a = &g;
    if (!a && i < agent_gpus.size()) a = &agent_gpus[i];
    if (!a) continue;
    const json sj = s.to_json();
    for (const auto& f : fields) {
      const char* key = agent_key(f);
      if (!key) continue;
      const Tolerance* tol = nullptr;
      for (const auto& [name, t] : figure_tolerances())
        if (name == f) tol = &t;
      if (!tol) continue;
      check(out, static_cast<int>(i), f, "query-gpu", a->value(key, json()), sj.value(key, json()),
            *tol);
    }
    if (i < memory.size()) {
      const FbMemory& m = memory[i];
      auto opt = [](const std::optional<std::uint64_t>& v) { return v ? json(*v) : json(); };
      const Tolerance exact{0, 0, "exact"};
      check(out, static_cast<int>(i), "FB Memory Total", "-q -d MEMORY",
            a->value("memory_total_mib", json()), opt(m.total), exact);
      check(out, static_cast<int>(i), "FB Memory Reserved", "-q -d MEMORY",
            a->value("memory_reserved_mib", json()), opt(m.reserved), exact);
      check(out, static_cast<int>(i), "FB Memory Used", "-q -d MEMORY",
            a->value("memory_used_mib", json()), opt(m.used), exact);
      check(out, static_cast<int>(i), "FB Memory Free", "-q -d MEMORY",
            a->value("memory_free_mib", json()), opt(m.free), exact);
    }
  }
  return out;
}

}  // namespace factory::agent
