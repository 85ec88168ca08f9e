#pragma once
// What the guest's own networks use, for its cluster's ranges to avoid
// (contract/cluster_ranges.hpp): the routes the kernel holds (an address's
// subnet is among them, as the kernel adds one per address), the DNS servers
// DHCP gave it (the host cluster's DNS under KubeVirt), and KubeVirt's
// masquerade network, which the guest sits on whether or not it shows.
#include <string>
#include <vector>

#include "agent/guest/env.hpp"
#include "contract/cluster_ranges.hpp"

namespace factory::agent {

// KubeVirt's masquerade binding puts every guest on 10.0.2.0/24 (gateway
// 10.0.2.1, the guest 10.0.2.2), inside the pod.
inline constexpr const char* kKubeVirtMasqueradeNet = "10.0.2.0/24";

// /proc/net/route (IPv4, little-endian hex): every route but the default,
// "10.0.2.0/24" with its interface. Lines that do not parse are left out.
struct GuestRoute {
  std::string range;
  std::string iface;
};
std::vector<GuestRoute> parse_proc_net_route(const std::string& text);
// /proc/net/ipv6_route: the same for IPv6, link-local, multicast and the
// default left out.
std::vector<GuestRoute> parse_proc_net_ipv6_route(const std::string& text);

// Routes of <root>/proc/net/{route,ipv6_route}, the DNS servers
// (guest_dns_servers) and the masquerade network, each named by its source.
std::vector<ranges::Fact> guest_network_facts(const GuestEnv& env);

}  // namespace factory::agent
