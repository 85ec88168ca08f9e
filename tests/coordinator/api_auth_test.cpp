// Who may call what on the admin API: the admin token everything, a
// read-only token and a dashboard session only GET of the routes marked
// read_only, a session only from the coordinator's own origin.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "common/atomic_file.hpp"
#include "common/net/url.hpp"
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

// Issue 23, point 5: 1,030 sign-ins with one read-only token evicted the
// admin's dashboard session. Sessions are accounted per token: a token's
// own oldest makes room for its next, the admin's are never anyone else's
// to evict, and read-only tokens together are capped (then refused).
TEST(ApiAuth, ReadOnlySignInsNeverEvictTheAdminsSessionAndAreCappedPerToken) {
  ApiAuth a(kAdmin);
  auto admin = a.sign_in(kAdmin);
  ASSERT_TRUE(admin);
  auto ro = a.create_read_only_token();
  ASSERT_TRUE(ro.ok());
  auto first = a.sign_in(ro->token);
  ASSERT_TRUE(first);
  std::string last;
  for (int i = 0; i < 1030; ++i) {
    auto s = a.sign_in(ro->token);
    ASSERT_TRUE(s) << i << ": " << s.error().message;
    last = s->cookie_value;
  }
  EXPECT_EQ(a.session(admin->cookie_value), Access::read_only) << "the admin's session stays";
  EXPECT_EQ(a.session(last), Access::read_only);
  EXPECT_EQ(a.session(first->cookie_value), Access::none) << "its own oldest made room";
  EXPECT_EQ(a.session_count(), 1 + ApiAuth::kMaxSessionsPerToken);
  EXPECT_EQ(a.identify(request("GET", "/", {{"cookie", "factory_session=" + last}})).principal,
            "read-only:" + ro->id);

  // Enough read-only tokens to fill their share: the next is refused, and
  // the admin still signs in.
  const std::size_t tokens = ApiAuth::kMaxReadOnlySessions / ApiAuth::kMaxSessionsPerToken;
  for (std::size_t t = 1; t < tokens; ++t) {
    auto more = a.create_read_only_token();
    ASSERT_TRUE(more.ok());
    for (std::size_t i = 0; i < ApiAuth::kMaxSessionsPerToken; ++i)
      ASSERT_TRUE(a.sign_in(more->token)) << t << "/" << i;
  }
  auto extra = a.create_read_only_token();
  ASSERT_TRUE(extra.ok());
  auto refused = a.sign_in(extra->token);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, factory::Errc::unavailable);
  EXPECT_TRUE(a.sign_in(kAdmin));
  EXPECT_EQ(a.session(admin->cookie_value), Access::read_only);
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

// Issue 23, point 8: RFC 9110 makes the auth scheme case-insensitive; a
// script's `authorization: bearer <token>` is the admin's as much as
// curl's `Bearer`.
TEST(ApiRouterAccess, TheBearerSchemeIsCaseInsensitiveAndNothingElseLooksLikeIt) {
  WorkerPool workers(1);
  ApiRouter r(kAdmin, workers);
  r.add("GET", "/v1/tokens", [](auto&, auto&) { return json_response({{"ok", true}}); });
  auto call = [&](const std::string& authorization) {
    return r.handle_now(request("GET", "/v1/tokens", {{"authorization", authorization}}), {})
        .status;
  };
  EXPECT_EQ(call("Bearer " + kAdmin), 200);
  EXPECT_EQ(call("bearer " + kAdmin), 200);
  EXPECT_EQ(call("BEARER  " + kAdmin + " "), 200);
  EXPECT_EQ(call("Bearer" + kAdmin), 401) << "no space after the scheme";
  EXPECT_EQ(call("Basic " + kAdmin), 401);
  EXPECT_EQ(call("Bearer " + kAdmin + " extra"), 401) << "a token68 has no space inside";
  EXPECT_EQ(net::bearer_token("bEaReR abc"), "abc");
  EXPECT_FALSE(net::bearer_token("Bearer "));
}

// Issue 23, point 4: `factory tenant retry 't5/credentials/rotate?'` rotated
// t5's key, because the server decoded %2F before routing. Routes match the
// target's segments, each decoded after the split: an encoded '/' or '?'
// stays inside the one name it was sent in.
TEST(ApiRouterRouting, AnEncodedSlashOrQuestionMarkStaysInsideOneName) {
  WorkerPool workers(1);
  ApiRouter r(kAdmin, workers);
  auto answer = [](const std::string& route) {
    return [route](const net::HttpRequestIn&, const PathParams& p) {
      return json_response({{"route", route}, {"name", p.at("name")}});
    };
  };
  r.add("GET", "/v1/tenants/{name}", answer("show"));
  r.add("GET", "/v1/tenants/{name}/credentials", answer("credentials"));
  r.add("POST", "/v1/tenants/{name}/credentials/rotate", answer("rotate"));
  r.add("POST", "/v1/tenants/{name}/retry", answer("retry"));
  auto call = [&](const std::string& method, const std::string& target) {
    net::HttpRequestIn req = request(method, target, {{"authorization", "Bearer " + kAdmin}});
    // What the server's decoding of the whole path makes of it (the old
    // router's input), which must not matter.
    req.path = net::percent_decode(target.substr(0, target.find('?')));
    auto out = r.handle_now(req, {});
    auto j = nlohmann::json::parse(out.body, nullptr, false);
    return std::pair{out.status, j};
  };
  auto [st1, show] = call("GET", "/v1/tenants/t5%2Fcredentials");
  EXPECT_EQ(st1, 200);
  EXPECT_EQ(show["route"], "show");
  EXPECT_EQ(show["name"], "t5/credentials") << "one name, which the tenant service refuses";

  auto [st2, retry] = call("POST", "/v1/tenants/t5%2Fcredentials%2Frotate%3F/retry");
  EXPECT_EQ(st2, 200);
  EXPECT_EQ(retry["route"], "retry") << "never the rotate route";
  EXPECT_EQ(retry["name"], "t5/credentials/rotate?");

  EXPECT_EQ(call("GET", "/v1/tenants/t5/credentials?x=1").second["route"], "credentials");
  EXPECT_EQ(call("GET", "/v1/tenants/a%20b").second["name"], "a b");
  EXPECT_EQ(decoded_segments("/v1//tenants/%2F%3F%25?q=%2F"),
            (std::vector<std::string>{"v1", "tenants", "/?%"}));
}
