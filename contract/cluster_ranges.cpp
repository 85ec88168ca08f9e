#include "contract/cluster_ranges.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <charconv>
#include <optional>

namespace factory::ranges {

using nlohmann::json;

namespace {

Error invalid(const std::string& msg) {
  return Error(Errc::invalid_argument, msg);
}

// Whether the first `bits` bits of a and b agree.
bool same_prefix(const std::array<uint8_t, 16>& a, const std::array<uint8_t, 16>& b, int bits) {
  int full = bits / 8;
  for (int i = 0; i < full; ++i)
    if (a[i] != b[i]) return false;
  int rest = bits % 8;
  if (rest == 0) return true;
  uint8_t mask = static_cast<uint8_t>(0xff << (8 - rest));
  return (a[full] & mask) == (b[full] & mask);
}

Result<Ipv4Cidr> ipv4_range(const std::string& text, const char* key) {
  auto p = IpPrefix::parse(text);
  if (!p) return invalid(std::string(key) + ": " + p.error().message);
  if (p->v6)
    return invalid(std::string(key) + " " + text +
                   " is IPv6: the guest cluster is IPv4 only (RKE2 single-stack); give an IPv4 "
                   "range");
  return Ipv4Cidr::parse(p->str());
}

}  // namespace

Result<IpPrefix> IpPrefix::parse(std::string_view text) {
  std::string s(text);
  auto slash = s.find('/');
  std::string addr = s.substr(0, slash);
  IpPrefix p;
  if (addr.find(':') != std::string::npos) {
    p.v6 = true;
    in6_addr a{};
    if (inet_pton(AF_INET6, addr.c_str(), &a) != 1)
      return invalid("invalid IPv6 address '" + addr + "' in '" + s + "'");
    for (int i = 0; i < 16; ++i) p.bytes[i] = a.s6_addr[i];
  } else {
    auto v4 = Ipv4Cidr::parse_address(addr);
    if (!v4) return invalid(v4.error().message + " in '" + s + "'");
    for (int i = 0; i < 4; ++i) p.bytes[i] = static_cast<uint8_t>(*v4 >> (24 - 8 * i));
  }
  p.prefix = p.bits();
  if (slash != std::string::npos) {
    std::string_view pt(s.data() + slash + 1, s.size() - slash - 1);
    int n = -1;
    auto [end, ec] = std::from_chars(pt.data(), pt.data() + pt.size(), n);
    if (pt.empty() || ec != std::errc() || end != pt.data() + pt.size() || n < 0 || n > p.bits())
      return invalid("invalid prefix length in '" + s + "' (0 to " + std::to_string(p.bits()) +
                     ")");
    p.prefix = n;
  }
  // Host bits zeroed, so equal ranges compare equal and print alike.
  for (int bit = p.prefix; bit < p.bits(); ++bit)
    p.bytes[bit / 8] &= static_cast<uint8_t>(~(0x80 >> (bit % 8)));
  return p;
}

IpPrefix IpPrefix::from(const Ipv4Cidr& c) {
  IpPrefix p;
  for (int i = 0; i < 4; ++i) p.bytes[i] = static_cast<uint8_t>(c.network >> (24 - 8 * i));
  p.prefix = c.prefix;
  return p;
}

bool IpPrefix::overlaps(const IpPrefix& o) const {
  if (v6 != o.v6) return false;
  return same_prefix(bytes, o.bytes, std::min(prefix, o.prefix));
}

std::string IpPrefix::str() const {
  char buf[INET6_ADDRSTRLEN] = {};
  if (v6) {
    in6_addr a{};
    for (int i = 0; i < 16; ++i) a.s6_addr[i] = bytes[i];
    inet_ntop(AF_INET6, &a, buf, sizeof buf);
  } else {
    in_addr a{};
    a.s_addr = htonl(static_cast<uint32_t>(bytes[0]) << 24 | static_cast<uint32_t>(bytes[1]) << 16 |
                     static_cast<uint32_t>(bytes[2]) << 8 | bytes[3]);
    inet_ntop(AF_INET, &a, buf, sizeof buf);
  }
  return std::string(buf) + "/" + std::to_string(prefix);
}

std::vector<std::string> Pool::default_blocks() {
  // 10.52/16 and 10.53/16 first: what the runbook's guest uses on an RKE2
  // host. Then the rest of 10/8 above RKE2's and k3s's 10.42/10.43, then
  // 172.16/12 for hosts that use all of that.
  return {"10.52.0.0/14", "10.56.0.0/13", "10.64.0.0/10", "172.16.0.0/12"};
}

Status Pool::check() const {
  if (blocks.empty()) return invalid("blocks: must list at least one block");
  for (auto [key, n] : {std::pair{"pod_prefix", pod_prefix}, {"service_prefix", service_prefix}})
    if (n < 8 || n > 28)
      return invalid(std::string(key) + ": must be 8 to 28, got " + std::to_string(n));
  if (dns_offset < 1 || dns_offset >= (1 << (32 - service_prefix)) - 1)
    return invalid("dns_offset: " + std::to_string(dns_offset) + " is not an address inside a /" +
                   std::to_string(service_prefix));
  for (size_t i = 0; i < blocks.size(); ++i) {
    std::string where = "blocks[" + std::to_string(i) + "]";
    auto p = IpPrefix::parse(blocks[i]);
    if (!p) return invalid(where + ": " + p.error().message);
    if (p->v6)
      return invalid(where + ": " + blocks[i] +
                     " is IPv6: the guest cluster is IPv4 only (RKE2 single-stack)");
  }
  return ok_status();
}

Result<std::vector<std::pair<IpPrefix, Fact>>> parse_facts(const std::vector<Fact>& facts) {
  std::vector<std::pair<IpPrefix, Fact>> out;
  for (const auto& f : facts) {
    auto p = IpPrefix::parse(f.range);
    if (!p) return invalid("cannot read " + f.source + ": " + p.error().message);
    out.emplace_back(*p, f);
  }
  return out;
}

const Fact* first_clash(const IpPrefix& range,
                        const std::vector<std::pair<IpPrefix, Fact>>& facts) {
  for (const auto& [p, f] : facts)
    if (p.overlaps(range)) return &f;
  return nullptr;
}

namespace {

std::string describe(const Fact& f) {
  return f.range + " (" + f.source + ")";
}

// The first aligned range of `size` in the pool that overlaps no fact and
// none of `also`; `why` collects, per block, what took it.
std::optional<Ipv4Cidr> first_free(const std::vector<Ipv4Cidr>& blocks, int size,
                                   const std::vector<std::pair<IpPrefix, Fact>>& facts,
                                   const std::vector<std::pair<IpPrefix, Fact>>& also,
                                   std::vector<std::string>& why) {
  for (const auto& b : blocks) {
    int prefix = std::max(size, b.prefix);
    uint64_t step = uint64_t{1} << (32 - prefix);
    for (uint64_t n = b.first(); n <= b.last(); n += step) {
      Ipv4Cidr c;
      c.prefix = prefix;
      c.network = static_cast<uint32_t>(n);
      auto p = IpPrefix::from(c);
      const Fact* f = first_clash(p, facts);
      if (!f) f = first_clash(p, also);
      if (!f) return c;
      std::string d = describe(*f);
      if (std::find(why.begin(), why.end(), d) == why.end()) why.push_back(d);
    }
  }
  return std::nullopt;
}

std::string joined(const std::vector<std::string>& v, size_t max = 4) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < max; ++i) s += (i ? ", " : "") + v[i];
  if (v.size() > max) s += " and " + std::to_string(v.size() - max) + " more";
  return s;
}

}  // namespace

