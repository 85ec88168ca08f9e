#include "common/log.hpp"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "common/display.hpp"

namespace factory {

namespace {

constexpr const char* kPattern = "%Y-%m-%dT%H:%M:%S.%e%z %^%l%$ %n: %v";

// Every message passes through the display sanitizer before the pattern
// lays it out: a value a guest sent (a hostname, a close reason, a frame
// type) may hold terminal escapes, and whoever reads the log with `less` or
// `journalctl` must see them, not have them run. One place, so a log line
// someone adds tomorrow is covered too.
class SanitizingFormatter final : public spdlog::formatter {
 public:
  SanitizingFormatter() : inner_(std::make_unique<spdlog::pattern_formatter>(kPattern)) {}

  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    std::string_view payload(msg.payload.data(), msg.payload.size());
    if (display::is_display_safe(payload)) return inner_->format(msg, dest);
    const std::string clean = display::sanitize(payload);
    spdlog::details::log_msg copy = msg;
    copy.payload = spdlog::string_view_t(clean.data(), clean.size());
    inner_->format(copy, dest);
  }

  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<SanitizingFormatter>();
  }

 private:
  std::unique_ptr<spdlog::pattern_formatter> inner_;
};

}  // namespace
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
  logger->set_formatter(std::make_unique<SanitizingFormatter>());
  auto lvl = spdlog::level::from_str(std::string(level));
  if (lvl == spdlog::level::off && level != "off") lvl = spdlog::level::info;
  spdlog::set_level(lvl);
  spdlog::flush_on(spdlog::level::info);
}

std::string redacted(std::string_view secret) {
  return "<redacted " + std::to_string(secret.size()) + " chars>";
}

LogThrottle::Verdict LogThrottle::admit(Clock::time_point now) {
  std::lock_guard lk(mu_);
  if (window_start_ == Clock::time_point{} || now - window_start_ >= window_) {
    window_start_ = now;
    in_window_ = 0;
  }
  if (in_window_ >= burst_) {
    ++suppressed_;
    return {};
  }
  ++in_window_;
  Verdict v{true, suppressed_};
  suppressed_ = 0;
  return v;
}

std::string LogThrottle::Verdict::note() const {
  if (suppressed == 0) return "";
  return " (and " + std::to_string(suppressed) + " more like it, not logged)";
}

}  // namespace factory
