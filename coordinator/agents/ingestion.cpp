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
  IngestedEvent out{{}, std::move(*decoded.value), {}};
  out.stored.id = out.event.id;
  out.stored.received_at = now;
  out.tree = out.event.to_json();
  // A guest's strings may hold any bytes: an invalid UTF-8 sequence becomes
  // U+FFFD here rather than an exception on the store's writer.
  out.stored.json = out.tree.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
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
                      const Rejections& rejected) {
  if (rejected.empty()) return;
  for (auto r : proto::kAllRejectReasons)
    if (auto n = rejected.count(r)) feed_.count_rejected(tenant, reason_name(r), n);
  if (!may_log(tenant)) return;
  // The paths are the coordinator's own words (keys and indices) or a
  // guest's key cut short, never the guest's values.
  std::string what;
  for (const auto& r : rejected) {
    if (what.size() > 200) {
      what += ", ...";
      break;
    }
    what += (what.empty() ? "" : ", ") + r.field + " (" + reason_name(r.reason) + ")";
  }
  if (rejected.total() > rejected.kept().size()) what += ", ...";
  spdlog::warn("agents: {}: dropped from a {} message: {}",
               tenant.empty() ? std::string("unenrolled agent") : "tenant " + tenant, type, what);
}

void Ingestion::count(const std::string& tenant, const std::string& reason) {
  feed_.count_rejected(tenant, reason);
}

void Ingestion::forget(const std::string& tenant) {
  quotas_.forget(tenant);
  {
    std::lock_guard lk(log_mu_);
    log_windows_.erase(tenant);
  }
  std::lock_guard lk(mu_);
  buckets_.erase(tenant);
}

bool Ingestion::admit_health(const std::string& tenant) {
  auto now = std::chrono::steady_clock::now();
  std::lock_guard lk(mu_);
  auto [it, fresh] = buckets_.try_emplace(tenant);
  Bucket& b = it->second;
  if (fresh) {
    b.tokens = intake_.burst;
  } else {
    double elapsed = std::chrono::duration<double>(now - b.at).count();
    b.tokens = std::min(intake_.burst, b.tokens + elapsed * intake_.per_second);
  }
  b.at = now;
  if (b.tokens < 1) return false;
  b.tokens -= 1;
  return true;
}

std::shared_ptr<const store::LatestHealth> Ingestion::health(const std::string& tenant,
                                                             const nlohmann::json& body) {
  const std::string now = format_rfc3339(Clock::now());
  feed_.agent_seen(tenant, now);
  if (!admit_health(tenant)) {
    feed_.count_rejected(tenant, "rate_limited");
    return nullptr;
  }
  auto decoded = proto::decode_health_sample(body);
  count(tenant, "health", decoded.rejected);
  if (!decoded.value) return nullptr;
  feed_.count_health_sample(tenant);
  return std::make_shared<const store::LatestHealth>(
      store::LatestHealth{std::move(*decoded.value), now});
}

}  // namespace factory::coordinator
