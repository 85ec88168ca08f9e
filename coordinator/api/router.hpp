#pragma once
// Routes of the admin API and status feed. Modules add their routes at
// start-up; every route but the explicitly public ones needs the admin
// token (Authorization: Bearer ...), compared in constant time.
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/net/https_server.hpp"

namespace factory::coordinator {

using PathParams = std::map<std::string, std::string>;
using RouteHandler =
    std::function<net::HttpResponseOut(const net::HttpRequestIn&, const PathParams&)>;

class ApiRouter {
 public:
  explicit ApiRouter(std::string admin_token) : admin_token_(std::move(admin_token)) {}
  // pattern: "/v1/tenants/{name}"; a {param} matches one path segment.
  void add(const std::string& method, const std::string& pattern, RouteHandler h,
           bool public_route = false);
  net::HttpResponseOut handle(const net::HttpRequestIn& req, const net::PeerInfo& peer) const;

 private:
  struct Route {
    std::string method;
    std::vector<std::string> segments;
    RouteHandler handler;
    bool public_route;
  };
  std::string admin_token_;
  std::vector<Route> routes_;
};

std::vector<std::string> split_path(const std::string& path);

// A JSON answer as every route gives it: pretty, with a final newline.
net::HttpResponseOut json_response(const nlohmann::json& j, int status = 200);

}  // namespace factory::coordinator
