#include "coordinator/feed/status_feed.hpp"

#include <spdlog/spdlog.h>

#include <charconv>

#include "common/durations.hpp"
#include "coordinator/feed/metrics.hpp"

namespace factory::feed {

namespace {

// A stream's bytes go to the HTTP server's bounded queue for its connection.
class ExchangeSink : public EventSink {
 public:
  explicit ExchangeSink(std::shared_ptr<net::HttpExchange> x) : x_(std::move(x)) {}
  bool write(std::string chunk) override { return x_->write(std::move(chunk)); }
  bool write_shared(std::shared_ptr<const std::string> chunk) override {
    return x_->write_shared(std::move(chunk));
  }
  void close_with(std::string last) override { x_->end_with(std::move(last)); }

 private:
  std::shared_ptr<net::HttpExchange> x_;
};

std::optional<std::uint64_t> parse_id(const std::string& s) {
  std::uint64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

// The page may run only its own files: no inline script, nothing from
// elsewhere, never framed (a guest's text can never become code here).
const std::map<std::string, std::string>& page_headers() {
  static const std::map<std::string, std::string> h = {
      {"Content-Security-Policy",
       "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src "
       "'self'; form-action 'none'; base-uri 'none'; frame-ancestors 'none'"},
      {"X-Content-Type-Options", "nosniff"},
      {"Referrer-Policy", "no-referrer"},
      {"Cache-Control", "no-cache"},
  };
  return h;
}

}  // namespace

std::string StatusFeed::metrics() const {
  return render_metrics(store_, state_);
}

void StatusFeed::stream_events(std::shared_ptr<net::HttpExchange> x,
                               const coordinator::Caller& who) {
  const auto& req = x->request();
  std::string tenant;
  if (auto it = req.query.find("tenant"); it != req.query.end()) tenant = it->second;
  if (tenant.size() > 63)
    return x->respond(
        net::HttpResponseOut::error(400, "invalid_argument", "?tenant= takes one tenant name"));
  std::optional<std::uint64_t> after;
  std::string last = req.header("last-event-id");
  if (last.empty())
    if (auto it = req.query.find("last_event_id"); it != req.query.end()) last = it->second;
  if (!last.empty()) {
    after = parse_id(last);
    if (!after)
      return x->respond(net::HttpResponseOut::error(
          400, "invalid_argument", "Last-Event-ID must be an event id (a number) from this feed"));
  }
  EventBus& bus = state_.bus();
  EventBus::Reader reader{who.principal, who.principal == coordinator::kAdminPrincipal};
  if (auto why = bus.refusal(reader); !why.empty())
    return x->respond(net::HttpResponseOut::error(503, "unavailable", why + "; try again later"));
  // Proxies (nginx) would otherwise hold the events back in a buffer.
  x->start_stream(200, "text/event-stream; charset=utf-8", {{"X-Accel-Buffering", "no"}});
  auto sub = bus.subscribe(std::make_shared<ExchangeSink>(x), tenant, after, std::move(reader));
  if (!sub.handle) {
    // Taken in the meantime (or dropped already, which ended the stream).
    x->end_with(": " + sub.refusal + "; try again later\n\n");
    return;
  }
  x->on_gone([&bus, h = sub.handle] { bus.unsubscribe(h); });
}

void StatusFeed::install_routes(coordinator::ApiRouter& r, bool metrics_public) {
  r.add("GET", "/metrics",
        [this](auto&, auto&) {
          net::HttpResponseOut out;
          out.content_type = kMetricsContentType;
          out.body = metrics();
          return out;
        },
        {.public_route = metrics_public, .read_only = true});
  r.add("GET", "/v1/tenants",
        [this](auto&, auto&) { return coordinator::json_response(view_.tenants()); },
        {.read_only = true});
  // The dashboard's sign-in: a token for a session cookie.
  auto& auth = r.auth();
  r.add_stream("GET", "/v1/events",
               [this, &auth](std::shared_ptr<net::HttpExchange> x, auto&) {
                 // The router let it in; who it is decides which slots it may use.
                 auto who = auth.identify(x->request());
                 stream_events(std::move(x), who);
               },
               {.read_only = true});

  r.add("POST", "/v1/session",
        [&auth](const net::HttpRequestIn& req, auto&) {
          if (!coordinator::same_origin(req))
            return net::HttpResponseOut::error(403, "cross_origin",
                                               "sign in on the coordinator's own page");
          auto body = nlohmann::json::parse(req.body, nullptr, false);
          if (body.is_discarded() || !body.is_object() || !body.contains("token") ||
              !body["token"].is_string())
            return net::HttpResponseOut::error(400, "bad_request", "want {\"token\": TOKEN}");
          auto s = auth.sign_in(body["token"].get<std::string>());
          if (!s && s.error().code == Errc::unauthenticated) {
            spdlog::warn("api: dashboard sign-in with a wrong token from {}", req.header("host"));
            return net::HttpResponseOut::error(401, "unauthenticated", s.error().message);
          }
          if (!s) return net::HttpResponseOut::error(503, "unavailable", s.error().message);
          auto out =
              coordinator::json_response({{"access", coordinator::access_name(s->opened_with)},
                                          {"expires_at", format_rfc3339(s->expires_at)}});
          out.headers["Set-Cookie"] = coordinator::session_set_cookie(*s);
          out.headers["Cache-Control"] = "no-store";
          return out;
        },
        {.public_route = true});
  r.add("GET", "/v1/session",
        [](auto&, auto&) {
          return coordinator::json_response({{"access", "read-only"}});
        },
        {.read_only = true});
  r.add("DELETE", "/v1/session",
        [&auth](const net::HttpRequestIn& req, auto&) {
          if (!coordinator::same_origin(req))
            return net::HttpResponseOut::error(403, "cross_origin",
                                               "sign out on the coordinator's own page");
          auth.sign_out(coordinator::session_cookie(req));
          auto out = coordinator::json_response({{"signed_out", true}});
          out.headers["Set-Cookie"] = coordinator::session_clear_cookie();
          return out;
        },
        {.public_route = true});

  // The page itself holds nothing secret: what it shows comes from the
  // routes above, behind a token or a session.
  for (const auto& f : dashboard_files()) {
    r.add("GET", f.path,
          [&f](auto&, auto&) {
            net::HttpResponseOut out;
            out.content_type = f.content_type;
            out.body = f.text;
            out.headers = page_headers();
            return out;
          },
          {.public_route = true});
  }
}

}  // namespace factory::feed
