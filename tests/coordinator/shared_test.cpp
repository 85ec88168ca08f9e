// What coordinator replicas share when their store is PostgreSQL
// (coordinator/shared, issue 26), on a real server
// (tests/support/postgres_server.hpp). Two replicas are two instances of
// the module's objects on one database, in one process: each with its own
// connections and state directory, as two `factory serve` would have; the
// integration test (tests/integration/replicas_test.cpp) runs two real ones.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <latch>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "common/atomic_file.hpp"
#include "common/pki.hpp"
#include "coordinator/api/auth.hpp"
#include "coordinator/enroll/ca.hpp"
#include "coordinator/enroll/tokens.hpp"
#include "coordinator/shared/database.hpp"
#include "coordinator/shared/replica.hpp"
#include "coordinator/shared/secrets.hpp"
#include "coordinator/shared/token_book.hpp"
#include "tests/support/postgres_server.hpp"
#include "tests/support/test_support.hpp"

namespace factory::shared {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using factory::testing::PostgresServer;
using factory::testing::TempDir;

unsigned mode_of(const fs::path& p) {
  struct stat st {};
  EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
  return st.st_mode & 07777;
}

std::string file(const fs::path& p) {
  auto t = read_file(p);
  return t ? *t : "";
}

class SharedStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    conninfo_ = PostgresServer::instance().create_database();
    sink_ = std::make_shared<spdlog::sinks::ostream_sink_mt>(logs_);
    spdlog::default_logger()->sinks().push_back(sink_);
  }
  // Nothing secret that a test met is in any line logged meanwhile.
  void TearDown() override {
    auto& sinks = spdlog::default_logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
    const std::string logged = logs_.str();
    for (const std::string& s : secrets_)
      EXPECT_EQ(logged.find(s), std::string::npos) << "a secret was logged:\n" << logged;
  }
  std::string sql(const std::string& query) {
    return PostgresServer::instance().sql(conninfo_.substr(conninfo_.rfind('=') + 1), query);
  }
  std::shared_ptr<const Database> db(const std::string& extra = "") {
    auto d = Database::open(conninfo_ + extra);
    EXPECT_TRUE(d.ok()) << (d ? "" : d.error().message);
    return d ? std::move(*d) : nullptr;
  }
  std::unique_ptr<Replica> replica(const fs::path& dir) {
    auto r = Replica::open(conninfo_, dir, dir / "admin.token");
    EXPECT_TRUE(r.ok()) << (r ? "" : r.error().message);
    if (!r) return nullptr;
    secrets_.push_back(*(*r)->admin_token());
    return std::move(*r);
  }
  // A CA's key, as it would appear in a line: its PEM body.
  void keep_secret_pem(const std::string& pem) {
    auto begin = pem.find('\n');
    if (begin != std::string::npos) secrets_.push_back(pem.substr(begin + 1, 40));
  }

  std::string conninfo_;
  std::ostringstream logs_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
  std::vector<std::string> secrets_;
};

// --- shared secrets -----------------------------------------------------------

TEST_F(SharedStateTest, GetOrCreateRacedOnTwoReplicasKeepsTheFirstWritersValue) {
  auto a = db(), b = db();
  ASSERT_TRUE(a && b);
  SharedSecrets on_a(a), on_b(b);
  constexpr int kThreads = 16;
  std::latch go(kThreads);
  std::vector<std::string> got(kThreads);
  std::atomic<int> made{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] {
      go.arrive_and_wait();
      auto v = (i % 2 ? on_a : on_b).get_or_create("x", [&]() -> Result<std::string> {
        ++made;
        return "value-" + std::to_string(i);
      });
      got[i] = v ? *v : "error: " + v.error().message;
    });
  for (auto& t : threads) t.join();
  EXPECT_GE(made.load(), 1);
  for (const auto& v : got) EXPECT_EQ(v, got[0]);
  EXPECT_EQ(got[0].rfind("value-", 0), 0u) << got[0];
  EXPECT_EQ(sql("SELECT value FROM shared_secrets WHERE name = 'x'"), got[0]);
  // Once kept, make() is not asked again.
  auto again = on_a.get_or_create(
      "x", []() -> Result<std::string> { return Error(Errc::internal, "must not be called"); });
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(*again, got[0]);
  // make()'s refusal is the caller's, with the secret's name.
  auto refused = on_b.get_or_create(
      "y", []() -> Result<std::string> { return Error(Errc::io, "disk on fire"); });
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().message, "making shared secret y: disk on fire");
}

