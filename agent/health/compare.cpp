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

namespace {

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\r')) s.pop_back();
  std::size_t i = 0;
  while (i < s.size() && s[i] == ' ') ++i;
  return s.substr(i);
}

std::optional<std::uint64_t> count_of(const std::string& v) {
  if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::stoull(v);
}

std::optional<bool> yes_no(const std::string& v) {
  if (v == "Yes") return true;
  if (v == "No") return false;
  return std::nullopt;
}

void add_to(std::optional<std::uint64_t>& total, const std::optional<std::uint64_t>& v) {
  if (!v) return;
  total = total.value_or(0) + *v;
}

}  // namespace

std::vector<SmiFaults> parse_nvidia_smi_q_faults(const std::string& q) {
  // The reason lines of `nvidia-smi -q` and NVML's bit for each.
  static const std::map<std::string, std::uint64_t> kReasonBits = {
      {"Idle", 0x1},
      {"Applications Clocks Setting", 0x2},
      {"SW Power Cap", 0x4},
      {"HW Slowdown", 0x8},
      {"Sync Boost", 0x10},
      {"SW Thermal Slowdown", 0x20},
      {"HW Thermal Slowdown", 0x40},
      {"HW Power Brake Slowdown", 0x80},
      {"Display Clock Setting", 0x100},
  };
  std::vector<SmiFaults> out;
  std::string section, sub;  // 4-space and 8-space headers
  bool reasons_na = false;
  std::istringstream in(q);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("GPU ", 0) == 0) {
      out.emplace_back();
      section.clear();
      sub.clear();
      reasons_na = false;
      continue;
    }
    if (out.empty() || line.empty()) continue;
    std::size_t indent = line.find_first_not_of(' ');
    if (indent == std::string::npos) continue;
    auto colon = line.find(" : ");
    std::string key = trimmed(line.substr(0, colon == std::string::npos ? line.size() : colon));
    std::string value = colon == std::string::npos ? "" : trimmed(line.substr(colon + 3));
    if (colon == std::string::npos) {  // a header
      if (indent == 4) {
        section = key;
        sub.clear();
      } else if (indent == 8) {
        sub = key;
      }
      continue;
    }
    SmiFaults& f = out.back();
    if (indent == 4 && key == "Serial Number") f.serial = value == "N/A" ? "" : value;
    if (section == "PCI" && key == "Replays Since Reset") f.replays = count_of(value);
    if ((section == "Clocks Event Reasons" || section == "Clocks Throttle Reasons") &&
        kReasonBits.count(key)) {
      if (value == "Active")
        f.reasons = f.reasons.value_or(0) | kReasonBits.at(key);
      else if (value == "Not Active")
        f.reasons = f.reasons.value_or(0);
      else
        reasons_na = true;
      if (reasons_na) f.reasons.reset();
    }
    if (section == "ECC Errors" && (sub == "Volatile" || sub == "Aggregate")) {
      bool vol = sub == "Volatile";
      auto n = count_of(value);
      if (key == "SRAM Correctable" || key == "DRAM Correctable")
        add_to(vol ? f.ecc_corrected_volatile : f.ecc_corrected_aggregate, n);
      if (key == "SRAM Uncorrectable Parity" || key == "SRAM Uncorrectable SEC-DED" ||
          key == "DRAM Uncorrectable")
        add_to(vol ? f.ecc_uncorrected_volatile : f.ecc_uncorrected_aggregate, n);
    }
    if (section == "Retired Pages") {
      if (key == "Single Bit ECC") f.retired_sbe = count_of(value);
      if (key == "Double Bit ECC") f.retired_dbe = count_of(value);
      if (key == "Pending Page Blacklist") f.retired_pending = yes_no(value);
    }
    if (section == "Remapped Rows") {
      if (key == "Correctable Error") f.remapped_correctable = count_of(value);
      if (key == "Uncorrectable Error") f.remapped_uncorrectable = count_of(value);
      if (key == "Pending") f.remapped_pending = yes_no(value);
      if (key == "Remapping Failure Occurred") f.remap_failure = yes_no(value);
    }
  }
  return out;
}

void compare_faults(SmiComparison& out, const json& agent_health, const std::vector<SmiFaults>& q) {
  json agent_gpus = json::array();
  if (agent_health.is_object() && agent_health.contains("gpu") && agent_health["gpu"].is_object())
    agent_gpus = agent_health["gpu"].value("gpus", json::array());
  if (agent_gpus.size() != q.size())
    out.problems.push_back("the agent sees " + std::to_string(agent_gpus.size()) +
                           " GPU(s), nvidia-smi -q " + std::to_string(q.size()));
  auto opt = [](const auto& v) { return v ? json(*v) : json(); };
  const Tolerance exact{0, 0, "exact"};
  for (std::size_t i = 0; i < q.size() && i < agent_gpus.size(); ++i) {
    const SmiFaults& s = q[i];
    const json& a = agent_gpus[i];
    const int gpu = static_cast<int>(i);
    auto one = [&](const char* figure, const char* key, const json& smi) {
      check(out, gpu, figure, "-q", a.value(key, json()), smi, exact);
    };
    one("Serial Number", "serial", s.serial.empty() ? json() : json(s.serial));
    one("PCI Replays Since Reset", "pcie_replay_count", opt(s.replays));
    one("Clocks Event Reasons", "clocks_event_reasons", opt(s.reasons));
    one("ECC Volatile Correctable", "ecc_errors_corrected_volatile", opt(s.ecc_corrected_volatile));
    one("ECC Volatile Uncorrectable", "ecc_errors_uncorrected_volatile",
        opt(s.ecc_uncorrected_volatile));
    one("ECC Aggregate Correctable", "ecc_errors_corrected_aggregate",
        opt(s.ecc_corrected_aggregate));
    one("ECC Aggregate Uncorrectable", "ecc_errors_uncorrected_aggregate",
        opt(s.ecc_uncorrected_aggregate));
    one("Retired Pages Single Bit ECC", "retired_pages_sbe", opt(s.retired_sbe));
    one("Retired Pages Double Bit ECC", "retired_pages_dbe", opt(s.retired_dbe));
    one("Retired Pages Pending", "retired_pages_pending", opt(s.retired_pending));
    one("Remapped Rows Correctable", "remapped_rows_correctable", opt(s.remapped_correctable));
    one("Remapped Rows Uncorrectable", "remapped_rows_uncorrectable",
        opt(s.remapped_uncorrectable));
    one("Remapped Rows Pending", "remapped_rows_pending", opt(s.remapped_pending));
    one("Remapping Failure Occurred", "remapped_rows_failure", opt(s.remap_failure));
  }
}

}  // namespace factory::agent
