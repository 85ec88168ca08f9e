#pragma once
// How commands print: `-o table|json|yaml` for every command that prints
// objects, as kubectl does, and the cells of its tables.
#include <CLI/CLI.hpp>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace factory::cli {

enum class OutputFormat { table, json, yaml };

// Adds `-o,--output` accepting the given formats (table first is the default).
CLI::Option* add_output_option(CLI::App& cmd, OutputFormat& out, bool allow_table = true);

// A plain column-aligned table like kubectl's: upper-case headers, three
// spaces between columns. Every cell passes through display::sanitize
// (common/display.hpp) first: cells carry what guests reported (hostnames,
// versions, step messages), and a table is what lands on the admin's terminal.
void print_table(std::ostream& os, const std::vector<std::string>& headers,
                 const std::vector<std::vector<std::string>>& rows);

// Text for a terminal that is not a table cell (a `tenant show` line, a
// progress line, an error): the same sanitizer as the table's cells.
std::string display_text(const std::string& text);

// Prints doc as pretty JSON or YAML; returns false for table (caller prints its own).
bool print_document(std::ostream& os, OutputFormat fmt, const nlohmann::json& doc);

// A table cell for how long ago an RFC 3339 time was ("5m" + suffix): "-"
// when there is none, the text as it is when it is not a time.
std::string age(const std::string& rfc3339, const std::string& suffix = "");

}  // namespace factory::cli