TEST_F(SharedStateTest, ReplicasStartingTogetherShareOneCaOneEndpointCaAndOneAdminToken) {
  constexpr int kReplicas = 6;
  std::vector<std::unique_ptr<TempDir>> dirs;
  for (int i = 0; i < kReplicas; ++i) dirs.push_back(std::make_unique<TempDir>("replica"));
  std::vector<std::unique_ptr<Replica>> opened(kReplicas);
  std::vector<std::string> errors(kReplicas);
  std::latch go(kReplicas);
  std::vector<std::thread> threads;
  for (int i = 0; i < kReplicas; ++i)
    threads.emplace_back([&, i] {
      const fs::path dir = dirs[i]->path() / "state";
      go.arrive_and_wait();
      auto r = Replica::open(conninfo_, dir, dir / "admin.token");
      if (r)
        opened[i] = std::move(*r);
      else
        errors[i] = r.error().message;
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < kReplicas; ++i) ASSERT_TRUE(opened[i]) << errors[i];
  const auto& first = opened[0];
  const std::string ca = first->ca()->sha256(), endpoint = first->endpoint_ca()->sha256();
  const std::string admin = *first->admin_token();
  secrets_.push_back(admin);
  EXPECT_NE(ca, endpoint);
  EXPECT_GE(admin.size(), 32u);
  for (int i = 0; i < kReplicas; ++i) {
    const auto& r = opened[i];
    EXPECT_EQ(r->ca()->sha256(), ca);
    EXPECT_EQ(r->endpoint_ca()->sha256(), endpoint);
    EXPECT_EQ(*r->admin_token(), admin);
    // The copies for the CLI beside each replica, and never a key.
    const fs::path dir = dirs[i]->path() / "state";
    EXPECT_EQ(file(dir / "admin.token"), admin + "\n");
    EXPECT_EQ(mode_of(dir / "admin.token"), 0600u);
    EXPECT_EQ(*pki::certificate_sha256(file(dir / "ca.crt")), ca);
    EXPECT_EQ(*pki::certificate_sha256(file(dir / "endpoint-ca.crt")), endpoint);
    EXPECT_FALSE(fs::exists(dir / "ca.key"));
    EXPECT_FALSE(fs::exists(dir / "endpoint-ca.key"));
  }
  EXPECT_EQ(sql("SELECT string_agg(name, ',' ORDER BY name) FROM shared_secrets"),
            "admin_token,agents_ca,endpoint_ca");
  // A replica that starts later gets the same, and signs what the others trust.
  TempDir later;
  auto r = replica(later / "state");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->ca()->sha256(), ca);
  auto cert = r->ca()->issue_server_certificate({"127.0.0.1"}, 1h);
  ASSERT_TRUE(cert.ok()) << cert.error().message;
  EXPECT_NE(cert->certificate_pem.find(first->ca()->certificate_pem()), std::string::npos);
}

TEST_F(SharedStateTest, TheFirstReplicaBringsASingleHostsCaAndAdminToken) {
  TempDir old;
  const fs::path dir = old / "state";
  auto ca = enroll::CertificateAuthority::load_or_create(dir);
  ASSERT_TRUE(ca.ok()) << ca.error().message;
  keep_secret_pem(file(dir / "ca.key"));
  const std::string admin = "an-admin-token-of-a-single-host-0123456789";
  secrets_.push_back(admin);
  ASSERT_TRUE(write_file_atomic(dir / "admin.token", admin + "\n", 0600).ok());
  auto first = replica(dir);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->ca()->sha256(), ca->sha256());
  EXPECT_EQ(*first->admin_token(), admin);
  // Its files are left as they were: the key matches the shared CA.
  EXPECT_TRUE(fs::exists(dir / "ca.key"));
  TempDir fresh;
  auto second = replica(fresh / "state");
  ASSERT_TRUE(second);
  EXPECT_EQ(second->ca()->sha256(), ca->sha256());
  EXPECT_EQ(*second->admin_token(), admin);
}

