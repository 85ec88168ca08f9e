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

std::string percent_encode(std::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    const bool unreserved = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                            (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' || c == '~';
    if (unreserved) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

std::string percent_decode(std::string_view s, bool plus_is_space) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      int h = hex(s[i + 1]), l = hex(s[i + 2]);
      if (h >= 0 && l >= 0) {
        out.push_back(static_cast<char>(h * 16 + l));
        i += 2;
        continue;
      }
    }
    out.push_back(plus_is_space && s[i] == '+' ? ' ' : s[i]);
  }
  return out;
}

}  // namespace factory::net
