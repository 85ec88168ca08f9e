#pragma once
// The status feed: what the admin and monitoring read about the tenants.
// It holds what the agents module writes into it (state(): presence and
// counters) and serves, with the store, GET /v1/tenants and GET /metrics,
// both behind the admin token unless metrics_public opens /metrics (it
// names every tenant: a scraper needs the token, or a trusted network and
// api.metrics_public: true). GET /v1/tenants/{name} is
// TenantService's: it adds the VM as the cluster sees it to view().tenant().
#include "coordinator/api/router.hpp"
#include "coordinator/feed/feed_state.hpp"
#include "coordinator/feed/tenant_view.hpp"
#include "coordinator/store/store.hpp"

namespace factory::feed {

class StatusFeed {
 public:
  explicit StatusFeed(const store::Store& store) : store_(store), view_(store, state_) {}
  StatusFeed(const StatusFeed&) = delete;
  StatusFeed& operator=(const StatusFeed&) = delete;

  FeedState& state() { return state_; }
  const TenantView& view() const { return view_; }
  std::string metrics() const;

  void install_routes(coordinator::ApiRouter& router, bool metrics_public = false) const;

 private:
  const store::Store& store_;
  FeedState state_;
  TenantView view_;
};

}  // namespace factory::feed
