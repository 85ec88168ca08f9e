// One URL parser for the HTTP client and the agent's wss link. The agent's
// old parser threw on "wss://[::1]:x" (an unchecked std::stoi); this one
// answers with an error line.
#include "common/net/url.hpp"

#include <gtest/gtest.h>

using factory::net::parse_url;

TEST(Url, AgentAndApiUrls) {
  auto w = parse_url("wss://[::1]:8443/v1/agent");
  ASSERT_TRUE(w.ok()) << w.error().message;
  EXPECT_EQ(w->scheme, "wss");
  EXPECT_TRUE(w->tls);
  EXPECT_EQ(w->host, "::1");
  EXPECT_EQ(w->port_number(), 8443);
  EXPECT_EQ(w->target, "/v1/agent");
  EXPECT_TRUE(w->host_is_ip);
  EXPECT_EQ(w->host_header(), "[::1]:8443");
  auto h = parse_url("https://factory.example");
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->port, "443");
  EXPECT_EQ(h->target, "/");
  EXPECT_EQ(h->origin(), "https://factory.example");
  EXPECT_FALSE(h->host_is_ip);
}

TEST(Url, RefusesWithAReason) {
  for (const char* bad : {"wss://[::1]:x/v1/agent", "wss://[::1", "ftp://host/", "host:443",
                          "https://user@host/", "https://:443/", "wss://h:70000/"}) {
    auto r = parse_url(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.error().message.find("URL"), std::string::npos) << r.error().message;
    }
  }
}
