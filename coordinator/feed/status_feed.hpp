#pragma once
// The status feed: what the admin and monitoring read about the tenants.
// It holds what the agents module writes into it (state(): presence,
// counters and the event bus) and serves, with the store:
//   GET /v1/tenants        every tenant (tenant_view.hpp)
//   GET /v1/events         Server-Sent Events of what changes (event_bus.hpp)
//   GET /metrics           Prometheus text; behind a token unless
//                          metrics_public (it names every tenant)
//   GET /                  the dashboard (static files compiled in), live
//                          from /v1/events; POST/GET/DELETE /v1/session
//                          sign a browser in with the admin or a read-only
//                          token for a cookie
// All of them may be read with a read-only token (coordinator/api/auth.hpp).
// GET /v1/tenants/{name} is TenantService's: it adds the VM as the cluster
// sees it to view().tenant().
#include "coordinator/api/router.hpp"
#include "coordinator/feed/event_bus.hpp"
#include "coordinator/feed/feed_state.hpp"
#include "coordinator/feed/tenant_view.hpp"
#include "coordinator/store/store.hpp"

namespace factory::feed {

class StatusFeed {
 public:
  explicit StatusFeed(const store::Store& store, EventBusOptions bus = {})
      : store_(store), state_(bus), view_(store, state_) {}
  StatusFeed(const StatusFeed&) = delete;
  StatusFeed& operator=(const StatusFeed&) = delete;

  FeedState& state() { return state_; }
  const TenantView& view() const { return view_; }
  std::string metrics() const;

  void install_routes(coordinator::ApiRouter& router, bool metrics_public = false);

 private:
  void stream_events(std::shared_ptr<net::HttpExchange> x, const coordinator::Caller& who);
  const store::Store& store_;
  FeedState state_;
  TenantView view_;
};

// The dashboard's files, compiled in (coordinator/feed/dashboard/).
struct DashboardFile {
  const char* path;  // "/", "/dashboard/app.js", ...
  const char* content_type;
  const char* text;
};
const std::vector<DashboardFile>& dashboard_files();

}  // namespace factory::feed
