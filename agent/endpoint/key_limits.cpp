#include "agent/endpoint/key_limits.hpp"

#include <algorithm>
#include <functional>

namespace factory::agent::endpoint {

std::int64_t KeyLimits::seconds_of(SteadyClock::time_point t) {
  return std::chrono::duration_cast<std::chrono::seconds>(t.time_since_epoch()).count();
}

void KeyLimits::Window::slide(std::int64_t now_s) {
  for (std::size_t i = 0; i < 60; i++)
    if (second[i] <= now_s - 60 || second[i] > now_s) {
      second[i] = 0;
      requests[i] = 0;
      tokens[i] = 0;
    }
  const std::size_t slot = static_cast<std::size_t>(now_s % 60);
  if (second[slot] != now_s) {
    second[slot] = now_s;
    requests[slot] = 0;
    tokens[slot] = 0;
  }
}

std::uint64_t KeyLimits::Window::sum(const std::array<std::uint64_t, 60>& v) const {
  std::uint64_t s = 0;
  for (auto n : v) s += n;
  return s;
}

std::int64_t KeyLimits::Window::wait_below(const std::array<std::uint64_t, 60>& v,
                                           std::uint64_t limit, std::int64_t now_s) const {
  std::uint64_t s = sum(v);
  // Oldest second first: each one that slides out takes its counts along.
  for (std::int64_t sec = now_s - 59; sec <= now_s; sec++) {
    if (s < limit) return std::max<std::int64_t>(1, sec - 1 + 60 - now_s);
    const std::size_t slot = static_cast<std::size_t>(sec % 60);
    if (second[slot] == sec) s -= v[slot];
  }
  return 60;
}

KeyLimits::Verdict KeyLimits::admit(const std::string& key, std::optional<std::int64_t> rpm,
                                    std::optional<std::int64_t> tpm, SteadyClock::time_point now) {
  if (!rpm && !tpm) return {};
  std::lock_guard lk(mu_);
  const std::int64_t now_s = seconds_of(now);
  Window& w = windows_[key];
  w.slide(now_s);
  if (rpm && w.sum(w.requests) >= static_cast<std::uint64_t>(*rpm))
    return {false, "requests", w.wait_below(w.requests, static_cast<std::uint64_t>(*rpm), now_s)};
  if (tpm && w.sum(w.tokens) >= static_cast<std::uint64_t>(*tpm))
    return {false, "tokens", w.wait_below(w.tokens, static_cast<std::uint64_t>(*tpm), now_s)};
  w.requests[static_cast<std::size_t>(now_s % 60)]++;
  return {};
}

void KeyLimits::add_tokens(const std::string& key, std::uint64_t tokens,
                           SteadyClock::time_point now) {
  std::lock_guard lk(mu_);
  auto it = windows_.find(key);
  if (it == windows_.end()) return;  // a key without limits keeps no window
  const std::int64_t now_s = seconds_of(now);
  it->second.slide(now_s);
  it->second.tokens[static_cast<std::size_t>(now_s % 60)] += tokens;
}

void KeyLimits::forget_except(const std::function<bool(const std::string&)>& keep) {
  std::lock_guard lk(mu_);
  for (auto it = windows_.begin(); it != windows_.end();)
    it = keep(it->first) ? std::next(it) : windows_.erase(it);
}

}  // namespace factory::agent::endpoint
