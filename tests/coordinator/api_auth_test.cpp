// Who may call what on the admin API: the admin token everything, a
// read-only token and a dashboard session only GET of the routes marked
// read_only, a session only from the coordinator's own origin.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "common/atomic_file.hpp"
#include "common/worker_pool.hpp"
#include "coordinator/api/auth.hpp"
#include "coordinator/api/router.hpp"
#include "tests/support/test_support.hpp"

using namespace factory;
using namespace factory::coordinator;

namespace {

const std::string kAdmin(48, 'a');

net::HttpRequestIn request(const std::string& method, const std::string& path,
                           std::map<std::string, std::string> headers = {}) {
  net::HttpRequestIn r;
  r.method = method;
  r.path = r.target = path;
  r.headers = std::move(headers);
  return r;
}

}  // namespace

TEST(ApiAuth, ReadOnlyTokensAreStoredHashedAndSurviveARestart) {
  factory::testing::TempDir dir("api-auth");
  const auto path = (dir.path() / "api-tokens.json").string();
  ApiAuth a(kAdmin);
  ASSERT_TRUE(a.load(path).ok());
  auto t = a.create_read_only_token();
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(t->token.rfind("factory-ro-", 0), 0u);
  EXPECT_EQ(a.bearer(t->token), Access::read_only);
  EXPECT_EQ(a.bearer(kAdmin), Access::admin);
  EXPECT_EQ(a.bearer("factory-ro-wrong"), Access::none);
  EXPECT_EQ(a.bearer(""), Access::none);
  const std::string file = factory::testing::slurp(path);
  EXPECT_EQ(file.find(t->token), std::string::npos) << "only the hash is kept";
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ApiAuth b(kAdmin);
  ASSERT_TRUE(b.load(path).ok());
  EXPECT_EQ(b.bearer(t->token), Access::read_only);
  ASSERT_EQ(b.read_only_tokens().size(), 1u);
  EXPECT_EQ(b.read_only_tokens()[0].id, t->id);
  ASSERT_TRUE(write_file_atomic(path, "not json", 0600).ok());
  EXPECT_FALSE(ApiAuth(kAdmin).load(path).ok()) << "a damaged file stops the start, saying so";
}

TEST(ApiAuth, SessionsComeFromAValidTokenAndEnd) {
  ApiAuth a(kAdmin);
  EXPECT_FALSE(a.sign_in("nope"));
  auto s = a.sign_in(kAdmin);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->opened_with, Access::admin);
  EXPECT_EQ(a.session(s->cookie_value), Access::read_only) << "a cookie never grants more";
  EXPECT_EQ(a.session("forged"), Access::none);
  const std::string set = session_set_cookie(*s);
  for (const char* attr : {"HttpOnly", "Secure", "SameSite=Strict", "Path=/"})
    EXPECT_NE(set.find(attr), std::string::npos) << set;
  auto req = request("GET", "/", {{"cookie", "x=1; factory_session=" + s->cookie_value + "; y=2"}});
  EXPECT_EQ(session_cookie(req), s->cookie_value);
  a.sign_out(s->cookie_value);
  EXPECT_EQ(a.session(s->cookie_value), Access::none);
}

TEST(ApiAuth, SameOriginIsThisHostOrNoBrowserClaim) {
  EXPECT_TRUE(same_origin(request("GET", "/", {{"host", "127.0.0.1:8444"}})));
  EXPECT_TRUE(same_origin(
      request("GET", "/", {{"host", "127.0.0.1:8444"}, {"origin", "https://127.0.0.1:8444"}})));
  EXPECT_FALSE(same_origin(
      request("GET", "/", {{"host", "127.0.0.1:8444"}, {"origin", "https://evil.example"}})));
  EXPECT_FALSE(same_origin(
      request("GET", "/", {{"host", "127.0.0.1:8444"}, {"origin", "http://127.0.0.1:8444"}})));
  EXPECT_FALSE(same_origin(request("GET", "/", {{"sec-fetch-site", "cross-site"}})));
}

TEST(ApiRouterAccess, ReadOnlyTokensAndSessionsReadTheFeedAndNothingElse) {
  WorkerPool workers(1);
  ApiRouter r(kAdmin, workers);
  auto ok = [](auto&, auto&) { return json_response({{"ok", true}}); };
  r.add("GET", "/v1/tenants", ok, {.read_only = true});
  r.add("POST", "/v1/tenants", ok);
  r.add("GET", "/v1/tokens", ok);
  auto ro = r.auth().create_read_only_token();
  ASSERT_TRUE(ro.ok());
  auto s = r.auth().sign_in(ro->token);
  ASSERT_TRUE(s);
  net::PeerInfo peer;
  auto call = [&](const std::string& m, const std::string& p,
                  std::map<std::string, std::string> h) {
    return r.handle_now(request(m, p, h), peer).status;
  };
  const auto bearer = [](const std::string& t) {
    return std::map<std::string, std::string>{{"authorization", "Bearer " + t}};
  };
  EXPECT_EQ(call("GET", "/v1/tenants", bearer(kAdmin)), 200);
  EXPECT_EQ(call("POST", "/v1/tenants", bearer(kAdmin)), 200);
  EXPECT_EQ(call("GET", "/v1/tenants", bearer(ro->token)), 200);
  EXPECT_EQ(call("POST", "/v1/tenants", bearer(ro->token)), 403);
  EXPECT_EQ(call("GET", "/v1/tokens", bearer(ro->token)), 403) << "not a route of the feed";
  EXPECT_EQ(call("GET", "/v1/tenants", bearer("wrong")), 401);
  EXPECT_EQ(call("GET", "/v1/tenants", {}), 401);
  const std::map<std::string, std::string> cookie = {
      {"cookie", "factory_session=" + s->cookie_value}, {"host", "h:1"}};
  EXPECT_EQ(call("GET", "/v1/tenants", cookie), 200);
  EXPECT_EQ(call("POST", "/v1/tenants", cookie), 403);
  auto cross = cookie;
  cross["origin"] = "https://evil.example";
  EXPECT_EQ(call("GET", "/v1/tenants", cross), 403);
  auto admin_cookie = r.auth().sign_in(kAdmin);
  ASSERT_TRUE(admin_cookie);
  EXPECT_EQ(call("GET", "/v1/tokens",
                 {{"cookie", "factory_session=" + admin_cookie->cookie_value}, {"host", "h:1"}}),
            403)
      << "a session opened with the admin token still only reads the feed";
  // A wrong bearer is not rescued by a cookie beside it.
  auto both = cookie;
  both["authorization"] = "Bearer wrong";
  EXPECT_EQ(call("GET", "/v1/tenants", both), 401);
}
