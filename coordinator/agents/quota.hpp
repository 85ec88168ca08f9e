#pragma once
// Each tenant's share of the coordinator: how fast its agent may send and
// how many event bytes a day it may have stored. The coordinator is the one
// place all tenants share; a hostile or broken agent that floods it is
// slowed down, and told why, before it slows anyone else down.
//
// Two token buckets per tenant, refilled continuously:
//  - messages: every frame an enrolled agent sends after its hello (events,
//    heartbeats, renewals) takes one; events_per_second refill it, up to
//    event_burst. Above the agent's own replay rate (200/s), so a
//    well-behaved agent never meets it.
//  - bytes: every event takes its stored size; the bucket holds one day's
//    allowance (bytes_per_day) and refills at bytes_per_day / 86400 per
//    second, so a day's worth may come at once and then no more than the
//    allowance's pace.
// A message over either is refused: the session sends an "over_quota" error
// frame saying which quota and when to come back, and ends the connection
// (events are acknowledged cumulatively, so nothing after the refused one may
// be stored on that connection). Until then a new hello of the tenant is
// refused the same way, so the agent's reconnect backoff grows instead of
// the coordinator doing the work again. Per tenant: one tenant's buckets
// never touch another's.
//
// In memory: a restart of the coordinator refills every bucket. Thread-safe.
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

namespace factory::coordinator {

struct QuotaOptions {
  double events_per_second = 250;
  double event_burst = 500;
  std::uint64_t bytes_per_day = 32ull << 20;
};

class TenantQuotas {
 public:
  using Clock = std::chrono::steady_clock;

  struct Refusal {
    std::string quota;  // "events_per_second" | "bytes_per_day": the metric's label
    std::chrono::seconds retry_after{1};
    std::string message;  // one line the agent logs
  };

  explicit TenantQuotas(QuotaOptions o) : opts_(o) {}

  // One message of the tenant's agent; event_bytes > 0 for an event (its
  // stored size). nullopt: admitted, and charged.
  std::optional<Refusal> admit(const std::string& tenant, std::size_t event_bytes,
                               Clock::time_point now = Clock::now());
  // At hello: the refusal still running for the tenant, if any.
  std::optional<Refusal> throttled(const std::string& tenant, Clock::time_point now = Clock::now());
  // The tenant is gone.
  void forget(const std::string& tenant);

  const QuotaOptions& options() const { return opts_; }

 private:
  struct Bucket {
    double tokens = 0;
    Clock::time_point at{};
  };
  struct State {
    Bucket messages, bytes;
    Clock::time_point throttled_until{};
    Refusal last;
  };
  State& state_of(const std::string& tenant, Clock::time_point now);
  std::string describe(const Refusal& r, const std::string& tenant) const;

  QuotaOptions opts_;
  std::mutex mu_;
  std::map<std::string, State> by_tenant_;
};

}  // namespace factory::coordinator