Result<Chosen> choose(const std::vector<Fact>& facts, const Pool& pool) {
  if (auto s = pool.check(); !s) return invalid("pool." + s.error().message);
  auto parsed = parse_facts(facts);
  if (!parsed) return parsed.error();
  std::vector<Ipv4Cidr> blocks;
  for (const auto& b : pool.blocks) blocks.push_back(*Ipv4Cidr::parse(IpPrefix::parse(b)->str()));

  std::vector<std::string> why;
  auto pods = first_free(blocks, pool.pod_prefix, *parsed, {}, why);
  if (!pods)
    return Error(Errc::failed_precondition, "no free /" + std::to_string(pool.pod_prefix) +
                                                " for the guest's pods in pool " +
                                                joined(pool.blocks) + ": taken by " + joined(why) +
                                                "; add a block to the pool (guest_ranges.pool)");
  std::vector<std::pair<IpPrefix, Fact>> mine{
      {IpPrefix::from(*pods), Fact{pods->str(), "the guest's own pod range"}}};
  why.clear();
  auto svcs = first_free(blocks, pool.service_prefix, *parsed, mine, why);
  if (!svcs)
    return Error(Errc::failed_precondition, "no free /" + std::to_string(pool.service_prefix) +
                                                " for the guest's services in pool " +
                                                joined(pool.blocks) + ": taken by " + joined(why) +
                                                "; add a block to the pool (guest_ranges.pool)");
  return Chosen{pods->str(), svcs->str(),
                Ipv4Cidr::format_address(svcs->host(static_cast<uint32_t>(pool.dns_offset)))};
}

