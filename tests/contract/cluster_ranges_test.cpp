// The guest cluster's ranges picked around the host's and the guest's own
// (contract/cluster_ranges.hpp), over the host range sets the issue names.
#include "contract/cluster_ranges.hpp"

#include <gtest/gtest.h>

using namespace factory::ranges;

namespace {

struct Case {
  const char* name;
  std::vector<Fact> facts;
  Chosen want;
};

// What the coordinator and agent see on each kind of host (and guest).
const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"rke2_k3s_defaults",  // the runbook's host: it still gets the runbook's ranges
       {{"10.42.0.0/24", "host node utho spec.podCIDRs"},
        {"10.43.0.1", "host Service default/kubernetes ClusterIP"},
        {"10.43.0.10", "host Service kube-system/rke2-coredns-rke2-coredns ClusterIP"},
        {"10.43.0.10", "guest resolv.conf nameserver"},
        {"10.0.2.0/24", "KubeVirt masquerade network"}},
       {"10.52.0.0/16", "10.53.0.0/16", "10.53.0.10"}},
      {"kubeadm_defaults",
       {{"10.244.0.0/24", "host node cp-1 spec.podCIDRs"},
        {"10.244.1.0/24", "host node worker-1 spec.podCIDRs"},
        {"10.96.0.0/12", "host ServiceCIDR kubernetes"},
        {"10.96.0.1", "host Service default/kubernetes ClusterIP"},
        {"10.96.0.10", "host Service kube-system/kube-dns ClusterIP"}},
       {"10.52.0.0/16", "10.53.0.0/16", "10.53.0.10"}},
      {"calico_192_168",
       {{"192.168.0.0/16", "guest_ranges.avoid in the coordinator config (Calico IPPool)"},
        {"10.96.0.1", "host Service default/kubernetes ClusterIP"}},
       {"10.52.0.0/16", "10.53.0.0/16", "10.53.0.10"}},
      {"host_on_10_52_and_10_53",  // the acceptance's host: the guest moves on
       {{"10.52.0.0/24", "host node utho spec.podCIDRs"},
        {"10.53.0.1", "host Service default/kubernetes ClusterIP"},
        {"10.53.0.10", "host Service kube-system/kube-dns ClusterIP"},
        {"10.52.0.0/16", "guest_ranges.avoid in the coordinator config"},
        {"10.53.0.0/16", "guest_ranges.avoid in the coordinator config"}},
       {"10.54.0.0/16", "10.55.0.0/16", "10.55.0.10"}},
      {"guest_network_overlaps_a_candidate",
       {{"10.42.0.0/24", "host node utho spec.podCIDRs"},
        {"10.43.0.10", "guest resolv.conf nameserver"},
        {"10.52.7.20/24", "guest address on enp2s0"},
        {"10.53.0.0/16", "guest route via 10.52.7.1"}},
       {"10.54.0.0/16", "10.55.0.0/16", "10.55.0.10"}},
      {"dual_stack_host",  // IPv6 facts are read, and cannot clash with IPv4 ranges
       {{"10.42.0.0/24", "host node utho spec.podCIDRs"},
        {"fd00:10:42::/64", "host node utho spec.podCIDRs"},
        {"fd00:10:43::a", "guest resolv.conf nameserver"}},
       {"10.52.0.0/16", "10.53.0.0/16", "10.53.0.10"}},
      {"host_takes_all_of_10_52_to_10_55",
       {{"10.52.0.0/14", "host ServiceCIDR big"}},
       {"10.56.0.0/16", "10.57.0.0/16", "10.57.0.10"}},
  };
  return c;
}

}  // namespace

TEST(ClusterRanges, PicksAroundEachHostRangeSet) {
  for (const auto& c : cases()) {
    SCOPED_TRACE(c.name);
    auto got = choose(c.facts, Pool{});
    ASSERT_TRUE(got.ok()) << got.error().message;
    EXPECT_EQ(*got, c.want);
    // What was picked is exactly what check_fixed accepts on the same facts.
    EXPECT_TRUE(check_fixed(*got, c.facts).ok());
  }
}

TEST(ClusterRanges, FixedRangesAreRefusedWithTheClashNamed) {
  std::vector<Fact> host = {{"10.52.0.0/24", "host node utho spec.podCIDRs"},
                            {"10.53.0.10", "host Service kube-system/kube-dns ClusterIP"}};
  auto s = check_fixed({"10.52.0.0/16", "10.53.0.0/16", "10.53.0.10"}, host);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().message,
            "cluster-cidr 10.52.0.0/16 overlaps 10.52.0.0/24 (host node utho spec.podCIDRs): the "
            "guest's DNS or routes would clash; fix the catalog's ranges or leave them out so "
            "they are chosen");
  s = check_fixed({"10.60.0.0/16", "10.53.0.0/16", "10.53.0.10"}, host);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("service-cidr 10.53.0.0/16 overlaps 10.53.0.10 (host Service "
                                   "kube-system/kube-dns ClusterIP)"),
            std::string::npos)
      << s.error().message;
  EXPECT_TRUE(check_fixed({"10.60.0.0/16", "10.61.0.0/16", "10.61.0.10"}, host).ok());
}

