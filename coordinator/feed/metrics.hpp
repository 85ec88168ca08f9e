#pragma once
// The Prometheus text exposition served at /metrics: agents connected,
// tenants by phase, each tenant's agent, and the agents endpoint's counters.
#include <string>

#include "coordinator/feed/feed_state.hpp"
#include "coordinator/store/store.hpp"

namespace factory::feed {

inline constexpr const char* kMetricsContentType = "text/plain; version=0.0.4; charset=utf-8";

std::string render_metrics(const store::Store& store, const FeedState& state);

}  // namespace factory::feed
