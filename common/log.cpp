#include "common/log.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace factory {

Status check_log_level(std::string_view level) {
  std::string known;
  for (std::string_view rest = kLogLevels; !rest.empty();) {
    auto bar = rest.find('|');
    std::string_view one = rest.substr(0, bar);
    if (one == level) return {};
    known += (known.empty() ? "" : ", ") + std::string(one);
    rest = bar == std::string_view::npos ? std::string_view() : rest.substr(bar + 1);
  }
  return Error(Errc::invalid_argument,
               "'" + std::string(level) + "' is not a log level (one of " + known + ")");
}

void setup_logging(std::string_view program, std::string_view level) {
  spdlog::drop(std::string(program));
  auto logger = spdlog::stderr_color_mt(std::string(program));
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e%z %^%l%$ %n: %v");
  auto lvl = spdlog::level::from_str(std::string(level));
  if (lvl == spdlog::level::off && level != "off") lvl = spdlog::level::info;
  spdlog::set_level(lvl);
  spdlog::flush_on(spdlog::level::info);
}

std::string redacted(std::string_view secret) {
  return "<redacted " + std::to_string(secret.size()) + " chars>";
}

}  // namespace factory
