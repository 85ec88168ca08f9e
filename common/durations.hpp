#pragma once
// Durations as users type them ("1h", "30m", "90s", "1h30m", "7d") and
// timestamps as the API shows them (RFC 3339, UTC).
#include <chrono>
#include <string>
#include <string_view>

#include "common/error.hpp"

namespace factory {

using Clock = std::chrono::system_clock;

Result<std::chrono::seconds> parse_duration(std::string_view text);
std::string format_duration(std::chrono::seconds d);  // "1h30m", "45s"
std::string format_rfc3339(Clock::time_point t);      // 2026-11-30T09:00:00Z
Result<Clock::time_point> parse_rfc3339(std::string_view text);
int64_t unix_seconds(Clock::time_point t);

}  // namespace factory
