#pragma once
// What the proxy decides before Ollama is asked (proxy.hpp lists the paths):
// a request's route, and the error bodies it answers with (the key comes out
// of the Authorization header with net::bearer_token, the coordinator's
// parser). Pure functions, tested on their own.
#include <optional>
#include <string>
#include <string_view>

namespace factory::agent::endpoint {

enum class RouteVerdict { pass, not_found, wrong_method };

struct Route {
  RouteVerdict verdict = RouteVerdict::not_found;
  // pass: the path Ollama is asked (the allowed path itself, never the
  // client's raw target: no query, a {model} segment percent-encoded again).
  std::string upstream_target;
  std::string allow;  // wrong_method: the Allow header's value
};

// path: percent-decoded, without the query (HttpRequestIn::path).
Route match_route(std::string_view method, std::string_view path);

// The errors the proxy itself answers, in the shape OpenAI clients read:
//   {"error":{"message":..., "type":..., "param":null, "code":...}}
// 401 invalid_request_error/invalid_api_key, 404 invalid_request_error/
// unknown_url, 405 invalid_request_error/method_not_allowed, 503
// server_error/busy, 502 server_error/upstream_unavailable. (A body over
// max_request_body is refused by the server itself before the proxy sees
// it: 413 {"error":{"code":"too_large","message":...}}.)
std::string error_body(const std::string& type, const std::string& code,
                       const std::string& message);

}  // namespace factory::agent::endpoint
