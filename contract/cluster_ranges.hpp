#pragma once
// The guest cluster's ranges (pods, services, the DNS service's address),
// picked around what already exists: the host cluster's ranges, read from its
// API by the coordinator, and the guest's own networks, read by the agent.
// The runbook's failure this prevents: a guest service range that holds the
// host's DNS address, so the guest's kube-proxy claims it and the guest's DNS
// times out. Pure: no I/O, the same answer on both sides of the wire.
//
// IPv6: facts may be IPv6 (a dual-stack host); they are kept and shown, and
// cannot clash with the guest's ranges, which are IPv4 only. An IPv6 range
// asked of the guest (a pool block, or a catalog's fixed range) is refused
// with that reason, never dropped.
#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/cidr.hpp"
#include "common/error.hpp"

namespace factory::ranges {

// An IPv4 or IPv6 prefix. A bare address is a /32 (or /128).
struct IpPrefix {
  bool v6 = false;
  std::array<uint8_t, 16> bytes{};  // v4 uses the first 4, host bits zeroed
  int prefix = 0;

  static Result<IpPrefix> parse(std::string_view text);
  static IpPrefix from(const Ipv4Cidr& c);
  int bits() const { return v6 ? 128 : 32; }
  // Prefixes of different families never overlap.
  bool overlaps(const IpPrefix& o) const;
  std::string str() const;
  bool operator==(const IpPrefix&) const = default;
};

// Something already using addresses, and where it was seen: "host node utho
// spec.podCIDRs", "guest resolv.conf nameserver".
struct Fact {
  std::string range;  // as seen: "10.42.0.0/24", "10.43.0.10", "fd00:10:96::/112"
  std::string source;
  bool operator==(const Fact&) const = default;
};

// Where the guest's ranges are picked from: each block is carved into aligned
// ranges of the given sizes, in order, and the first free ones win.
struct Pool {
  std::vector<std::string> blocks = default_blocks();
  int pod_prefix = 16;
  int service_prefix = 16;
  // The DNS service is this address of the service range (10: x.y.0.10,
  // what RKE2, k3s and kubeadm use).
  int dns_offset = 10;

  static std::vector<std::string> default_blocks();
  // Sizes in range and every block an IPv4 prefix; the error names the key.
  Status check() const;
};

struct Chosen {
  std::string cluster_cidr;  // pods
  std::string service_cidr;
  std::string cluster_dns;
  bool operator==(const Chosen&) const = default;
};

// The facts parsed; the error names the fact that does not parse (a range
// never looked at is how the runbook's clash happened).
Result<std::vector<std::pair<IpPrefix, Fact>>> parse_facts(const std::vector<Fact>& facts);

// The first pod range, then the first service range, free of every fact and
// of each other, and the DNS address inside the service range. Fails with
// the pool and what took it when nothing is free.
Result<Chosen> choose(const std::vector<Fact>& facts, const Pool& pool);

// Ranges a catalog fixes, checked against the same facts: each must parse as
// IPv4, pods and services apart, the DNS among the services, and none may
// overlap a fact. The error names the clash: "service-cidr 10.53.0.0/16
// overlaps 10.53.0.0/16 (host Service default/kubernetes ClusterIP 10.53.0.1)".
Status check_fixed(const Chosen& fixed, const std::vector<Fact>& facts);

// The first fact `range` overlaps, or null.
const Fact* first_clash(const IpPrefix& range, const std::vector<std::pair<IpPrefix, Fact>>& facts);

// JSON forms, as plans, events and the feed carry them:
//   fact:   {"range": "10.42.0.0/16", "source": "..."}
//   pool:   {"blocks": [...], "pod_prefix": 16, "service_prefix": 16, "dns_offset": 10}
//   chosen: {"cluster-cidr", "service-cidr", "cluster-dns"} (RKE2's config keys)
nlohmann::json to_json(const std::vector<Fact>& facts);
Result<std::vector<Fact>> facts_from_json(const nlohmann::json& j, const std::string& where);
nlohmann::json to_json(const Pool& pool);
Result<Pool> pool_from_json(const nlohmann::json& j, const std::string& where);
nlohmann::json to_json(const Chosen& c);

}  // namespace factory::ranges
