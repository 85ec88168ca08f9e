#include "common/cidr.hpp"

#include <charconv>

namespace factory {

Result<uint32_t> Ipv4Cidr::parse_address(std::string_view text) {
  uint32_t addr = 0;
  int parts = 0;
  size_t i = 0;
  while (parts < 4) {
    unsigned v = 0;
    auto [p, ec] = std::from_chars(text.data() + i, text.data() + text.size(), v);
    if (ec != std::errc() || v > 255 || p == text.data() + i)
      return Error(Errc::invalid_argument, "invalid IPv4 address '" + std::string(text) + "'");
    addr = (addr << 8) | v;
    i = static_cast<size_t>(p - text.data());
    ++parts;
    if (parts < 4) {
      if (i >= text.size() || text[i] != '.')
        return Error(Errc::invalid_argument, "invalid IPv4 address '" + std::string(text) + "'");
      ++i;
    }
  }
  if (i != text.size())
    return Error(Errc::invalid_argument, "invalid IPv4 address '" + std::string(text) + "'");
  return addr;
}

std::string Ipv4Cidr::format_address(uint32_t a) {
  return std::to_string(a >> 24) + "." + std::to_string((a >> 16) & 255) + "." +
         std::to_string((a >> 8) & 255) + "." + std::to_string(a & 255);
}

Result<Ipv4Cidr> Ipv4Cidr::parse(std::string_view text) {
  auto slash = text.find('/');
  if (slash == std::string_view::npos)
    return Error(Errc::invalid_argument,
                 "invalid CIDR '" + std::string(text) + "' (want a.b.c.d/n)");
  auto addr = parse_address(text.substr(0, slash));
  if (!addr) return addr.error();
  int prefix = -1;
  auto pt = text.substr(slash + 1);
  auto [p, ec] = std::from_chars(pt.data(), pt.data() + pt.size(), prefix);
  if (ec != std::errc() || p != pt.data() + pt.size() || prefix < 0 || prefix > 32)
    return Error(Errc::invalid_argument, "invalid CIDR prefix in '" + std::string(text) + "'");
  Ipv4Cidr c;
  c.prefix = prefix;
  c.network = *addr & c.mask();
  return c;
}

std::string Ipv4Cidr::str() const {
  return format_address(network) + "/" + std::to_string(prefix);
}

}  // namespace factory
