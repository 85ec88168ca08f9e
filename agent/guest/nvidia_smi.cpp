#include "agent/guest/nvidia_smi.hpp"

#include <algorithm>
#include <boost/property_tree/ptree.hpp>
#include <boost/property_tree/xml_parser.hpp>
#include <cctype>
#include <regex>
#include <sstream>

#include "agent/guest/mig.hpp"
#include "common/subprocess.hpp"

namespace factory::agent {

namespace {

std::string one_line(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  for (auto& c : s)
    if (c == '\n') c = ' ';
  return s;
}

std::string smi_trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(smi_trim(cur));
  if (!s.empty() && s.back() == sep) out.emplace_back();
  return out;
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    out.push_back(line);
  }
  return out;
}

// nvidia-smi writes "[N/A]", "N/A", "[Not Supported]" or "[Unknown Error]"
// where it has no value; those are unknown, not zero.
bool unknown_value(const std::string& v) {
  return v.empty() || v == "N/A" || v.front() == '[';
}

// "143771 MiB" / "39 C" / "0 %" / "143771" -> leading number.
template <class T>
std::optional<T> number(const std::string& raw) {
  std::string v = smi_trim(raw);
  if (unknown_value(v)) return std::nullopt;
  size_t i = 0;
  while (i < v.size() && (std::isdigit(static_cast<unsigned char>(v[i])) || v[i] == '.')) ++i;
  if (i == 0) return std::nullopt;
  try {
    return static_cast<T>(std::stod(v.substr(0, i)));
  } catch (...) {
    return std::nullopt;
  }
}

std::string text(const std::string& raw) {
  std::string v = smi_trim(raw);
  return unknown_value(v) ? std::string() : v;
}

// Applies one named query value to a reading (or the report's driver version).
// Names as --query-gpu takes them, with the aliases nvidia-smi accepts and
// prints in its header ("clocks.current.sm [MHz]" for clocks.sm).
void apply_field(const std::string& field, const std::string& value, GpuReading& g,
                 std::string& driver_version) {
  if (field == "index")
    g.index = number<int>(value).value_or(g.index);
  else if (field == "name" || field == "gpu_name")
    g.name = text(value);
  else if (field == "uuid" || field == "gpu_uuid")
    g.uuid = text(value);
  else if (field == "pci.bus_id" || field == "gpu_bus_id")
    g.pci_bus_id = text(value);
  else if (field == "memory.total")
    g.memory_total_mib = number<std::uint64_t>(value);
  else if (field == "memory.used")
    g.memory_used_mib = number<std::uint64_t>(value);
  else if (field == "memory.free")
    g.memory_free_mib = number<std::uint64_t>(value);
  else if (field == "memory.reserved")
    g.memory_reserved_mib = number<std::uint64_t>(value);
  else if (field == "temperature.gpu")
    g.temperature_c = number<int>(value);
  else if (field == "temperature.memory")
    g.memory_temperature_c = number<int>(value);
  else if (field == "utilization.gpu")
    g.utilization_percent = number<int>(value);
  else if (field == "utilization.memory")
    g.memory_utilization_percent = number<int>(value);
  else if (field == "power.draw")
    g.power_draw_w = number<double>(value);
  else if (field == "power.limit" || field == "enforced.power.limit")
    g.power_limit_w = number<double>(value);
  else if (field == "clocks.sm" || field == "clocks.current.sm")
    g.sm_clock_mhz = number<int>(value);
  else if (field == "clocks.mem" || field == "clocks.current.memory")
    g.memory_clock_mhz = number<int>(value);
  else if (field == "pstate")
    g.pstate = text(value);
  else if (field == "ecc.errors.uncorrected.volatile.total")
    g.ecc_errors_uncorrected_volatile = number<std::uint64_t>(value);
  else if (field == "mig.mode.current")
    g.mig_mode = text(value);
  else if (field == "driver_version") {
    std::string v = text(value);
    if (!v.empty()) driver_version = v;
  }
}

}  // namespace

proto::GpuSection GpuReport::section() const {
  proto::GpuSection s;
  s.source = source;
  s.driver_version = driver_version;
  s.cuda_driver_version = cuda_driver_version;
  s.gpus = gpus;
  return s;
}

const std::vector<std::string>& nvidia_smi_query_fields() {
  static const std::vector<std::string> fields = {"index",
                                                  "name",
                                                  "uuid",
                                                  "pci.bus_id",
                                                  "driver_version",
                                                  "memory.total",
                                                  "memory.reserved",
                                                  "memory.used",
                                                  "memory.free",
                                                  "utilization.gpu",
                                                  "utilization.memory",
                                                  "temperature.gpu",
                                                  "temperature.memory",
                                                  "power.draw",
                                                  "power.limit",
                                                  "clocks.sm",
                                                  "clocks.mem",
                                                  "pstate",
                                                  "ecc.errors.uncorrected.volatile.total",
                                                  "mig.mode.current"};
  return fields;
}

