#pragma once
// URLs as Factory's clients dial them: http(s):// for the admin API, the
// Kubernetes API and Ollama, wss:// for the agent link. One parser for all of
// them, strict about what it accepts (ports, IPv6 literals, no user info).
#include <cstdint>
#include <string>
#include <string_view>

#include "common/error.hpp"

namespace factory::net {

struct Url {
  std::string scheme;  // http | https | ws | wss
  bool tls = false;    // https or wss
  std::string host;    // without brackets: "::1", "example.com"
  std::string port;    // always set: the explicit one or the scheme's default
  std::string target;  // "/path?query"
  bool host_is_ip = false;
  bool default_port = true;

  uint16_t port_number() const { return static_cast<uint16_t>(std::stoi(port)); }
  // "https://[::1]:6443": how the caller named the server, for messages.
  std::string origin() const;
  // The Host header: the port only when it is not the scheme's default.
  std::string host_header() const;
};

Result<Url> parse_url(const std::string& url);

// One path segment or query value as a client puts it in a URL: RFC 3986's
// unreserved characters stay, every other byte becomes %XX. A name that
// holds '/', '?' or '%' then stays one segment, whoever chose it.
std::string percent_encode(std::string_view s);
// The inverse, as a server reads a segment or a query value: %XX becomes the
// byte (a '%' not followed by two hex digits stays as it is); in a query,
// plus_is_space reads '+' as a space (application/x-www-form-urlencoded).
std::string percent_decode(std::string_view s, bool plus_is_space = false);

}  // namespace factory::net
