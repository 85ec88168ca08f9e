#include "common/cli/output.hpp"

#include <algorithm>
#include <ostream>

#include "common/cli/app.hpp"
#include "common/display.hpp"
#include "common/yaml_json.hpp"

namespace factory::cli {

CLI::Option* add_output_option(CLI::App& cmd, OutputFormat& out, bool allow_table) {
  if (!allow_table) out = OutputFormat::yaml;
  std::vector<std::string> names;
  if (allow_table) names.push_back("table");
  names.insert(names.end(), {"json", "yaml"});
  auto* opt = cmd.add_option_function<std::string>(
      "-o,--output",
      [&out](const std::string& v) {
        out = v == "table"  ? OutputFormat::table
              : v == "json" ? OutputFormat::json
                            : OutputFormat::yaml;
      },
      std::string("Output format (default: ") + (allow_table ? "table" : "yaml") + ")");
  return restrict_to(opt, names, "an output format");
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

}  // namespace factory::cli
