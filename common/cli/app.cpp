#include "common/cli/app.hpp"

#include <algorithm>
#include <cctype>
#include <memory>
#include <sstream>

#include "common/log.hpp"

namespace factory::cli {

namespace {

// The full command a usage error is about ("factory tenant create"): the
// subcommands CLI11 had parsed when it gave up.
std::string command_of(const CLI::App* app) {
  std::string command = app->get_name();
  for (const CLI::App* a = app;;) {
    auto subs = a->get_subcommands();
    if (subs.empty()) break;
    a = subs.front();
    command += " " + a->get_name();
  }
  return command;
}

std::string usage_error(const CLI::App* app, const CLI::Error& e) {
  std::string what = e.what();
  // CLI11 starts most messages with a capital ("A subcommand is required");
  // after "factory: " the sentence goes on in lower case (but "URL" stays).
  if (what.size() > 1 && std::isupper(static_cast<unsigned char>(what[0])) &&
      !std::isupper(static_cast<unsigned char>(what[1])))
    what[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(what[0])));
  return app->get_name() + ": " + what + "; see `" + command_of(app) + " --help`\n";
}

class HelpFormatter : public CLI::Formatter {
 public:
  // "-o, --output" as most tools print it, not CLI11's "-o,--output".
  std::string make_option_name(const CLI::Option* opt, bool is_positional) const override {
    std::string name = CLI::Formatter::make_option_name(opt, is_positional);
    if (is_positional) return name;
    std::string out;
    for (char c : name) {
      out += c;
      if (c == ',') out += ' ';
    }
    return out;
  }

  std::string make_help(const CLI::App* app, std::string name,
                        CLI::AppFormatMode mode) const override {
    if (mode == CLI::AppFormatMode::Sub) return make_expanded(app);
    std::stringstream out;
    out << make_description(app) << make_usage(app, name) << make_positionals(app)
        << make_groups(app, mode) << inherited_options(app) << make_subcommands(app, mode) << '\n'
        << make_footer(app);
    return out.str();
  }

  // CLI11 hands a command's footer down to the subcommands added after it:
  // the examples of `factory` are not those of `factory status`.
  std::string make_footer(const CLI::App* app) const override {
    if (app->get_parent() != nullptr && app->get_parent()->get_footer() == app->get_footer())
      return {};
    return CLI::Formatter::make_footer(app);
  }

 private:
  // The options of every command above this one, nearest first, when this
  // one takes them (fallthrough): the global ones are what a newcomer looks
  // for in `factory status --help`.
  std::string inherited_options(const CLI::App* app) const {
    std::string out;
    if (!app->get_fallthrough()) return out;
    for (const CLI::App* up = app->get_parent(); up != nullptr; up = up->get_parent()) {
      auto opts = up->get_options([up](const CLI::Option* o) {
        return o->nonpositional() && !o->get_group().empty() && o != up->get_help_ptr() &&
               o != up->get_help_all_ptr() && o->get_name() != "--version";
      });
      if (opts.empty()) continue;
      std::string title = up->get_parent() == nullptr
                              ? "Global options"
                              : "Options of `" + path_of(up) + "` (also after the subcommand)";
      out += make_group(title, false, opts);
    }
    return out;
  }

  static std::string path_of(const CLI::App* app) {
    std::string p = app->get_name();
    for (const CLI::App* up = app->get_parent(); up != nullptr; up = up->get_parent())
      p = up->get_name() + " " + p;
    return p;
  }
};

void apply_to_tree(CLI::App& app, const std::shared_ptr<HelpFormatter>& fmt) {
  app.formatter(fmt);
  app.failure_message(usage_error);
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    apply_to_tree(*sub, fmt);
}

}  // namespace

void apply_conventions(CLI::App& app) {
  apply_to_tree(app, std::make_shared<HelpFormatter>());
}

std::optional<int> parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? kExitOk : kExitUsage;
  }
}

CLI::Option* restrict_to(CLI::Option* opt, const std::vector<std::string>& choices,
                         const std::string& what) {
  std::string bars, commas;
  for (const auto& c : choices) {
    bars += (bars.empty() ? "" : "|") + c;
    commas += (commas.empty() ? "" : ", ") + c;
  }
  opt->transform(CLI::Validator(
      [choices, commas, what](std::string& value) -> std::string {
        std::string lower = value;
        std::transform(lower.begin(), lower.end(), lower.begin(),
                       [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
        if (std::find(choices.begin(), choices.end(), lower) == choices.end())
          return "'" + value + "' is not " + what + " (one of " + commas + ")";
        value = lower;
        return {};
      },
      ""));
  return opt->option_text(bars);
}

CLI::Option* add_log_level_option(CLI::App& app, std::string& level,
                                  const std::string& description) {
  return app.add_option("--log-level", level, description)
      ->check(CLI::Validator(
          [](std::string& value) -> std::string {
            auto st = check_log_level(value);
            return st.ok() ? std::string() : st.error().message;
          },
          ""))
      ->option_text(kLogLevels);
}

void set_examples(CLI::App& cmd, const std::vector<std::pair<std::string, std::string>>& examples) {
  // kubectl's layout: what it does as a comment above the line to type, so
  // a long command line never squeezes its explanation.
  std::string text = "Examples:";
  for (const auto& [line, what] : examples) text += "\n  # " + what + "\n  " + line;
  cmd.footer(text);
}

}  // namespace factory::cli
