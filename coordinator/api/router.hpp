#pragma once
// Routes of the admin API and status feed. Modules add their routes at
// start-up; every route but the explicitly public ones needs the admin
// token (Authorization: Bearer ...), compared in constant time. A route
// marked read_only may also be read (GET) with a read-only token or a
// dashboard session cookie from this origin (auth.hpp).
//
// Where a route runs: a route that answers from memory runs on the io
// thread that read the request; one marked `blocking` (it calls Kubernetes,
// signs, or waits for the store) runs on the worker pool, so a slow cluster
// slows the requests that need it and nothing else. A stream route (SSE) is
// handed the exchange itself and writes to it as long as it likes.
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/net/server.hpp"
#include "common/worker_pool.hpp"
#include "coordinator/api/auth.hpp"

namespace factory::coordinator {

using PathParams = std::map<std::string, std::string>;
using RouteHandler =
    std::function<net::HttpResponseOut(const net::HttpRequestIn&, const PathParams&)>;
using StreamHandler = std::function<void(std::shared_ptr<net::HttpExchange>, const PathParams&)>;

struct RouteOptions {
  bool public_route = false;  // no token needed
  bool blocking = false;      // runs on the worker pool
  // GET of the status feed: read-only tokens and dashboard sessions may call it.
  bool read_only = false;
};

class ApiRouter {
 public:
  ApiRouter(std::string admin_token, WorkerPool& workers)
      : auth_(std::move(admin_token)), workers_(workers) {}
  ApiAuth& auth() { return auth_; }
  // pattern: "/v1/tenants/{name}"; a {param} matches one path segment.
  void add(const std::string& method, const std::string& pattern, RouteHandler h,
           RouteOptions o = {});
  void add_stream(const std::string& method, const std::string& pattern, StreamHandler h,
                  RouteOptions o = {});
  // The server's HttpHandler.
  void handle(std::shared_ptr<net::HttpExchange> x) const;
  // For tests and the few callers that answer in place.
  net::HttpResponseOut handle_now(const net::HttpRequestIn& req, const net::PeerInfo& peer) const;

 private:
  struct Route {
    std::string method;
    std::vector<std::string> segments;
    RouteHandler handler;
    StreamHandler stream;
    RouteOptions options;
  };
  // The route for a request, or the error to answer with.
  const Route* match(const net::HttpRequestIn& req, const net::PeerInfo& peer, PathParams& params,
                     net::HttpResponseOut& refusal) const;
  ApiAuth auth_;
  WorkerPool& workers_;
  std::vector<Route> routes_;
};

std::vector<std::string> split_path(const std::string& path);
// A request target's path (the query cut off) as segments, each one
// percent-decoded after the split: what routes match.
std::vector<std::string> decoded_segments(const std::string& target);

// A JSON answer as every route gives it: pretty, with a final newline.
net::HttpResponseOut json_response(const nlohmann::json& j, int status = 200);

}  // namespace factory::coordinator
