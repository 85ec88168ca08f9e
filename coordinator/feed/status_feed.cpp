#include "coordinator/feed/status_feed.hpp"

#include "coordinator/feed/metrics.hpp"

namespace factory::feed {

std::string StatusFeed::metrics() const {
  return render_metrics(store_, state_);
}

void StatusFeed::install_routes(coordinator::ApiRouter& r, bool metrics_public) const {
  r.add("GET", "/metrics",
        [this](auto&, auto&) {
          net::HttpResponseOut out;
          out.content_type = kMetricsContentType;
          out.body = metrics();
          return out;
        },
        {.public_route = metrics_public});
  r.add("GET", "/v1/tenants",
        [this](auto&, auto&) { return coordinator::json_response(view_.tenants()); });
}

}  // namespace factory::feed
