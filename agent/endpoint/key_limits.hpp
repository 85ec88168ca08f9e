#pragma once
// A named key's limits per minute (issue 28): requests (rpm) and tokens,
// prompt and completion together (tpm), each over a sliding 60 s window of
// one-second slots (bounded: 60 slots per key whatever the traffic). A
// request past either is answered 429 with `Retry-After`: the seconds until
// enough of the window has slid out for it to pass.
//
// Tokens are known only once an answer is whole, so tpm refuses the
// requests that come after the minute's tokens are spent, not the one that
// spends them (OpenAI's limits behave the same).
//
// Thread-safe.
#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>

namespace factory::agent::endpoint {

class KeyLimits {
 public:
  using SteadyClock = std::chrono::steady_clock;

  struct Verdict {
    bool allowed = true;
    const char* which = "";  // "requests" | "tokens" when refused
    std::int64_t retry_after_s = 0;
  };

  // Asks for one request of `key` at `now`: counted when allowed.
  Verdict admit(const std::string& key, std::optional<std::int64_t> rpm,
                std::optional<std::int64_t> tpm, SteadyClock::time_point now = SteadyClock::now());
  // The tokens a finished request of `key` used.
  void add_tokens(const std::string& key, std::uint64_t tokens,
                  SteadyClock::time_point now = SteadyClock::now());
  // Drops the windows of keys no longer served (a revoked key's).
  void forget_except(const std::function<bool(const std::string&)>& keep);

 private:
  struct Window {
    // Slot i holds second `second[i]`'s counts; a slot of an older second is stale.
    std::array<std::int64_t, 60> second{};
    std::array<std::uint64_t, 60> requests{}, tokens{};
    void slide(std::int64_t now_s);
    std::uint64_t sum(const std::array<std::uint64_t, 60>& v) const;
    // Seconds until the sum of v over the window falls below limit.
    std::int64_t wait_below(const std::array<std::uint64_t, 60>& v, std::uint64_t limit,
                            std::int64_t now_s) const;
  };
  static std::int64_t seconds_of(SteadyClock::time_point t);

  std::mutex mu_;
  std::map<std::string, Window> windows_;
};

}  // namespace factory::agent::endpoint
