#include "coordinator/api/router.hpp"

#include <spdlog/spdlog.h>

#include "common/pki.hpp"

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
                    bool public_route) {
  routes_.push_back({method, split_path(pattern), std::move(h), public_route});
}

net::HttpResponseOut ApiRouter::handle(const net::HttpRequestIn& req,
                                       const net::PeerInfo& peer) const {
  auto segs = split_path(req.path);
  bool path_matched = false;
  for (auto& r : routes_) {
    if (r.segments.size() != segs.size()) continue;
    PathParams params;
    bool match = true;
    for (size_t i = 0; i < segs.size() && match; ++i) {
      const auto& p = r.segments[i];
      if (p.size() > 2 && p.front() == '{' && p.back() == '}')
        params[p.substr(1, p.size() - 2)] = segs[i];
      else
        match = p == segs[i];
    }
    if (!match) continue;
    path_matched = true;
    if (r.method != req.method) continue;
    if (!r.public_route) {
      std::string auth = req.header("authorization");
      const std::string prefix = "Bearer ";
      if (auth.rfind(prefix, 0) != 0 ||
          !pki::secure_equals(auth.substr(prefix.size()), admin_token_)) {
        spdlog::warn("api: unauthenticated {} {} from {}", req.method, req.path, peer.remote);
        return net::HttpResponseOut::error(
            401, "unauthenticated",
            "missing or wrong admin token (the coordinator's <state_dir>/admin.token)");
      }
    }
    return r.handler(req, params);
  }
  if (path_matched)
    return net::HttpResponseOut::error(405, "method_not_allowed",
                                       req.method + " is not allowed on " + req.path);
  return net::HttpResponseOut::error(404, "not_found", "no such path: " + req.path);
}

}  // namespace factory::coordinator
