#pragma once
// The guest's DNS servers: the ones it got from DHCP, which on a gpu-k8s
// guest belong to the host cluster (its DNS service), so the guest cluster's
// ranges must stay clear of them.
#include <string>
#include <vector>

#include "agent/guest/env.hpp"

namespace factory::agent {

// `nameserver` addresses in resolv.conf text, loopback ones (systemd-resolved's
// 127.0.0.53 stub) left out.
std::vector<std::string> parse_resolv_conf(const std::string& text);
// "Current DNS Server:" and "DNS Servers:" addresses in `resolvectl status`.
std::vector<std::string> parse_resolvectl_status(const std::string& text);
// The DNS servers the guest got from DHCP: systemd-resolved's upstream list
// (<root>/run/systemd/resolve/resolv.conf), else <root>/etc/resolv.conf, else
// `resolvectl status`. Duplicates removed, order kept.
std::vector<std::string> guest_dns_servers(const GuestEnv& env);

}  // namespace factory::agent
