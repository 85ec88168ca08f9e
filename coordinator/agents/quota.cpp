#include "coordinator/agents/quota.hpp"

#include <algorithm>
#include <cmath>

namespace factory::coordinator {

namespace {

constexpr double kSecondsPerDay = 86400;
// A refused agent comes back when the bucket holds enough to be worth a
// connection: half a burst of messages, or one full-size event frame.
constexpr double kBytesWorthAReconnect = 64 * 1024;

void refill(double& tokens, TenantQuotas::Clock::time_point& at, double rate, double cap,
            TenantQuotas::Clock::time_point now) {
  if (now > at) {
    tokens = std::min(cap, tokens + rate * std::chrono::duration<double>(now - at).count());
    at = now;
  }
}

std::chrono::seconds wait_for(double missing, double rate) {
  if (rate <= 0) return std::chrono::seconds(3600);
  double s = std::ceil(std::max(missing, 0.0) / rate);
  return std::chrono::seconds(std::clamp<long long>(static_cast<long long>(s), 1, 86400));
}

std::string mib(std::uint64_t bytes) {
  if (bytes % (1 << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes) + " bytes";
}

}  // namespace

TenantQuotas::State& TenantQuotas::state_of(const std::string& tenant, Clock::time_point now) {
  auto [it, fresh] = by_tenant_.try_emplace(tenant);
  if (fresh) {
    it->second.messages = {opts_.event_burst, now};
    it->second.bytes = {static_cast<double>(opts_.bytes_per_day), now};
  }
  return it->second;
}

std::string TenantQuotas::describe(const Refusal& r, const std::string& tenant) const {
  std::string what = r.quota == "bytes_per_day"
                         ? "tenant " + tenant + " used its " + mib(opts_.bytes_per_day) +
                               " of events per day (agents.quota.bytes_per_day)"
                         : "tenant " + tenant + " sent more than " +
                               std::to_string(static_cast<long long>(opts_.events_per_second)) +
                               " messages/s (burst " +
                               std::to_string(static_cast<long long>(opts_.event_burst)) +
                               "; agents.quota.events_per_second)";
  return what + ": over quota, this connection closes; reconnect in " +
         std::to_string(r.retry_after.count()) + "s";
}

std::optional<TenantQuotas::Refusal> TenantQuotas::throttled(const std::string& tenant,
                                                             Clock::time_point now) {
  std::lock_guard lk(mu_);
  auto it = by_tenant_.find(tenant);
  if (it == by_tenant_.end() || now >= it->second.throttled_until) return std::nullopt;
  Refusal r = it->second.last;
  r.retry_after =
      std::max(std::chrono::seconds(1),
               std::chrono::ceil<std::chrono::seconds>(it->second.throttled_until - now));
  r.message = describe(r, tenant);
  return r;
}

std::optional<TenantQuotas::Refusal> TenantQuotas::admit(const std::string& tenant,
                                                         std::size_t event_bytes,
                                                         Clock::time_point now) {
  std::lock_guard lk(mu_);
  State& s = state_of(tenant, now);
  const double bytes_rate = static_cast<double>(opts_.bytes_per_day) / kSecondsPerDay;
  refill(s.messages.tokens, s.messages.at, opts_.events_per_second, opts_.event_burst, now);
  refill(s.bytes.tokens, s.bytes.at, bytes_rate, static_cast<double>(opts_.bytes_per_day), now);
  std::optional<Refusal> no;
  if (now < s.throttled_until) {
    no = s.last;
    no->retry_after = std::max(std::chrono::seconds(1),
                               std::chrono::ceil<std::chrono::seconds>(s.throttled_until - now));
  } else if (s.messages.tokens < 1) {
    no = Refusal{"events_per_second",
                 wait_for(opts_.event_burst / 2 - s.messages.tokens, opts_.events_per_second), ""};
  } else if (event_bytes > 0 && s.bytes.tokens < static_cast<double>(event_bytes)) {
    double want = std::max(static_cast<double>(event_bytes), kBytesWorthAReconnect);
    want = std::min(want, static_cast<double>(opts_.bytes_per_day));
    no = Refusal{"bytes_per_day", wait_for(want - s.bytes.tokens, bytes_rate), ""};
  }
  if (no) {
    no->message = describe(*no, tenant);
    if (now >= s.throttled_until) {
      s.throttled_until = now + no->retry_after;
      s.last = *no;
    }
    return no;
  }
  s.messages.tokens -= 1;
  s.bytes.tokens -= static_cast<double>(event_bytes);
  return std::nullopt;
}

void TenantQuotas::forget(const std::string& tenant) {
  std::lock_guard lk(mu_);
  by_tenant_.erase(tenant);
}

}  // namespace factory::coordinator
