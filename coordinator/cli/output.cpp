#include "coordinator/cli/output.hpp"

#include <algorithm>
#include <ostream>

#include "common/display.hpp"
#include "common/durations.hpp"
#include "common/yaml_json.hpp"

namespace factory::cli {

CLI::Option* add_output_option(CLI::App& cmd, OutputFormat& out, bool allow_table) {
  std::map<std::string, OutputFormat> m{{"json", OutputFormat::json}, {"yaml", OutputFormat::yaml}};
  if (allow_table)
    m["table"] = OutputFormat::table;
  else
    out = OutputFormat::yaml;
  return cmd
      .add_option("-o,--output", out,
                  allow_table ? "Output format: table|json|yaml" : "Output format: json|yaml")
      ->transform(CLI::CheckedTransformer(m, CLI::ignore_case));
}

void print_table(std::ostream& os, const std::vector<std::string>& headers,
                 const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::vector<std::string>> clean;
  clean.reserve(rows.size());
  for (const auto& r : rows) {
    std::vector<std::string> c;
    c.reserve(r.size());
    for (const auto& cell : r) c.push_back(display::sanitize(cell));
    clean.push_back(std::move(c));
  }
  std::vector<size_t> w(headers.size());
  for (size_t i = 0; i < headers.size(); ++i) w[i] = display::columns(headers[i]);
  for (auto& r : clean)
    for (size_t i = 0; i < r.size() && i < w.size(); ++i)
      w[i] = std::max(w[i], display::columns(r[i]));
  auto line = [&](const std::vector<std::string>& cells, bool upper) {
    std::string s;
    for (size_t i = 0; i < w.size(); ++i) {
      std::string c = i < cells.size() ? cells[i] : "";
      if (upper) std::transform(c.begin(), c.end(), c.begin(), ::toupper);
      s += c;
      if (i + 1 < w.size()) s += std::string(w[i] - display::columns(c) + 3, ' ');
    }
    while (!s.empty() && s.back() == ' ') s.pop_back();
    os << s << "\n";
  };
  line(headers, true);
  for (auto& r : clean) line(r, false);
}

std::string display_text(const std::string& text) {
  return display::sanitize(text);
}

bool print_document(std::ostream& os, OutputFormat fmt, const nlohmann::json& doc) {
  switch (fmt) {
    case OutputFormat::json:
      os << doc.dump(2) << "\n";
      return true;
    case OutputFormat::yaml:
      os << to_yaml(doc);
      return true;
    case OutputFormat::table:
      return false;
  }
  return false;
}

std::string age(const std::string& rfc3339, const std::string& suffix) {
  if (rfc3339.empty()) return "-";
  auto t = parse_rfc3339(rfc3339);
  if (!t) return rfc3339;
  auto d = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - *t);
  return format_duration(std::max(d, std::chrono::seconds(0))) + suffix;
}

}  // namespace factory::cli
