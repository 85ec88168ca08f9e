#include "common/log.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace factory {

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
