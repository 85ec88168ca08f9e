#include "agent/guest/network.hpp"

#include <algorithm>
#include <sstream>

#include "agent/guest/dns.hpp"
#include "common/atomic_file.hpp"
#include "common/cidr.hpp"

namespace factory::agent {

namespace {

bool hex32(const std::string& s, uint32_t& out) {
  if (s.size() != 8) return false;
  try {
    size_t used = 0;
    out = static_cast<uint32_t>(std::stoul(s, &used, 16));
    return used == 8;
  } catch (...) {
    return false;
  }
}

// The kernel prints addresses in memory order, which on the little-endian
// machines guests run on reads back to front: 0002000A is 10.0.2.0.
uint32_t from_kernel(uint32_t v) {
  return (v & 0xff) << 24 | ((v >> 8) & 0xff) << 16 | ((v >> 16) & 0xff) << 8 | (v >> 24);
}

int prefix_of(uint32_t mask) {
  int n = 0;
  while (n < 32 && (mask & (0x80000000u >> n))) ++n;
  // A mask with holes is no prefix: say so by refusing it.
  return (n == 32 || (mask << n) == 0) ? n : -1;
}

void add(std::vector<ranges::Fact>& out, ranges::Fact f) {
  if (std::find(out.begin(), out.end(), f) == out.end()) out.push_back(std::move(f));
}

}  // namespace

std::vector<GuestRoute> parse_proc_net_route(const std::string& text) {
  std::vector<GuestRoute> out;
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string iface, dest, gw, flags, refcnt, use, metric, mask;
    if (!(ls >> iface >> dest >> gw >> flags >> refcnt >> use >> metric >> mask)) continue;
    uint32_t d = 0, m = 0;
    if (!hex32(dest, d) || !hex32(mask, m)) continue;
    Ipv4Cidr c;
    c.prefix = prefix_of(from_kernel(m));
    if (c.prefix <= 0) continue;  // the default route says nothing is in use
    c.network = from_kernel(d) & c.mask();
    out.push_back({c.str(), iface});
  }
  return out;
}

std::vector<GuestRoute> parse_proc_net_ipv6_route(const std::string& text) {
  std::vector<GuestRoute> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string dest, plen, src, splen, next, metric, refcnt, use, flags, iface;
    if (!(ls >> dest >> plen >> src >> splen >> next >> metric >> refcnt >> use >> flags >> iface))
      continue;
    if (dest.size() != 32 || plen.size() != 2) continue;
    std::string addr;
    for (size_t i = 0; i < 32; i += 4) addr += (i ? ":" : "") + dest.substr(i, 4);
    int n = 0;
    try {
      n = std::stoi(plen, nullptr, 16);
    } catch (...) {
      continue;
    }
    auto p = ranges::IpPrefix::parse(addr + "/" + std::to_string(n));
    if (!p || n == 0 || iface == "lo") continue;
    // Link-local (fe80::/10) and multicast (ff00::/8) are on every link.
    if (p->bytes[0] == 0xff || (p->bytes[0] == 0xfe && (p->bytes[1] & 0xc0) == 0x80)) continue;
    out.push_back({p->str(), iface});
  }
  return out;
}

std::vector<ranges::Fact> guest_network_facts(const GuestEnv& env) {
  std::vector<ranges::Fact> out;
  if (auto t = read_file(env.path("/proc/net/route")))
    for (const auto& r : parse_proc_net_route(*t))
      if (r.iface != "lo") add(out, {r.range, "guest route on " + r.iface});
  if (auto t = read_file(env.path("/proc/net/ipv6_route")))
    for (const auto& r : parse_proc_net_ipv6_route(*t))
      add(out, {r.range, "guest route on " + r.iface});
  for (const auto& d : guest_dns_servers(env))
    add(out, {d, "guest DNS server (resolv.conf, from DHCP)"});
  add(out, {kKubeVirtMasqueradeNet, "KubeVirt masquerade network"});
  return out;
}

}  // namespace factory::agent
