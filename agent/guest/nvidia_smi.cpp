#include "agent/guest/nvidia_smi.hpp"

#include <algorithm>
#include <boost/property_tree/ptree.hpp>
#include <boost/property_tree/xml_parser.hpp>
#include <cctype>
#include <regex>
#include <sstream>

#include "common/subprocess.hpp"

namespace factory::agent {

namespace {

std::string one_line(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  for (auto& c : s)
    if (c == '\n') c = ' ';
  return s;
}

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(trim(cur));
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
  std::string v = trim(raw);
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
  std::string v = trim(raw);
  return unknown_value(v) ? std::string() : v;
}

// Applies one named query value to a reading (or the report's driver version).
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
  else if (field == "temperature.gpu")
    g.temperature_c = number<int>(value);
  else if (field == "utilization.gpu")
    g.utilization_percent = number<int>(value);
  else if (field == "driver_version") {
    std::string v = text(value);
    if (!v.empty()) driver_version = v;
  }
}

}  // namespace

nlohmann::json GpuReading::to_json() const {
  auto opt = [](const auto& o) -> nlohmann::json {
    if (o) return *o;
    return nullptr;
  };
  return {{"index", index},
          {"name", name},
          {"uuid", uuid.empty() ? nlohmann::json(nullptr) : nlohmann::json(uuid)},
          {"pci_bus_id", pci_bus_id},
          {"memory_total_mib", opt(memory_total_mib)},
          {"memory_used_mib", opt(memory_used_mib)},
          {"temperature_c", opt(temperature_c)},
          {"utilization_percent", opt(utilization_percent)}};
}

nlohmann::json GpuReport::to_json() const {
  nlohmann::json g = nlohmann::json::array();
  for (const auto& r : gpus) g.push_back(r.to_json());
  return {{"source", source}, {"driver_version", driver_version}, {"gpus", std::move(g)}};
}

const std::vector<std::string>& nvidia_smi_query_fields() {
  static const std::vector<std::string> fields = {
      "index",          "name",        "uuid",           "pci.bus_id",
      "memory.total",   "memory.used", "driver_version", "temperature.gpu",
      "utilization.gpu"};
  return fields;
}

std::vector<std::string> nvidia_smi_query_args() {
  std::string q = "--query-gpu=";
  const auto& f = nvidia_smi_query_fields();
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
    if (trim(line).empty()) continue;
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
  while (first < lines.size() && trim(lines[first]).empty()) ++first;
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
  for (const auto& [tag, gpu] : *log) {
    if (tag != "gpu") continue;
    GpuReading g;
    g.index = static_cast<int>(report.gpus.size());
    g.name = text(gpu.get<std::string>("product_name", ""));
    g.uuid = text(gpu.get<std::string>("uuid", ""));
    g.pci_bus_id =
        text(gpu.get<std::string>("pci.pci_bus_id", gpu.get<std::string>("<xmlattr>.id", "")));
    g.memory_total_mib = number<std::uint64_t>(gpu.get<std::string>("fb_memory_usage.total", ""));
    g.memory_used_mib = number<std::uint64_t>(gpu.get<std::string>("fb_memory_usage.used", ""));
    g.temperature_c = number<int>(gpu.get<std::string>("temperature.gpu_temp", ""));
    g.utilization_percent = number<int>(gpu.get<std::string>("utilization.gpu_util", ""));
    report.gpus.push_back(std::move(g));
  }
  return report;
}

Result<GpuReport> parse_nvidia_smi_table(const std::string& output) {
  GpuReport report;
  report.source = "nvidia-smi";
  static const std::regex version_re(R"((?:Driver|KMD) Version:\s*([0-9][0-9.]*))");
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
    g.name = trim(m[2]);
    g.pci_bus_id = m[4];
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

Result<GpuReport> query_nvidia_smi(const std::vector<std::string>& prefix,
                                   std::chrono::milliseconds timeout) {
  CommandSpec spec;
  spec.argv = prefix;
  spec.argv.push_back("nvidia-smi");
  for (auto& a : nvidia_smi_query_args()) spec.argv.push_back(a);
  spec.timeout = timeout;
  auto r = run_command(spec);
  if (!r) return r.error();
  if (!r->ok())
    return Error(r->timed_out ? Errc::timeout : Errc::failed_precondition,
                 "nvidia-smi " + r->describe() + ": " + one_line(r->tail(3)));
  return parse_nvidia_smi_csv(r->output, nvidia_smi_query_fields());
}

}  // namespace factory::agent
