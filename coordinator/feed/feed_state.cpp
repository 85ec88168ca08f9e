#include "coordinator/feed/feed_state.hpp"

#include <algorithm>

namespace factory::feed {

void FeedState::agent_connected(const std::string& tenant, AgentPresence presence) {
  presence.connected = true;
  presence_[tenant] = std::move(presence);
}

void FeedState::agent_seen(const std::string& tenant, const std::string& at) {
  if (auto it = presence_.find(tenant); it != presence_.end()) it->second.last_seen = at;
}

void FeedState::agent_disconnected(const std::string& tenant, const std::string& at) {
  auto& p = presence_[tenant];
  p.connected = false;
  p.last_seen = at;
}

const AgentPresence* FeedState::presence(const std::string& tenant) const {
  auto it = presence_.find(tenant);
  return it == presence_.end() ? nullptr : &it->second;
}

size_t FeedState::connected_count() const {
  return static_cast<size_t>(std::count_if(presence_.begin(), presence_.end(),
                                           [](const auto& p) { return p.second.connected; }));
}

}  // namespace factory::feed
