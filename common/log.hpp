#pragma once
// Logging setup shared by both binaries. Logs go to stderr (journald on a
// guest, the pod log in the cluster). Secrets never reach a log line: log a
// token's id or a certificate's serial, never the token or the key. Every
// message is passed through display::sanitize (common/display.hpp), so a
// value that came from a guest cannot put a terminal escape into the log.
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

}  // namespace factory
