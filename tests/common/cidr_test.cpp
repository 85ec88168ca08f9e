#include "common/cidr.hpp"

#include <gtest/gtest.h>

using factory::Ipv4Cidr;

TEST(Cidr, ParsesAndNormalises) {
  auto c = Ipv4Cidr::parse("10.43.7.9/16");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->str(), "10.43.0.0/16");
  EXPECT_EQ(Ipv4Cidr::format_address(c->host(10)), "10.43.0.10");
}

TEST(Cidr, DetectsTheRunbookDnsClash) {
  // RKE2's default service range in the guest equals the host cluster's.
  auto host = *Ipv4Cidr::parse("10.43.0.0/16");
  auto guest_default = *Ipv4Cidr::parse("10.43.0.0/16");
  auto guest_fixed = *Ipv4Cidr::parse("10.53.0.0/16");
  EXPECT_TRUE(host.overlaps(guest_default));
  EXPECT_FALSE(host.overlaps(guest_fixed));
  EXPECT_TRUE(host.contains(*Ipv4Cidr::parse_address("10.43.0.10")));
}

TEST(Cidr, RejectsGarbage) {
  EXPECT_FALSE(Ipv4Cidr::parse("10.43.0.0").ok());
  EXPECT_FALSE(Ipv4Cidr::parse("10.43.0.0/33").ok());
  EXPECT_FALSE(Ipv4Cidr::parse("300.1.1.1/8").ok());
  EXPECT_FALSE(Ipv4Cidr::parse("1.2.3/8").ok());
  EXPECT_FALSE(Ipv4Cidr::parse("1.2.3.4/8x").ok());
}
