#include "common/net/url.hpp"

#include <algorithm>
#include <boost/asio/ip/address.hpp>
#include <string_view>

namespace factory::net {

namespace {
std::string bracketed(const std::string& host) {
  return host.find(':') != std::string::npos ? "[" + host + "]" : host;
}
}  // namespace

std::string Url::origin() const {
  return scheme + "://" + bracketed(host) + (default_port ? "" : ":" + port);
}

std::string Url::host_header() const {
  return default_port ? bracketed(host) : bracketed(host) + ":" + port;
}

Result<Url> parse_url(const std::string& s) {
  Url u;
  std::string_view rest = s;
  auto sep = rest.find("://");
  if (sep == std::string_view::npos)
    return Error(Errc::invalid_argument,
                 "URL '" + s + "' must start with http://, https://, ws:// or wss://");
  u.scheme = std::string(rest.substr(0, sep));
  if (u.scheme != "http" && u.scheme != "https" && u.scheme != "ws" && u.scheme != "wss")
    return Error(Errc::invalid_argument,
                 "URL '" + s + "' must start with http://, https://, ws:// or wss://");
  u.tls = u.scheme == "https" || u.scheme == "wss";
  rest.remove_prefix(sep + 3);
  auto slash = rest.find_first_of("/?");
  std::string_view authority = rest.substr(0, slash);
  u.target = slash == std::string_view::npos ? "/" : std::string(rest.substr(slash));
  if (u.target.front() == '?') u.target.insert(0, "/");
  if (authority.find('@') != std::string_view::npos)
    return Error(Errc::invalid_argument, "URL '" + s + "': user info in URLs is not supported");
  std::string_view port;
  if (authority.starts_with("[")) {
    auto close = authority.find(']');
    if (close == std::string_view::npos)
      return Error(Errc::invalid_argument, "URL '" + s + "': unterminated IPv6 literal");
    u.host = std::string(authority.substr(1, close - 1));
    auto after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':')
        return Error(Errc::invalid_argument, "URL '" + s + "': junk after IPv6 literal");
      port = after.substr(1);
    }
  } else {
    auto colon = authority.rfind(':');
    if (colon != std::string_view::npos) {
      u.host = std::string(authority.substr(0, colon));
      port = authority.substr(colon + 1);
    } else {
      u.host = std::string(authority);
    }
  }
  if (u.host.empty()) return Error(Errc::invalid_argument, "URL '" + s + "' has no host");
  const std::string default_port = u.tls ? "443" : "80";
  if (!port.empty()) {
    if (port.size() > 5 ||
        !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
        std::stoi(std::string(port)) == 0 || std::stoi(std::string(port)) > 65535)
      return Error(Errc::invalid_argument, "URL '" + s + "': bad port '" + std::string(port) + "'");
    u.port = std::string(port);
    u.default_port = u.port == default_port;
  } else {
    u.port = default_port;
  }
  boost::system::error_code ec;
  boost::asio::ip::make_address(u.host, ec);
  u.host_is_ip = !ec;
  return u;
}

}  // namespace factory::net
