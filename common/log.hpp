#pragma once
// Logging setup shared by both binaries. Logs go to stderr (journald on a
// guest, the pod log in the cluster). Secrets never reach a log line: log a
// token's id or a certificate's serial, never the token or the key. Every
// message is passed through display::sanitize (common/display.hpp), so a
// value that came from a guest cannot put a terminal escape into the log.
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

#include "common/error.hpp"

namespace factory {

// The levels both binaries take (--log-level, the configs' log_level), from
// the most verbose: "trace|debug|info|warn|error".
inline constexpr const char* kLogLevels = "trace|debug|info|warn|error";

// A level outside kLogLevels is a typo the user should hear about, not a
// quiet "info": invalid_argument "'loud' is not a log level (trace, ...)".
Status check_log_level(std::string_view level);

// level: one of kLogLevels (check_log_level first: an unknown one is info here).
void setup_logging(std::string_view program, std::string_view level);

// "abcd…(32 chars)" style fingerprint safe to log in place of a secret.
std::string redacted(std::string_view secret);

// For a line that can repeat without end: a full disk fails every write,
// and every agent reconnecting to it logged its own "could not store"
// (150-250 lines a second). The first `burst` lines of each window are
// logged; the rest are counted, and the next line logged says how many
// were left out. Thread-safe; admit() takes a mutex for a few instructions.
class LogThrottle {
 public:
  using Clock = std::chrono::steady_clock;
  explicit LogThrottle(std::size_t burst = 5,
                       std::chrono::seconds window = std::chrono::seconds(10))
      : burst_(burst), window_(window) {}

  struct Verdict {
    bool log = false;
    std::uint64_t suppressed = 0;  // left out since the last line logged
    // " (and N more like it, not logged)" or "": appended to the line.
    std::string note() const;
  };
  Verdict admit(Clock::time_point now = Clock::now());

 private:
  const std::size_t burst_;
  const Clock::duration window_;
  std::mutex mu_;
  Clock::time_point window_start_{};
  std::size_t in_window_ = 0;
  std::uint64_t suppressed_ = 0;
};

}  // namespace factory