TEST_F(SharedStateTest, AStateDirHoldingAnotherCasKeyIsRefusedAndLeftAlone) {
  TempDir a_dir, b_dir;
  auto a = replica(a_dir / "state");
  ASSERT_TRUE(a);
  const fs::path dir = b_dir / "state";
  auto own = enroll::CertificateAuthority::load_or_create(dir);
  ASSERT_TRUE(own.ok());
  keep_secret_pem(file(dir / "ca.key"));
  const std::string cert_before = file(dir / "ca.crt");
  auto b = Replica::open(conninfo_, dir, dir / "admin.token");
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.error().code, Errc::failed_precondition);
  EXPECT_NE(b.error().message.find((dir / "ca.key").string() + " is the key of another CA"),
            std::string::npos)
      << b.error().message;
  EXPECT_NE(b.error().message.find("move ca.crt and ca.key out of state_dir"), std::string::npos)
      << b.error().message;
  EXPECT_EQ(file(dir / "ca.crt"), cert_before);
}

TEST_F(SharedStateTest, ASharedCaThatIsNotOneIsRefusedWithWhereItIs) {
  auto d = db();
  ASSERT_TRUE(d);
  sql("INSERT INTO shared_secrets VALUES ('agents_ca', '{\"certificate_pem\": 1}', 'now')");
  TempDir dir;
  auto r = Replica::open(conninfo_, dir / "state", dir / "state" / "admin.token");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::failed_precondition);
  EXPECT_NE(r.error().message.find("(shared_secrets 'agents_ca') is not a certificate and key"),
            std::string::npos)
      << r.error().message;
}

// --- bootstrap tokens ---------------------------------------------------------

TEST_F(SharedStateTest, OneTokenRedeemedBy32ThreadsOnTwoReplicasSucceedsExactlyOnce) {
  SharedTokenBook a(db()), b(db());
  auto issued = a.issue("t1", 1h);
  ASSERT_TRUE(issued.ok()) << issued.error().message;
  secrets_.push_back(issued->token.substr(7));
  constexpr int kThreads = 32;
  std::latch go(kThreads);
  std::vector<Result<std::string>> got(kThreads, Result<std::string>(Error()));
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] {
      go.arrive_and_wait();
      got[i] = (i % 2 ? a : b).redeem(issued->token);
    });
  for (auto& t : threads) t.join();
  int wins = 0;
  for (auto& r : got) {
    if (r.ok()) {
      ++wins;
      EXPECT_EQ(*r, "t1");
      continue;
    }
    EXPECT_EQ(r.error().code, Errc::unauthenticated);
    EXPECT_EQ(r.error().message.rfind("token already used at ", 0), 0u) << r.error().message;
  }
  EXPECT_EQ(wins, 1);
  // Only the secret's hash is stored.
  const std::string rows = sql("SELECT row_to_json(t) FROM bootstrap_tokens t");
  EXPECT_EQ(rows.find(issued->token.substr(7)), std::string::npos) << rows;
  EXPECT_NE(rows.find(pki::sha256_hex(issued->token.substr(7))), std::string::npos) << rows;
}

TEST_F(SharedStateTest, ARevocationThroughOneReplicaIsSeenByTheOther) {
  SharedTokenBook a(db()), b(db());
  auto t1 = a.issue("t1", 1h), t2 = a.issue("t1", 1h), other = a.issue("t2", 1h);
  ASSERT_TRUE(t1 && t2 && other);
  ASSERT_TRUE(b.redeem(t2->token).ok());
  auto n = b.revoke_tenant("t1");
  ASSERT_TRUE(n.ok()) << n.error().message;
  EXPECT_EQ(*n, 1u);  // the used one is not revoked
  for (enroll::Tokens* book :
       {static_cast<enroll::Tokens*>(&a), static_cast<enroll::Tokens*>(&b)}) {
    auto c = book->check(t1->token);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.error().message, "token revoked");
    auto r = book->redeem(t1->token);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().message, "token revoked");
  }
  EXPECT_EQ(*a.check(other->token), "t2");
  EXPECT_EQ(*a.revoke_tenant("t1"), 0u);
}

