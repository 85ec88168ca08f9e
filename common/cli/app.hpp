#pragma once
// The command-line habits `factory` and `factory-agent` share, so someone who
// learned one reads the other:
//   - exit status 0 success, 1 error, 2 usage: a bad flag or a missing
//     argument exits 2, never with CLI11's own codes (104-109);
//   - a usage error is one line on stderr,
//     "<program>: <what>; see `<command> --help`";
//   - help names options as "-o, --output table|json|yaml", a subcommand's
//     help lists the options of the commands above it too (fallthrough lets
//     them follow the subcommand), and the usage line says the program's
//     name, not the path it was started by.
#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace factory::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;
inline constexpr int kExitUsage = 2;

// Gives app and every subcommand it has the help layout and the usage-error
// line above. Subcommands added later inherit them from their parent.
void apply_conventions(CLI::App& app);

// Parses the command line. nullopt: go on and run the command; otherwise
// the exit status to leave with, after what it printed (0 for --help and
// --version, kExitUsage for a usage error).
std::optional<int> parse(CLI::App& app, int argc, char** argv);

// --log-level LEVEL, refused at parse time unless it is one of kLogLevels
// (common/log.hpp).
CLI::Option* add_log_level_option(CLI::App& app, std::string& level,
                                  const std::string& description);

// The "Examples:" section at the end of a command's help: each pair is a
// command line and what it does (printed as a comment above it).
void set_examples(CLI::App& cmd, const std::vector<std::pair<std::string, std::string>>& examples);

// Limits an option to a few words (-o uses it): lower-cases the value
// and refuses one outside `choices` with "<value> is not <what> (one of a,
// b, c)". Help shows choices joined by '|' in place of CLI11's type name.
CLI::Option* restrict_to(CLI::Option* opt, const std::vector<std::string>& choices,
                         const std::string& what);

}  // namespace factory::cli
