#include "common/durations.hpp"

#include <cctype>
#include <cstdio>
#include <ctime>

namespace factory {

Result<std::chrono::seconds> parse_duration(std::string_view text) {
  if (text.empty()) return Error(Errc::invalid_argument, "empty duration");
  int64_t total = 0;
  size_t i = 0;
  bool any = false;
  while (i < text.size()) {
    if (!std::isdigit(static_cast<unsigned char>(text[i])))
      return Error(Errc::invalid_argument,
                   "invalid duration '" + std::string(text) + "' (use e.g. 90s, 30m, 1h, 7d)");
    int64_t n = 0;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
      n = n * 10 + (text[i] - '0');
      if (n > 100000000) return Error(Errc::invalid_argument, "duration too large");
      ++i;
    }
    int64_t unit = 1;
    if (i < text.size()) {
      switch (text[i]) {
        case 's':
          unit = 1;
          break;
        case 'm':
          unit = 60;
          break;
        case 'h':
          unit = 3600;
          break;
        case 'd':
          unit = 86400;
          break;
        default:
          return Error(Errc::invalid_argument,
                       "invalid duration unit in '" + std::string(text) + "' (use s, m, h or d)");
      }
      ++i;
    } else if (any) {
      return Error(Errc::invalid_argument, "missing unit in duration '" + std::string(text) + "'");
    }
    total += n * unit;
    any = true;
  }
  return std::chrono::seconds(total);
}

std::string format_duration(std::chrono::seconds d) {
  int64_t s = d.count();
  if (s <= 0) return "0s";
  std::string out;
  if (s >= 86400) {
    out += std::to_string(s / 86400) + "d";
    s %= 86400;
  }
  if (s >= 3600) {
    out += std::to_string(s / 3600) + "h";
    s %= 3600;
  }
  if (s >= 60) {
    out += std::to_string(s / 60) + "m";
    s %= 60;
  }
  if (s > 0 || out.empty()) out += std::to_string(s) + "s";
  return out;
}

int64_t unix_seconds(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::seconds>(t.time_since_epoch()).count();
}

std::string format_rfc3339(Clock::time_point t) {
  std::time_t tt = static_cast<std::time_t>(unix_seconds(t));
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

Result<Clock::time_point> parse_rfc3339(std::string_view text) {
  std::tm tm{};
  int y, mo, d, h, mi, s;
  std::string str(text);
  if (std::sscanf(str.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d", &y, &mo, &d, &h, &mi, &s) != 6)
    return Error(Errc::invalid_argument, "invalid timestamp '" + str + "'");
  // A time_point counts nanoseconds in 64 bits: years past 2262 overflow it
  // (an agent's "4052-12-01T..." did, under UBSan). No clock Factory reads is
  // before 1970 or after 2200.
  if (y < 1970 || y > 2200 || mo < 1 || mo > 12 || d < 1 || d > 31 || h < 0 || h > 23 || mi < 0 ||
      mi > 59 || s < 0 || s > 60)
    return Error(Errc::invalid_argument, "timestamp '" + str.substr(0, 64) + "' is out of range");
  tm.tm_year = y - 1900;
  tm.tm_mon = mo - 1;
  tm.tm_mday = d;
  tm.tm_hour = h;
  tm.tm_min = mi;
  tm.tm_sec = s;
  return Clock::from_time_t(timegm(&tm));
}

}  // namespace factory
