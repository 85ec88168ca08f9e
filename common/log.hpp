#pragma once
// Logging setup shared by both binaries. Logs go to stderr (journald on a
// guest, the pod log in the cluster). Secrets never reach a log line: log a
// token's id or a certificate's serial, never the token or the key. Every
// message is passed through display::sanitize (common/display.hpp), so a
// value that came from a guest cannot put a terminal escape into the log.
#include <string>
#include <string_view>

namespace factory {

// level: trace|debug|info|warn|error. Unknown levels fall back to info.
void setup_logging(std::string_view program, std::string_view level);

// "abcd…(32 chars)" style fingerprint safe to log in place of a secret.
std::string redacted(std::string_view secret);

}  // namespace factory
