#include "coordinator/agents/ingestion.hpp"

#include <spdlog/spdlog.h>

#include "common/durations.hpp"

namespace factory::coordinator {

namespace {
// A hostile agent can make a rejection per field of every frame; the log
// gets the first few of each minute, the metric every one.
constexpr int kLoggedRejectionsPerMinute = 10;
}  // namespace

std::optional<Refusal> Ingestion::admit(const std::string& tenant, std::size_t event_bytes) {
  auto no = quotas_.admit(tenant, event_bytes);
  if (!no) return std::nullopt;
  feed_.count_over_quota(tenant, no->quota);
  spdlog::warn("agents: {}", no->message);
  return Refusal{"over_quota",
                 no->message,
                 "over quota",
                 {{"quota", no->quota}, {"retry_after_s", no->retry_after.count()}}};
}

Answer<IngestedEvent> Ingestion::check(const std::string& tenant, const nlohmann::json& b) {
  auto decoded = decode_event(b);
  count(tenant, "event", decoded.rejected);
  if (!decoded.value) {
    ++feed_.counters().frames_rejected;
    return Refusal{"bad_event", decoded.refusal, ""};
  }
  const std::string now = format_rfc3339(Clock::now());
  feed_.agent_seen(tenant, now);
  IngestedEvent out{{}, std::move(*decoded.value)};
  out.stored.id = out.event.id;
  out.stored.received_at = now;
  out.stored.event = out.event.to_json();
  return out;
}

bool Ingestion::may_log(const std::string& tenant) {
  std::lock_guard lk(log_mu_);
  auto now = std::chrono::steady_clock::now();
  auto& w = log_windows_[tenant];
  if (now - w.start >= std::chrono::minutes(1)) w = {now, 0};
  return ++w.lines <= kLoggedRejectionsPerMinute;
}

void Ingestion::count(const std::string& tenant, const std::string& type,
                      const std::vector<Rejection>& rejected) {
  if (rejected.empty()) return;
  for (const auto& r : rejected) feed_.count_rejected(tenant, reason_name(r.reason));
  if (!may_log(tenant)) return;
  std::string what;
  for (const auto& r : rejected) {
    if (what.size() > 200) {
      what += ", ...";
      break;
    }
    what += (what.empty() ? "" : ", ") + r.field + " (" + reason_name(r.reason) + ")";
  }
  spdlog::warn("agents: {}: dropped from a {} message: {}",
               tenant.empty() ? std::string("unenrolled agent") : "tenant " + tenant, type, what);
}

void Ingestion::count(const std::string& tenant, const std::string& reason) {
  feed_.count_rejected(tenant, reason);
}

void Ingestion::forget(const std::string& tenant) {
  quotas_.forget(tenant);
  std::lock_guard lk(log_mu_);
  log_windows_.erase(tenant);
}

}  // namespace factory::coordinator