// The same story told to the file book and to the shared one reads the same,
// refusal for refusal (token ids, which are random, named by their part).
std::vector<std::string> story(enroll::Tokens& book) {
  const Clock::time_point t0 = Clock::time_point(std::chrono::seconds(1'800'000'000));
  std::vector<std::string> said;
  std::map<std::string, std::string> names;
  auto say = [&](const auto& r) {
    std::string s;
    if constexpr (std::is_same_v<std::decay_t<decltype(r)>, Result<std::string>>)
      s = r ? "ok " + *r : std::string(errc_name(r.error().code)) + " " + r.error().message;
    else
      s = r ? "ok " + std::to_string(*r)
            : std::string(errc_name(r.error().code)) + " " + r.error().message;
    for (const auto& [id, name] : names)
      for (auto at = s.find(id); at != std::string::npos; at = s.find(id))
        s.replace(at, id.size(), name);
    said.push_back(s);
  };
  auto issue = [&](const std::string& name, const std::string& tenant, std::chrono::seconds ttl,
                   Clock::time_point now) {
    auto t = book.issue(tenant, ttl, now);
    if (!t) {
      said.push_back("issue: " + t.error().message);
      return std::string();
    }
    names[t->id] = "<" + name + ">";
    said.push_back("issued " + name + " for " + t->tenant + " until " +
                   format_rfc3339(t->expires_at));
    return t->token;
  };
  const std::string a = issue("a", "t1", 10min, t0), b = issue("b", "t1", 1h, t0 + 500ms),
                    c = issue("c", "t2", 1h, t0);
  issue("bad", "Not_A_Name", 1h, t0);
  issue("never", "t1", 0s, t0);
  say(book.check(a, t0 + 10min));
  say(book.redeem(a, t0 + 10min));
  say(book.check(a, t0 + 9min));
  say(book.check("garbage"));
  say(book.check("abcdef." + std::string(32, 'x'), t0));
  say(book.check(b.substr(0, 7) + std::string(32, 'x'), t0));  // a wrong secret
  say(book.check("  " + b + "\n", t0));
  say(book.redeem(b, t0 + 1min + 700ms));
  say(book.redeem(b, t0 + 2min));
  say(book.check(b, t0 + 2min));
  say(book.revoke_tenant("t2", t0 + 2min));
  say(book.check(c, t0 + 2min));
  say(book.redeem(c, t0 + 2min));
  say(book.revoke_tenant("t2", t0 + 2min));
  // Each token's state, in the order of their names (ids are random).
  auto states = [&](Clock::time_point now) {
    auto all = book.records();
    if (!all) return std::string("records: ") + all.error().message;
    std::vector<std::string> lines;
    for (const auto& t : *all)
      lines.push_back(names[t.id] + " " + t.tenant + " " + enroll::token_state(t, now) + " " +
                      format_rfc3339(t.created_at));
    std::sort(lines.begin(), lines.end());
    std::string out;
    for (const auto& l : lines) out += l + "; ";
    return out;
  };
  said.push_back(states(t0 + 2min));
  // A day past their use and expiry, the next change forgets them.
  issue("d", "t3", 1h, t0 + 26h);
  said.push_back(states(t0 + 26h));
  return said;
}

TEST_F(SharedStateTest, TheSharedBookAnswersAsTheFileBookWordForWord) {
  TempDir tmp;
  auto file_book = enroll::TokenBook::load(tmp / "tokens.json");
  ASSERT_TRUE(file_book.ok());
  SharedTokenBook shared_book(db());
  const auto expected = story(*file_book);
  const auto got = story(shared_book);
  EXPECT_EQ(got, expected);
  // The story is the one meant (a few of its lines, spelled out).
  ASSERT_EQ(expected.size(), 22u);
  for (const auto& line : expected) std::cout << line << "\n";
  EXPECT_EQ(expected[5], "unauthenticated token expired at 2027-01-15T08:10:00Z");
  EXPECT_EQ(expected[10], "unauthenticated unknown token '<b>'");
  EXPECT_EQ(expected[12], "ok t1");
  EXPECT_EQ(expected[13], "unauthenticated token already used at 2027-01-15T08:01:00Z");
  EXPECT_EQ(expected.back(), "<d> t3 active 2027-01-16T10:00:00Z; ");
}

// --- read-only API tokens -----------------------------------------------------

TEST_F(SharedStateTest, AReadOnlyTokenCreatedThroughOneReplicaIsGoodOnTheOtherWithinFiveSeconds) {
  TempDir a_dir, b_dir;
  auto a = replica(a_dir / "state"), b = replica(b_dir / "state");
  ASSERT_TRUE(a && b);
  coordinator::ApiAuth on_a(*a->admin_token()), on_b(*b->admin_token());
  ASSERT_TRUE(a->share_api_tokens(on_a).ok());
  ASSERT_TRUE(b->share_api_tokens(on_b).ok());
  auto t = on_a.create_read_only_token();
  ASSERT_TRUE(t.ok()) << t.error().message;
  secrets_.push_back(t->token);
  const auto created = std::chrono::steady_clock::now();
  EXPECT_EQ(on_a.bearer(t->token), coordinator::Access::read_only);  // at once where it was made
  while (on_b.bearer(t->token) != coordinator::Access::read_only &&
         std::chrono::steady_clock::now() - created < 6s)
    std::this_thread::sleep_for(50ms);
  const auto took = std::chrono::steady_clock::now() - created;
  EXPECT_EQ(on_b.bearer(t->token), coordinator::Access::read_only);
  EXPECT_LT(took, 5s);
  ASSERT_EQ(on_b.read_only_tokens().size(), 1u);
  EXPECT_EQ(on_b.read_only_tokens()[0].id, t->id);
  // Kept hashed.
  const std::string rows = sql("SELECT row_to_json(t) FROM api_tokens t");
  EXPECT_EQ(rows.find(t->token), std::string::npos) << rows;
  EXPECT_NE(rows.find(pki::sha256_hex(t->token)), std::string::npos) << rows;
  // Deleted from the database (how an operator revokes one), it is refused
  // by every replica as soon.
  sql("DELETE FROM api_tokens");
  const auto deleted = std::chrono::steady_clock::now();
  while ((on_a.bearer(t->token) != coordinator::Access::none ||
          on_b.bearer(t->token) != coordinator::Access::none) &&
         std::chrono::steady_clock::now() - deleted < 6s)
    std::this_thread::sleep_for(50ms);
  EXPECT_EQ(on_a.bearer(t->token), coordinator::Access::none);
  EXPECT_EQ(on_b.bearer(t->token), coordinator::Access::none);
  EXPECT_LT(std::chrono::steady_clock::now() - deleted, 5s);
}

// --- nothing secret in what is said -------------------------------------------

TEST_F(SharedStateTest, ThePasswordIsInNoErrorAndNoLogLine) {
  secrets_.push_back("hunter2");
  const std::string port = std::to_string(factory::testing::free_loopback_port());
  TempDir dir;
  for (const std::string& conninfo :
       {"host=127.0.0.1 port=" + port + " dbname=f user=u password=hunter2-secret",
        "postgresql://u:hunter2-secret@127.0.0.1:" + port + "/f"}) {
    auto r = Replica::open(conninfo, dir / "state", dir / "state" / "admin.token");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, Errc::unavailable) << r.error().message;
    EXPECT_NE(r.error().message.find("127.0.0.1"), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find("dbname=f"), std::string::npos) << r.error().message;
    EXPECT_EQ(r.error().message.find("hunter2"), std::string::npos) << r.error().message;
  }
  auto bad = Replica::open("host=127.0.0.1 password=hunter2-secret nonsense", dir / "state",
                           dir / "state" / "admin.token");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, Errc::invalid_argument);
  EXPECT_EQ(bad.error().message.find("hunter2"), std::string::npos) << bad.error().message;
  // A statement that fails on a database that answers (the test server
  // trusts loopback: the password is carried, not needed).
  auto d = db(" password=hunter2-secret");
  ASSERT_TRUE(d);
  SharedTokenBook book(d);
  auto issued = book.issue("t1", 1h);
  ASSERT_TRUE(issued.ok()) << issued.error().message;
  secrets_.push_back(issued->token.substr(7));
  sql("DROP TABLE bootstrap_tokens");
  auto checked = book.check(issued->token);
  ASSERT_FALSE(checked.ok());
  EXPECT_NE(checked.error().message.find("token_get"), std::string::npos)
      << checked.error().message;
  EXPECT_EQ(checked.error().message.find("hunter2"), std::string::npos) << checked.error().message;
  auto redeemed = book.redeem(issued->token);
  ASSERT_FALSE(redeemed.ok());
  EXPECT_EQ(redeemed.error().code, Errc::unavailable);
  EXPECT_EQ(
      redeemed.error().message.rfind("could not record token '" + issued->id + "' as used (", 0),
      0u)
      << redeemed.error().message;
  EXPECT_EQ(redeemed.error().message.find("hunter2"), std::string::npos);
  EXPECT_EQ(redeemed.error().message.find(issued->token.substr(7)), std::string::npos);
}

// A connection the server dropped (a restart, a failover) is made again for
// the next statement: the caller sees no error.
TEST_F(SharedStateTest, AConnectionTheServerDroppedIsMadeAgain) {
  SharedTokenBook book(db());
  auto t = book.issue("t1", 1h);
  ASSERT_TRUE(t.ok());
  EXPECT_NE(sql("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"),
            "0");
  auto r = book.redeem(t->token);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(*r, "t1");
}

}  // namespace
}  // namespace factory::shared
