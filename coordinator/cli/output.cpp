#include "coordinator/cli/output.hpp"

#include <algorithm>

#include "common/display.hpp"
#include "common/durations.hpp"

namespace factory::cli {

std::string age(const std::string& rfc3339, const std::string& suffix) {
  if (rfc3339.empty()) return "-";
  auto t = parse_rfc3339(rfc3339);
  if (!t) return rfc3339;
  auto d = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - *t);
  return format_duration(std::max(d, std::chrono::seconds(0))) + suffix;
}

}  // namespace factory::cli
