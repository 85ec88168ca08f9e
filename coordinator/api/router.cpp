#include "coordinator/api/router.hpp"

#include <spdlog/spdlog.h>

#include "common/net/url.hpp"

namespace factory::coordinator {

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < path.size()) {
    size_t slash = path.find('/', pos);
    if (slash == std::string::npos) slash = path.size();
    if (slash > pos) out.push_back(path.substr(pos, slash - pos));
    pos = slash + 1;
  }
  return out;
}

net::HttpResponseOut json_response(const nlohmann::json& j, int status) {
  return net::HttpResponseOut::json(status, j.dump(2) + "\n");
}

void ApiRouter::add(const std::string& method, const std::string& pattern, RouteHandler h,
                    RouteOptions o) {
  routes_.push_back({method, split_path(pattern), std::move(h), nullptr, o});
}

void ApiRouter::add_stream(const std::string& method, const std::string& pattern, StreamHandler h,
                           RouteOptions o) {
  routes_.push_back({method, split_path(pattern), nullptr, std::move(h), o});
}

std::vector<std::string> decoded_segments(const std::string& target) {
  auto segs = split_path(target.substr(0, target.find('?')));
  for (auto& s : segs) s = net::percent_decode(s);
  return segs;
}

const ApiRouter::Route* ApiRouter::match(const net::HttpRequestIn& req, const net::PeerInfo& peer,
                                         PathParams& params, net::HttpResponseOut& refusal) const {
  // Split before decoding: "/v1/tenants/t5%2Fcredentials" is one name,
  // "t5/credentials", which no route's {name} accepts as a tenant, never the
  // credentials route of t5.
  auto segs = decoded_segments(req.target);
  bool path_matched = false;
  for (auto& r : routes_) {
    if (r.segments.size() != segs.size()) continue;
    PathParams p;
    bool same = true;
    for (size_t i = 0; i < segs.size() && same; ++i) {
      const auto& s = r.segments[i];
      if (s.size() > 2 && s.front() == '{' && s.back() == '}')
        p[s.substr(1, s.size() - 2)] = segs[i];
      else
        same = s == segs[i];
    }
    if (!same) continue;
    path_matched = true;
    if (r.method != req.method) continue;
    if (!r.options.public_route) {
      const Caller who = auth_.identify(req);
      const Access access = who.access;
      const bool by_cookie = who.by_session;
      if (access == Access::none) {
        spdlog::warn("api: unauthenticated {} {} from {}", req.method, req.path, peer.remote);
        refusal = net::HttpResponseOut::error(
            401, "unauthenticated",
            "missing or wrong admin token (the coordinator's <state_dir>/admin.token)");
        return nullptr;
      }
      if (access != Access::admin || by_cookie) {
        if (!r.options.read_only || req.method != "GET") {
          refusal = net::HttpResponseOut::error(
              403, "forbidden",
              std::string(by_cookie ? "a dashboard session" : "a read-only token") +
                  " may only read the status feed (GET of /v1/tenants, /v1/events, /metrics); " +
                  req.method + " " + req.path + " needs the admin token");
          return nullptr;
        }
        if (by_cookie && !same_origin(req)) {
          spdlog::warn("api: cross-origin {} {} from {} (Origin {})", req.method, req.path,
                       peer.remote, req.header("origin"));
          refusal = net::HttpResponseOut::error(
              403, "cross_origin",
              "a dashboard session is good only on the coordinator's own page");
          return nullptr;
        }
      }
    }
    params = std::move(p);
    return &r;
  }
  refusal = path_matched
                ? net::HttpResponseOut::error(405, "method_not_allowed",
                                              req.method + " is not allowed on " + req.path)
                : net::HttpResponseOut::error(404, "not_found", "no such path: " + req.path);
  return nullptr;
}

namespace {

net::HttpResponseOut run_guarded(const RouteHandler& h, const net::HttpRequestIn& req,
                                 const PathParams& params) {
  try {
    return h(req, params);
  } catch (const std::exception& e) {
    // A bug, not the client's fault; the coordinator stays up.
    spdlog::error("api: {} {} failed with an exception: {}", req.method, req.path, e.what());
    return net::HttpResponseOut::error(500, "internal", "internal error; see the coordinator log");
  }
}

}  // namespace

void ApiRouter::handle(std::shared_ptr<net::HttpExchange> x) const {
  PathParams params;
  net::HttpResponseOut refusal;
  const Route* r = match(x->request(), x->peer(), params, refusal);
  if (!r) return x->respond(std::move(refusal));
  if (r->stream) {
    try {
      r->stream(x, params);
    } catch (const std::exception& e) {
      spdlog::error("api: stream {} failed with an exception: {}", x->request().path, e.what());
      x->respond(
          net::HttpResponseOut::error(500, "internal", "internal error; see the coordinator log"));
    }
    return;
  }
  if (!r->options.blocking) return x->respond(run_guarded(r->handler, x->request(), params));
  const RouteHandler* h = &r->handler;
  bool queued = workers_.post(
      [h, x, params = std::move(params)] { x->respond(run_guarded(*h, x->request(), params)); });
  if (!queued)
    x->respond(net::HttpResponseOut::error(503, "unavailable", "the coordinator is stopping"));
}

net::HttpResponseOut ApiRouter::handle_now(const net::HttpRequestIn& req,
                                           const net::PeerInfo& peer) const {
  PathParams params;
  net::HttpResponseOut refusal;
  const Route* r = match(req, peer, params, refusal);
  if (!r) return refusal;
  if (!r->handler) return net::HttpResponseOut::error(400, "bad_request", "a stream route");
  return run_guarded(r->handler, req, params);
}

}  // namespace factory::coordinator
