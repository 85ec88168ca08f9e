#pragma once
// How both binaries print what a command found: `-o table|json|yaml` as
// kubectl has it (table for people, the same document as JSON or YAML for
// scripts), and the tables themselves.
#include <CLI/CLI.hpp>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace factory::cli {

enum class OutputFormat { table, json, yaml };

// -o, --output table|json|yaml (json|yaml without a table, and then yaml is
// the default); anything else is a usage error naming the choices.
CLI::Option* add_output_option(CLI::App& cmd, OutputFormat& out, bool allow_table = true);

// A plain column-aligned table like kubectl's: upper-case headers, columns
// three spaces apart. Every cell passes through display::sanitize
// (common/display.hpp) first: cells carry what guests reported (hostnames,
// versions, step messages), and a table is what lands on the admin's terminal.
void print_table(std::ostream& os, const std::vector<std::string>& headers,
                 const std::vector<std::vector<std::string>>& rows);

// Text for a terminal that is not a table cell (a `tenant show` line, a
// progress line, an error): the same sanitizer as the table's cells.
std::string display_text(const std::string& text);

// Prints doc as pretty JSON or YAML; returns false for table (caller prints its own).
bool print_document(std::ostream& os, OutputFormat fmt, const nlohmann::json& doc);

}  // namespace factory::cli
