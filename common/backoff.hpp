#pragma once
// Capped exponential backoff with full jitter (the AWS architecture blog's
// variant): sleep = uniform(0, min(cap, base * 2^attempt)). The cap is in
// minutes, never hours: an agent must not stay invisible for long.
#include <chrono>
#include <random>

namespace factory {

class Backoff {
 public:
  Backoff(std::chrono::milliseconds base, std::chrono::milliseconds cap,
          uint64_t seed = std::random_device{}());
  std::chrono::milliseconds next();
  void reset() { attempt_ = 0; }
  int attempt() const { return attempt_; }
  // The ceiling the next delay is drawn under (no jitter); for logs and tests.
  std::chrono::milliseconds ceiling() const;

 private:
  std::chrono::milliseconds base_, cap_;
  int attempt_ = 0;
  std::mt19937_64 rng_;
};

// A random delay in [0, max] before the first connect after boot, so a fleet
// rebooted at once does not phone home at once.
std::chrono::milliseconds initial_jitter(std::chrono::milliseconds max);

}  // namespace factory