const std::vector<std::string>& nvidia_smi_basic_query_fields() {
  static const std::vector<std::string> fields = {
      "index",          "name",        "uuid",           "pci.bus_id",
      "memory.total",   "memory.used", "driver_version", "temperature.gpu",
      "utilization.gpu"};
  return fields;
}

std::vector<std::string> nvidia_smi_query_args(const std::vector<std::string>& f) {
  std::string q = "--query-gpu=";
  for (size_t i = 0; i < f.size(); ++i) q += (i ? "," : "") + f[i];
  return {q, "--format=csv,noheader,nounits"};
}

Result<GpuReport> parse_nvidia_smi_csv(const std::string& output,
                                       const std::vector<std::string>& fields) {
  GpuReport report;
  report.source = "nvidia-smi";
  int line_no = 0;
  for (const auto& line : lines_of(output)) {
    ++line_no;
    if (smi_trim(line).empty()) continue;
    auto values = split(line, ',');
    if (values.size() != fields.size())
      return Error(Errc::protocol, "nvidia-smi csv line " + std::to_string(line_no) + " has " +
                                       std::to_string(values.size()) + " values, expected " +
                                       std::to_string(fields.size()) + ": " + line);
    GpuReading g;
    g.index = static_cast<int>(report.gpus.size());
    for (size_t i = 0; i < fields.size(); ++i)
      apply_field(fields[i], values[i], g, report.driver_version);
    report.gpus.push_back(std::move(g));
  }
  return report;
}

Result<GpuReport> parse_nvidia_smi_csv_with_header(const std::string& output) {
  auto lines = lines_of(output);
  size_t first = 0;
  while (first < lines.size() && smi_trim(lines[first]).empty()) ++first;
  if (first == lines.size()) return Error(Errc::protocol, "nvidia-smi csv output is empty");
  std::vector<std::string> fields;
  for (auto& h : split(lines[first], ',')) {
    auto sp = h.find(" [");  // "memory.total [MiB]"
    fields.push_back(sp == std::string::npos ? h : h.substr(0, sp));
  }
  std::string rest;
  for (size_t i = first + 1; i < lines.size(); ++i) rest += lines[i] + "\n";
  return parse_nvidia_smi_csv(rest, fields);
}

Result<GpuReport> parse_nvidia_smi_xml(const std::string& xml) {
  namespace pt = boost::property_tree;
  pt::ptree tree;
  try {
    std::istringstream in(xml);
    pt::read_xml(in, tree, pt::xml_parser::trim_whitespace);
  } catch (const pt::xml_parser_error& e) {
    return Error(Errc::protocol, std::string("nvidia-smi -q -x: not valid XML: ") + e.what());
  }
  auto log = tree.get_child_optional("nvidia_smi_log");
  if (!log) return Error(Errc::protocol, "nvidia-smi -q -x: no <nvidia_smi_log> element");
  GpuReport report;
  report.source = "nvidia-smi";
  report.driver_version = text(log->get<std::string>("driver_version", ""));
  report.cuda_driver_version = text(log->get<std::string>("cuda_version", ""));
  for (const auto& [tag, gpu] : *log) {
    if (tag != "gpu") continue;
    GpuReading g;
    g.index = static_cast<int>(report.gpus.size());
    g.name = text(gpu.get<std::string>("product_name", ""));
    g.uuid = text(gpu.get<std::string>("uuid", ""));
    g.pci_bus_id =
        text(gpu.get<std::string>("pci.pci_bus_id", gpu.get<std::string>("<xmlattr>.id", "")));
    // A named reference: clang 14 cannot capture a structured binding.
    const auto& node = gpu;
    auto at = [&node](const char* path) { return node.get<std::string>(path, ""); };
    g.minor_number = number<int>(at("minor_number"));
    g.memory_total_mib = number<std::uint64_t>(at("fb_memory_usage.total"));
    g.memory_reserved_mib = number<std::uint64_t>(at("fb_memory_usage.reserved"));
    g.memory_used_mib = number<std::uint64_t>(at("fb_memory_usage.used"));
    g.memory_free_mib = number<std::uint64_t>(at("fb_memory_usage.free"));
    g.temperature_c = number<int>(at("temperature.gpu_temp"));
    g.memory_temperature_c = number<int>(at("temperature.memory_temp"));
    g.utilization_percent = number<int>(at("utilization.gpu_util"));
    g.memory_utilization_percent = number<int>(at("utilization.memory_util"));
    // Newer drivers split power into gpu_power_readings / module_power_readings
    // with average and instant draws; older ones have power_readings.power_draw.
    // nvidia-smi's power.draw is the average where both exist.
    g.power_draw_w = number<double>(at("gpu_power_readings.average_power_draw"));
    if (!g.power_draw_w) g.power_draw_w = number<double>(at("gpu_power_readings.power_draw"));
    if (!g.power_draw_w) g.power_draw_w = number<double>(at("power_readings.power_draw"));
    g.power_limit_w = number<double>(at("gpu_power_readings.current_power_limit"));
    if (!g.power_limit_w) g.power_limit_w = number<double>(at("power_readings.power_limit"));
    g.sm_clock_mhz = number<int>(at("clocks.sm_clock"));
    g.memory_clock_mhz = number<int>(at("clocks.mem_clock"));
    g.pstate = text(at("performance_state"));
    // ecc.errors.uncorrected.volatile.total: the uncorrectable counts of
    // DRAM and SRAM (Hopper on), or the older layout's double_bit total.
    for (const char* part :
         {"ecc_errors.volatile.dram_uncorrectable", "ecc_errors.volatile.sram_uncorrectable_parity",
          "ecc_errors.volatile.sram_uncorrectable_secded", "ecc_errors.volatile.sram_uncorrectable",
          "ecc_errors.volatile.double_bit.total"})
      if (auto n = number<std::uint64_t>(at(part)))
        g.ecc_errors_uncorrected_volatile = g.ecc_errors_uncorrected_volatile.value_or(0) + *n;
    g.mig_mode = text(at("mig_mode.current_mig"));
    if (auto procs = gpu.get_child_optional("processes")) {
      for (const auto& [ptag, p] : *procs) {
        if (ptag != "process_info") continue;
        proto::GpuProcessSample ps;
        auto pid = number<std::uint32_t>(p.get<std::string>("pid", ""));
        if (!pid) continue;
        ps.pid = *pid;
        ps.name = text(p.get<std::string>("process_name", ""));
        ps.used_memory_mib = number<std::uint64_t>(p.get<std::string>("used_memory", ""));
        g.processes.push_back(std::move(ps));
      }
    }
    report.gpus.push_back(std::move(g));
  }
  return report;
}

