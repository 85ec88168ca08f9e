#pragma once
// The hour and day buckets usage is kept in (endpoint_usage, gpu_usage):
// unix seconds, UTC, by the coordinator's clock.
#include <cstdint>

namespace factory::store::buckets {

inline constexpr std::int64_t kHour = 3600;
inline constexpr std::int64_t kDay = 24 * kHour;

// t rounded down to a multiple of unit, toward the past for negatives too.
constexpr std::int64_t floor_to(std::int64_t t, std::int64_t unit) {
  std::int64_t q = t / unit;
  if (t % unit < 0) --q;
  return q * unit;
}

}  // namespace factory::store::buckets