TEST(ClusterRanges, FixedRangesMustHoldTogether) {
  auto msg = [](Chosen c) {
    auto s = check_fixed(c, {});
    return s.ok() ? std::string("ok") : s.error().message;
  };
  EXPECT_EQ(msg({"10.52.0.0/16", "10.52.128.0/17", "10.52.128.10"}),
            "cluster-cidr 10.52.0.0/16 overlaps service-cidr 10.52.128.0/17");
  EXPECT_EQ(msg({"10.52.0.0/16", "10.53.0.0/16", "10.54.0.10"}),
            "cluster-dns 10.54.0.10 is outside service-cidr 10.53.0.0/16");
  EXPECT_EQ(msg({"fd00:52::/56", "10.53.0.0/16", "10.53.0.10"}),
            "cluster-cidr fd00:52::/56 is IPv6: the guest cluster is IPv4 only (RKE2 "
            "single-stack); give an IPv4 range");
  EXPECT_EQ(msg({"10.52.0.0/16", "10.53.0.0/16", "fd00::a"}),
            "cluster-dns fd00::a is IPv6: the guest cluster is IPv4 only");
}

TEST(ClusterRanges, IPv6PoolsAndUnreadableFactsAreRefusedNotIgnored) {
  Pool v6;
  v6.blocks = {"fd00:52::/48"};
  auto r = choose({}, v6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message,
            "pool.blocks[0]: fd00:52::/48 is IPv6: the guest cluster is IPv4 only (RKE2 "
            "single-stack)");
  r = choose({{"10.42.0.0/33", "host node utho spec.podCIDRs"}}, Pool{});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message,
            "cannot read host node utho spec.podCIDRs: invalid prefix length in '10.42.0.0/33' (0 "
            "to 32)");
}

TEST(ClusterRanges, AFullPoolSaysWhatTookIt) {
  Pool small;
  small.blocks = {"10.52.0.0/15"};
  auto r = choose({{"10.52.0.0/16", "host a"}, {"10.53.0.0/16", "host b"}}, small);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message,
            "no free /16 for the guest's pods in pool 10.52.0.0/15: taken by 10.52.0.0/16 (host "
            "a), 10.53.0.0/16 (host b); add a block to the pool (guest_ranges.pool)");
  r = choose({{"10.52.0.0/16", "host a"}}, small);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message,
            "no free /16 for the guest's services in pool 10.52.0.0/15: taken by 10.52.0.0/16 "
            "(host a), 10.53.0.0/16 (the guest's own pod range); add a block to the pool "
            "(guest_ranges.pool)");
}

TEST(ClusterRanges, PrefixesParseBothFamilies) {
  auto p = IpPrefix::parse("10.43.7.9/16");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->str(), "10.43.0.0/16");
  EXPECT_EQ(IpPrefix::parse("10.43.0.10")->str(), "10.43.0.10/32");
  EXPECT_EQ(IpPrefix::parse("fd00:10:96::a/112")->str(), "fd00:10:96::/112");
  EXPECT_EQ(IpPrefix::parse("fe80::1")->str(), "fe80::1/128");
  EXPECT_TRUE(IpPrefix::parse("10.0.0.0/8")->overlaps(*IpPrefix::parse("10.53.0.10")));
  EXPECT_FALSE(IpPrefix::parse("10.0.0.0/8")->overlaps(*IpPrefix::parse("::ffff:10.0.0.1")));
  EXPECT_TRUE(IpPrefix::parse("fd00::/8")->overlaps(*IpPrefix::parse("fd12::1")));
  EXPECT_FALSE(IpPrefix::parse("fd00::/16")->overlaps(*IpPrefix::parse("fd01::1")));
  EXPECT_FALSE(IpPrefix::parse("10.0.0.0/").ok());
  EXPECT_FALSE(IpPrefix::parse("fd00::/129").ok());
  EXPECT_FALSE(IpPrefix::parse("fd00:::1").ok());
  EXPECT_FALSE(IpPrefix::parse("10.0.0").ok());
}

TEST(ClusterRanges, JsonFormsRoundTripAndRefuseGarbage) {
  std::vector<Fact> f = {{"10.42.0.0/24", "host node utho spec.podCIDRs"}};
  EXPECT_EQ(*facts_from_json(to_json(f), "avoid"), f);
  Pool p;
  p.pod_prefix = 17;
  auto back = pool_from_json(to_json(p), "pool");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->pod_prefix, 17);
  EXPECT_EQ(back->blocks, Pool::default_blocks());
  EXPECT_EQ(
      facts_from_json(nlohmann::json::parse(R"([{"range":"10.1.0.0/33","source":"x"}])"), "avoid")
          .error()
          .message,
      "avoid[0].range: invalid prefix length in '10.1.0.0/33' (0 to 32)");
  EXPECT_EQ(facts_from_json(nlohmann::json::parse(R"([{"range":"10.1.0.0/16"}])"), "avoid")
                .error()
                .message,
            "avoid[0].source: must say where the range was seen");
  EXPECT_EQ(pool_from_json(nlohmann::json::parse(R"({"size":16})"), "pool").error().message,
            "pool.size: unknown key (blocks, pod_prefix, service_prefix, dns_offset)");
  EXPECT_EQ(
      pool_from_json(nlohmann::json::parse(R"({"dns_offset":70000})"), "pool").error().message,
      "pool.dns_offset: 70000 is not an address inside a /16");
}
