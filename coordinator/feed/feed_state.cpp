#include "coordinator/feed/feed_state.hpp"

#include <algorithm>

#include "coordinator/feed/tenant_view.hpp"

namespace factory::feed {

void FeedState::agent_connected(const std::string& tenant, AgentPresence presence) {
  presence.connected = true;
  presence.disconnect.clear();
  presence.disconnect_detail.clear();
  std::unique_lock lk(mu_);
  auto& p = presence_[tenant];
  // The spool counters carry over: the agent reports them again soon.
  presence.dropped_events = p.dropped_events;
  presence.pending_events = p.pending_events;
  p = presence;
  lk.unlock();
  bus_.publish("agent", tenant,
               {{"connected", true},
                {"state", "connected"},
                {"agent_id", presence.agent_id},
                {"version", presence.version},
                {"hostname", presence.hostname},
                {"remote_address", presence.remote},
                {"connected_since", presence.connected_since}});
}

void FeedState::agent_seen(const std::string& tenant, const std::string& at) {
  std::lock_guard lk(mu_);
  if (auto it = presence_.find(tenant); it != presence_.end()) it->second.last_seen = at;
}

void FeedState::agent_spool(const std::string& tenant, std::uint64_t pending,
                            std::uint64_t dropped) {
  std::lock_guard lk(mu_);
  if (auto it = presence_.find(tenant); it != presence_.end()) {
    it->second.pending_events = pending;
    it->second.dropped_events = dropped;
  }
}

void FeedState::agent_disconnected(const std::string& tenant, const std::string& at,
                                   const std::string& how, const std::string& detail) {
  std::unique_lock lk(mu_);
  // Only an agent that is on show: after forget() (the tenant was deleted
  // while its connection was closing) nothing comes back.
  auto it = presence_.find(tenant);
  if (it == presence_.end()) return;
  auto& p = it->second;
  p.connected = false;
  p.last_seen = at;
  p.disconnect = how;
  p.disconnect_detail = detail;
  lk.unlock();
  bus_.publish("agent", tenant,
               {{"connected", false}, {"state", how}, {"detail", detail}, {"last_seen", at}});
}

void FeedState::health_changed(const std::string& tenant, const store::LatestHealth& sample) {
  // The feed is an edge: the sample leaves as JSON here.
  nlohmann::json health = sample.to_json();
  nlohmann::json diagnoses = active_diagnoses(store::TenantStatus{}, health);
  bus_.publish("health", tenant,
               {{"health", std::move(health)}, {"diagnoses", std::move(diagnoses)}});
}

void FeedState::phase_now(const std::string& tenant, const std::string& phase) {
  if (phase.empty()) return;
  {
    std::lock_guard lk(mu_);
    auto& last = phases_[tenant];
    if (last == phase) return;
    last = phase;
  }
  bus_.publish("phase", tenant, {{"phase", phase}});
}

void FeedState::event_stored(const std::string& tenant, const nlohmann::json& event,
                             const store::TenantRecord* after) {
  const std::string kind = event.value("kind", "");
  nlohmann::json plan;
  if (after && after->status.plan) {
    // Where the plan is (state, steps_done, steps_total) without every
    // step's record, which the progress event itself updates: never the
    // steps (a copy of them per event was most of a flood's allocations).
    plan = after->status.plan->to_json(/*with_steps=*/false);
  }
  if (kind == "progress" || kind == "plan") {
    nlohmann::json d = event;
    d.erase("kind");
    d.erase("id");
    if (!plan.is_null()) d["plan"] = plan;
    bus_.publish(kind, tenant, std::move(d));
  } else if (kind == "diagnosis") {
    nlohmann::json d = event;
    d.erase("kind");
    d.erase("id");
    bus_.publish("diagnosis", tenant, std::move(d));
  }
  if (after) phase_now(tenant, after->phase);
}

void FeedState::forget(const std::string& tenant) {
  std::lock_guard lk(mu_);
  presence_.erase(tenant);
  for (auto* counts : {&rejected_, &over_quota_})
    for (auto it = counts->lower_bound({tenant, ""});
         it != counts->end() && it->first.first == tenant;)
      it = counts->erase(it);
  health_samples_.erase(tenant);
  phases_.erase(tenant);
}

void FeedState::count_rejected(const std::string& tenant, const std::string& reason,
                               std::uint64_t n) {
  std::lock_guard lk(mu_);
  rejected_[{tenant, reason}] += n;
}

void FeedState::count_over_quota(const std::string& tenant, const std::string& quota) {
  std::lock_guard lk(mu_);
  over_quota_[{tenant, quota}] += 1;
}

FeedState::TenantCounts FeedState::rejected() const {
  std::lock_guard lk(mu_);
  return rejected_;
}

FeedState::TenantCounts FeedState::over_quota() const {
  std::lock_guard lk(mu_);
  return over_quota_;
}

void FeedState::count_health_sample(const std::string& tenant) {
  std::lock_guard lk(mu_);
  ++health_samples_[tenant];
}

std::map<std::string, std::uint64_t> FeedState::health_samples() const {
  std::lock_guard lk(mu_);
  return health_samples_;
}

void FeedState::count_event(const std::string& kind) {
  // The kinds the agent sends; a label per made-up kind would let an agent
  // grow the metrics without bound.
  static const char* const known[] = {"progress", "plan",          "diagnosis",
                                      "health",   "journal_reset", "synthetic"};
  std::string k = "other";
  for (const char* x : known)
    if (kind == x) k = x;
  std::lock_guard lk(mu_);
  ++events_by_kind_[k];
}

std::map<std::string, std::uint64_t> FeedState::events_by_kind() const {
  std::lock_guard lk(mu_);
  return events_by_kind_;
}

void FeedState::observe_step(const std::string& tier, const std::string& kind,
                             const std::string& result, double seconds) {
  std::lock_guard lk(mu_);
  auto& s = steps_.series[{tier, kind, result}];
  for (size_t i = 0; i < StepDurations::kBuckets.size(); ++i)
    if (seconds <= StepDurations::kBuckets[i]) ++s.buckets[i];
  ++s.count;
  s.sum += seconds;
}

StepDurations FeedState::step_durations() const {
  std::lock_guard lk(mu_);
  return steps_;
}

std::optional<AgentPresence> FeedState::presence(const std::string& tenant) const {
  std::lock_guard lk(mu_);
  auto it = presence_.find(tenant);
  if (it == presence_.end()) return std::nullopt;
  return it->second;
}

std::map<std::string, AgentPresence> FeedState::all() const {
  std::lock_guard lk(mu_);
  return presence_;
}

std::size_t FeedState::connected_count() const {
  std::lock_guard lk(mu_);
  return static_cast<std::size_t>(std::count_if(presence_.begin(), presence_.end(),
                                                [](const auto& p) { return p.second.connected; }));
}

void FeedState::set_leadership(const std::string& replica, bool leading) {
  std::lock_guard lk(mu_);
  leadership_ = Leadership{replica, leading};
}

std::optional<FeedState::Leadership> FeedState::leadership() const {
  std::lock_guard lk(mu_);
  return leadership_;
}

}  // namespace factory::feed
