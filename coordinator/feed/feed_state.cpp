#include "coordinator/feed/feed_state.hpp"

#include <algorithm>

namespace factory::feed {

void FeedState::agent_connected(const std::string& tenant, AgentPresence presence) {
  presence.connected = true;
  presence.disconnect.clear();
  presence.disconnect_detail.clear();
  std::lock_guard lk(mu_);
  auto& p = presence_[tenant];
  // The spool counters carry over: the agent reports them again soon.
  presence.dropped_events = p.dropped_events;
  presence.pending_events = p.pending_events;
  p = std::move(presence);
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
  std::lock_guard lk(mu_);
  // Only an agent that is on show: after forget() (the tenant was deleted
  // while its connection was closing) nothing comes back.
  auto it = presence_.find(tenant);
  if (it == presence_.end()) return;
  auto& p = it->second;
  p.connected = false;
  p.last_seen = at;
  p.disconnect = how;
  p.disconnect_detail = detail;
}

void FeedState::forget(const std::string& tenant) {
  std::lock_guard lk(mu_);
  presence_.erase(tenant);
  for (auto* counts : {&rejected_, &over_quota_})
    for (auto it = counts->lower_bound({tenant, ""});
         it != counts->end() && it->first.first == tenant;)
      it = counts->erase(it);
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

}  // namespace factory::feed