Status check_fixed(const Chosen& fixed, const std::vector<Fact>& facts) {
  auto pods = ipv4_range(fixed.cluster_cidr, "cluster-cidr");
  if (!pods) return pods.error();
  auto svcs = ipv4_range(fixed.service_cidr, "service-cidr");
  if (!svcs) return svcs.error();
  if (fixed.cluster_dns.find(':') != std::string::npos)
    return invalid("cluster-dns " + fixed.cluster_dns + " is IPv6: the guest cluster is IPv4 only");
  auto dns = Ipv4Cidr::parse_address(fixed.cluster_dns);
  if (!dns) return invalid("cluster-dns: " + dns.error().message);
  if (pods->overlaps(*svcs))
    return invalid("cluster-cidr " + pods->str() + " overlaps service-cidr " + svcs->str());
  if (!svcs->contains(*dns))
    return invalid("cluster-dns " + fixed.cluster_dns + " is outside service-cidr " + svcs->str());
  auto parsed = parse_facts(facts);
  if (!parsed) return parsed.error();
  for (auto [key, r] : {std::pair{"cluster-cidr", *pods}, {"service-cidr", *svcs}})
    if (const Fact* f = first_clash(IpPrefix::from(r), *parsed))
      return Error(Errc::failed_precondition,
                   std::string(key) + " " + r.str() + " overlaps " + describe(*f) +
                       ": the guest's DNS or routes would clash; fix the catalog's ranges or "
                       "leave them out so they are chosen");
  return ok_status();
}

json to_json(const std::vector<Fact>& facts) {
  json a = json::array();
  for (const auto& f : facts) a.push_back({{"range", f.range}, {"source", f.source}});
  return a;
}

Result<std::vector<Fact>> facts_from_json(const json& j, const std::string& where) {
  if (!j.is_array()) return invalid(where + ": must be a list of {range, source}");
  std::vector<Fact> out;
  for (size_t i = 0; i < j.size(); ++i) {
    const json& e = j[i];
    std::string w = where + "[" + std::to_string(i) + "]";
    if (!e.is_object() || !e.contains("range") || !e["range"].is_string())
      return invalid(w + ": must be {range, source} with range a string");
    if (!e.contains("source") || !e["source"].is_string())
      return invalid(w + ".source: must say where the range was seen");
    Fact f{e["range"].get<std::string>(), e["source"].get<std::string>()};
    if (auto p = IpPrefix::parse(f.range); !p) return invalid(w + ".range: " + p.error().message);
    out.push_back(std::move(f));
  }
  return out;
}

json to_json(const Pool& p) {
  return {{"blocks", p.blocks},
          {"pod_prefix", p.pod_prefix},
          {"service_prefix", p.service_prefix},
          {"dns_offset", p.dns_offset}};
}

Result<Pool> pool_from_json(const json& j, const std::string& where) {
  Pool p;
  if (!j.is_object()) return invalid(where + ": must be a map");
  for (auto& [k, v] : j.items()) {
    if (k == "blocks") {
      if (!v.is_array()) return invalid(where + ".blocks: must be a list of IPv4 ranges");
      p.blocks.clear();
      for (const auto& b : v) {
        if (!b.is_string()) return invalid(where + ".blocks: must be a list of IPv4 ranges");
        p.blocks.push_back(b.get<std::string>());
      }
    } else if (k == "pod_prefix" || k == "service_prefix" || k == "dns_offset") {
      if (!v.is_number_integer()) return invalid(where + "." + k + ": must be a whole number");
      int n = v.get<int>();
      (k == "pod_prefix"       ? p.pod_prefix
       : k == "service_prefix" ? p.service_prefix
                               : p.dns_offset) = n;
    } else {
      return invalid(where + "." + k +
                     ": unknown key (blocks, pod_prefix, service_prefix, dns_offset)");
    }
  }
  if (auto s = p.check(); !s) return invalid(where + "." + s.error().message);
  return p;
}

json to_json(const Chosen& c) {
  return {{"cluster-cidr", c.cluster_cidr},
          {"service-cidr", c.service_cidr},
          {"cluster-dns", c.cluster_dns}};
}

}  // namespace factory::ranges