Result<GpuReport> parse_nvidia_smi_table(const std::string& output) {
  GpuReport report;
  report.source = "nvidia-smi";
  static const std::regex version_re(R"((?:Driver|KMD) Version:\s*([0-9][0-9.]*))");
  // "CUDA Version: 13.0"; the newer header says "CUDA UMD Version: 13.4".
  static const std::regex cuda_re(R"(CUDA (?:UMD )?Version:\s*([0-9][0-9.]*))");
  // The second row's "P8             17W /   72W".
  static const std::regex power_re(R"(\s(P\d{1,2})\s+(\d+|N/A)W?\s*/\s*(\d+|N/A)W?\s*\|)");
  // "|   0  NVIDIA L4                      On  |   00000000:09:00.0 Off |   0 |"
  static const std::regex first_re(
      R"(^\|\s+(\d+)\s+(.+?)\s+(On|Off)\s+\|\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]))");
  // "| N/A   47C    P8             17W /   72W |       0MiB /  23034MiB |      0%      Default |"
  static const std::regex second_re(
      R"(^\|\s+\S+\s+(\d+|N/A)C?\s+\S+\s+.*\|\s+(\d+)MiB\s+/\s+(\d+)MiB\s+\|\s+(\d+|N/A)%?)");
  auto lines = lines_of(output);
  bool in_gpus = false;
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto& line = lines[i];
    std::smatch m;
    if (report.driver_version.empty() && std::regex_search(line, m, version_re)) {
      report.driver_version = m[1];
      if (std::regex_search(line, m, cuda_re)) report.cuda_driver_version = m[1];
      continue;
    }
    if (line.rfind("|====", 0) == 0) {
      // "|===" closes the GPU table's header; the processes table that
      // follows has its own, but we stop at its "Processes:" title first.
      in_gpus = true;
      continue;
    }
    if (line.find("Processes:") != std::string::npos) break;
    if (!in_gpus || !std::regex_search(line, m, first_re)) continue;
    GpuReading g;
    g.index = std::stoi(m[1]);
    g.name = smi_trim(m[2]);
    g.pci_bus_id = m[4];
    if (i + 1 < lines.size() && std::regex_search(lines[i + 1], m, power_re)) {
      g.pstate = m[1];
      g.power_draw_w = number<double>(m[2]);
      g.power_limit_w = number<double>(m[3]);
    }
    if (i + 1 < lines.size() && std::regex_search(lines[i + 1], m, second_re)) {
      g.temperature_c = number<int>(m[1]);
      g.memory_used_mib = number<std::uint64_t>(m[2]);
      g.memory_total_mib = number<std::uint64_t>(m[3]);
      g.utilization_percent = number<int>(m[4]);
      ++i;
    }
    report.gpus.push_back(std::move(g));
  }
  if (report.driver_version.empty())
    return Error(Errc::protocol, "nvidia-smi table: no driver version in the header");
  return report;
}

