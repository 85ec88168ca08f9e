#pragma once
// IPv4 CIDR math, used to pick guest cluster ranges that cannot clash with
// the host cluster's (the runbook's DNS-clash failure).
#include <cstdint>
#include <string>
#include <string_view>

#include "common/error.hpp"

namespace factory {

struct Ipv4Cidr {
  uint32_t network = 0;  // host byte order, host bits zeroed
  int prefix = 0;

  static Result<Ipv4Cidr> parse(std::string_view text);
  static Result<uint32_t> parse_address(std::string_view text);
  static std::string format_address(uint32_t addr);

  uint32_t mask() const { return prefix == 0 ? 0 : ~uint32_t{0} << (32 - prefix); }
  uint32_t first() const { return network; }
  uint32_t last() const { return network | ~mask(); }
  bool contains(uint32_t addr) const { return (addr & mask()) == network; }
  bool overlaps(const Ipv4Cidr& o) const { return first() <= o.last() && o.first() <= last(); }
  // The n-th address inside the range (n=10 gives x.y.0.10 for the DNS service).
  uint32_t host(uint32_t n) const { return network + n; }
  std::string str() const;
  bool operator==(const Ipv4Cidr&) const = default;
};

}  // namespace factory
