#include "common/backoff.hpp"

#include <algorithm>

namespace factory {

Backoff::Backoff(std::chrono::milliseconds base, std::chrono::milliseconds cap, uint64_t seed)
    : base_(base), cap_(cap), rng_(seed) {}

std::chrono::milliseconds Backoff::ceiling() const {
  int shift = std::min(attempt_, 30);
  auto c = base_.count() * (int64_t{1} << shift);
  return std::chrono::milliseconds(std::min<int64_t>(c, cap_.count()));
}

std::chrono::milliseconds Backoff::next() {
  auto c = ceiling();
  ++attempt_;
  std::uniform_int_distribution<int64_t> dist(0, c.count());
  return std::chrono::milliseconds(dist(rng_));
}

std::chrono::milliseconds initial_jitter(std::chrono::milliseconds max) {
  if (max.count() <= 0) return std::chrono::milliseconds(0);
  std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<int64_t> dist(0, max.count());
  return std::chrono::milliseconds(dist(rng));
}

}  // namespace factory