std::vector<GpuReading> parse_nvidia_smi_list(const std::string& output) {
  static const std::regex re(R"(^GPU (\d+): (.+?) \(UUID: ([^)]+)\))");
  std::vector<GpuReading> out;
  for (const auto& line : lines_of(output)) {
    std::smatch m;
    if (!std::regex_search(line, m, re)) continue;
    GpuReading g;
    g.index = std::stoi(m[1]);
    g.name = m[2];
    g.uuid = m[3];
    out.push_back(std::move(g));
  }
  return out;
}

void apply_nvidia_smi_compute_apps(const std::string& output, std::vector<GpuReading>& gpus) {
  for (const auto& line : lines_of(output)) {
    auto v = split(line, ',');
    if (v.size() < 4) continue;
    // A process name may itself hold commas: it is everything between the
    // pid and the last value.
    std::string name = v[2];
    for (size_t i = 3; i + 1 < v.size(); ++i) name += "," + v[i];
    auto pid = number<std::uint32_t>(v[1]);
    if (!pid || *pid == 0) continue;
    for (auto& g : gpus) {
      if (g.uuid.empty() || g.uuid != text(v[0])) continue;
      proto::GpuProcessSample p;
      p.pid = *pid;
      p.name = text(name);
      p.used_memory_mib = number<std::uint64_t>(v.back());
      g.processes.push_back(std::move(p));
    }
  }
}

std::vector<FbMemory> parse_nvidia_smi_q_memory(const std::string& output) {
  std::vector<FbMemory> out;
  bool in_fb = false;
  size_t fb_indent = 0;
  for (const auto& line : lines_of(output)) {
    size_t indent = line.find_first_not_of(' ');
    if (indent == std::string::npos) continue;
    std::string t = smi_trim(line);
    if (t == "FB Memory Usage") {
      in_fb = true;
      fb_indent = indent;
      out.emplace_back();
      continue;
    }
    if (!in_fb) continue;
    if (indent <= fb_indent) {  // the next block ("BAR1 Memory Usage")
      in_fb = false;
      continue;
    }
    auto colon = t.find(':');
    if (colon == std::string::npos) continue;
    std::string key = smi_trim(t.substr(0, colon));
    auto value = number<std::uint64_t>(t.substr(colon + 1));
    FbMemory& m = out.back();
    if (key == "Total")
      m.total = value;
    else if (key == "Reserved")
      m.reserved = value;
    else if (key == "Used")
      m.used = value;
    else if (key == "Free")
      m.free = value;
  }
  return out;
}

namespace {

Result<CommandResult> run_nvidia_smi(const std::vector<std::string>& prefix,
                                     const std::vector<std::string>& args,
                                     std::chrono::milliseconds timeout) {
  CommandSpec spec;
  spec.argv = prefix;
  spec.argv.push_back("nvidia-smi");
  for (auto& a : args) spec.argv.push_back(a);
  spec.timeout = timeout;
  return run_command(spec);
}

}  // namespace

Result<GpuReport> query_nvidia_smi(const std::vector<std::string>& prefix,
                                   std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto left = [&] {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::duration_cast<std::chrono::milliseconds>(
                        deadline - std::chrono::steady_clock::now()));
  };
  const std::vector<std::string>* fields = &nvidia_smi_query_fields();
  auto r = run_nvidia_smi(prefix, nvidia_smi_query_args(*fields), left());
  if (!r) return r.error();
  // An nvidia-smi older than the field list names the field it does not know.
  if (!r->ok() && !r->timed_out && r->output.find("is not a valid field") != std::string::npos) {
    fields = &nvidia_smi_basic_query_fields();
    r = run_nvidia_smi(prefix, nvidia_smi_query_args(*fields), left());
    if (!r) return r.error();
  }
  if (!r->ok())
    return Error(r->timed_out ? Errc::timeout : Errc::failed_precondition,
                 "nvidia-smi " + r->describe() + ": " + one_line(r->tail(3)));
  auto report = parse_nvidia_smi_csv(r->output, *fields);
  if (!report) return report;
  // The processes are a second query; without them the figures still stand.
  auto apps = run_nvidia_smi(prefix,
                             {"--query-compute-apps=gpu_uuid,pid,process_name,used_memory",
                              "--format=csv,noheader,nounits"},
                             left());
  if (apps && apps->ok()) apply_nvidia_smi_compute_apps(apps->output, report->gpus);
  add_mig_instances(report->gpus, prefix, left());
  return report;
}

}  // namespace factory::agent
