#include "agent/endpoint/routes.hpp"

#include <array>
#include <nlohmann/json.hpp>

namespace factory::agent::endpoint {

namespace {

struct Allowed {
  std::string_view path;
  std::string_view method;
};

// proxy.hpp's list: inference and read-only model facts, nothing that
// changes what is installed.
constexpr std::array<Allowed, 12> kAllowed{{
    {"/v1/models", "GET"},
    {"/api/tags", "GET"},
    {"/api/version", "GET"},
    {"/api/ps", "GET"},
    {"/v1/chat/completions", "POST"},
    {"/v1/completions", "POST"},
    {"/v1/embeddings", "POST"},
    {"/api/generate", "POST"},
    {"/api/chat", "POST"},
    {"/api/embed", "POST"},
    {"/api/embeddings", "POST"},
    {"/api/show", "POST"},
}};
// Plus GET /v1/models/{model}, one path segment, matched apart.

bool unreserved(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_' || c == '~' || c == ':';
}

// Not net::percent_encode: a model name's ':' (llama3.2:1b) is a pchar
// (RFC 3986) and reaches Ollama as it is, the way its clients send it.
std::string percent_encode(std::string_view s) {
  static const char hex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (unreserved(c)) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

Route decide(std::string_view method, std::string_view allowed_method, std::string target) {
  Route r;
  if (method != allowed_method) {
    r.verdict = RouteVerdict::wrong_method;
    r.allow = std::string(allowed_method);
    return r;
  }
  r.verdict = RouteVerdict::pass;
  r.upstream_target = std::move(target);
  return r;
}

}  // namespace

Route match_route(std::string_view method, std::string_view path) {
  constexpr std::string_view kModel = "/v1/models/";
  if (path.size() > kModel.size() && path.substr(0, kModel.size()) == kModel) {
    std::string_view model = path.substr(kModel.size());
    // One segment, and not a dot segment: "/v1/models/.." re-encoded is
    // still "..", which a path-cleaning router upstream reads as /v1/.
    if (model.find('/') != std::string_view::npos || model == "." || model == "..") return {};
    return decide(method, "GET", std::string(kModel) + percent_encode(model));
  }
  for (const auto& a : kAllowed) {
    if (a.path == path) return decide(method, a.method, std::string(a.path));
  }
  return {};
}

std::string error_body(const std::string& type, const std::string& code,
                       const std::string& message) {
  nlohmann::json j = {
      {"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", code}}}};
  return j.dump();
}

}  // namespace factory::agent::endpoint
