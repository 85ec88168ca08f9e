// The guest's own networks as the rke2 step avoids them (agent/guest/network.hpp):
// the kernel's route tables as /proc prints them, DHCP's DNS servers, and
// KubeVirt's masquerade network.
#include <gtest/gtest.h>

#include "agent/guest/network.hpp"
#include "common/atomic_file.hpp"
#include "tests/support/test_support.hpp"

using namespace factory::agent;
using factory::ranges::Fact;

namespace {

// A KubeVirt masquerade guest's table (10.0.2.2/24 behind 10.0.2.1) with a
// second NIC on a routed LAN, as `cat /proc/net/route` prints it.
const char* kRoute =
    "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT       \n"
    "enp1s0\t00000000\t0102000A\t0003\t0\t0\t100\t00000000\t0\t0\t0                            \n"
    "enp1s0\t0002000A\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0                            \n"
    "enp1s0\t0102000A\t00000000\t0005\t0\t0\t100\tFFFFFFFF\t0\t0\t0                            \n"
    "enp2s0\t0000340A\t0107340A\t0003\t0\t0\t0\t0000FFFF\t0\t0\t0                              \n"
    "cni0\t0000340A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0                                \n"
    "bad\tnothex!!\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0                                 \n"
    "holes\t0000000A\t00000000\t0001\t0\t0\t0\t00FF00FF\t0\t0\t0                               \n";

// `cat /proc/net/ipv6_route` on a dual-stack guest: its /64, link-local,
// multicast, loopback and the default route.
const char* kIpv6Route =
    "fd0010000002000000000000000000000 40 00000000000000000000000000000000 00 "
    "00000000000000000000000000000000 00000100 00000001 00000000 00000001   enp1s0\n"
    "fd001000000200000000000000000000 40 00000000000000000000000000000000 00 "
    "00000000000000000000000000000000 00000100 00000001 00000000 00000001   enp1s0\n"
    "fe800000000000000000000000000000 40 00000000000000000000000000000000 00 "
    "00000000000000000000000000000000 00000100 00000001 00000000 00000001   enp1s0\n"
    "00000000000000000000000000000001 80 00000000000000000000000000000000 00 "
    "00000000000000000000000000000000 00000000 00000003 00000000 80200001       lo\n"
    "ff000000000000000000000000000000 08 00000000000000000000000000000000 00 "
    "00000000000000000000000000000000 00000100 00000004 00000000 00000001   enp1s0\n"
    "00000000000000000000000000000000 00 00000000000000000000000000000000 00 "
    "fd001000000200000000000000000001 00000400 00000001 00000000 00000003   enp1s0\n";

}  // namespace

TEST(GuestNetwork, ReadsTheKernelsIpv4TableLeavingOutTheDefaultRoute) {
  auto routes = parse_proc_net_route(kRoute);
  std::vector<std::string> got;
  for (const auto& r : routes) got.push_back(r.iface + " " + r.range);
  EXPECT_EQ(got, (std::vector<std::string>{"enp1s0 10.0.2.0/24", "enp1s0 10.0.2.1/32",
                                           "enp2s0 10.52.0.0/16", "cni0 10.52.0.0/24"}));
}

TEST(GuestNetwork, ReadsTheIpv6TableLeavingOutLinkLocalMulticastLoopbackAndDefault) {
  auto routes = parse_proc_net_ipv6_route(kIpv6Route);
  ASSERT_EQ(routes.size(), 1u);  // the first line's address has 33 digits: not read
  EXPECT_EQ(routes[0].range, "fd00:1000:2::/64");
  EXPECT_EQ(routes[0].iface, "enp1s0");
}

TEST(GuestNetwork, FactsNameEachSource) {
  factory::testing::TempDir root("guest-network");
  std::filesystem::create_directories(root / "proc" / "net");
  std::filesystem::create_directories(root / "run" / "systemd" / "resolve");
  ASSERT_TRUE(factory::write_file_atomic(root / "proc/net/route", kRoute, 0644));
  ASSERT_TRUE(factory::write_file_atomic(root / "run/systemd/resolve/resolv.conf",
                                         "nameserver 10.43.0.10\nnameserver fd00:10:43::a\n",
                                         0644));
  GuestEnv env;
  env.root = root.path();
  auto facts = guest_network_facts(env);
  auto has = [&](const Fact& f) { return std::find(facts.begin(), facts.end(), f) != facts.end(); };
  EXPECT_TRUE(has({"10.0.2.0/24", "guest route on enp1s0"}));
  EXPECT_TRUE(has({"10.52.0.0/16", "guest route on enp2s0"}));
  EXPECT_TRUE(has({"10.43.0.10", "guest DNS server (resolv.conf, from DHCP)"}));
  EXPECT_TRUE(has({"fd00:10:43::a", "guest DNS server (resolv.conf, from DHCP)"}));
  EXPECT_TRUE(has({"10.0.2.0/24", "KubeVirt masquerade network"}));
}

TEST(GuestNetwork, AGuestWithNoTablesStillAvoidsTheMasqueradeNetwork) {
  factory::testing::TempDir root("guest-network-bare");
  GuestEnv env;
  env.root = root.path();
  auto facts = guest_network_facts(env);
  ASSERT_FALSE(facts.empty());
  EXPECT_EQ(facts.back(), (Fact{"10.0.2.0/24", "KubeVirt masquerade network"}));
}
