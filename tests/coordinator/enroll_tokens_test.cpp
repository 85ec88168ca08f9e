// Bootstrap tokens: one use each, bound to a tenant, stored hashed, and the
// book on disk is the truth (a fresh load after every operation sees it).
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "common/atomic_file.hpp"
#include "common/pki.hpp"
#include "coordinator/enroll/tokens.hpp"
#include "tests/support/test_support.hpp"

namespace fs = std::filesystem;
using factory::Clock;
using factory::Errc;
using factory::format_rfc3339;
using factory::enroll::TokenBook;
using factory::testing::TempDir;
using namespace std::chrono_literals;

namespace {

// A fixed, whole-second instant so expected timestamps are exact.
const Clock::time_point t0 = Clock::from_time_t(1'900'000'000);

TokenBook load(const fs::path& p) {
  auto b = TokenBook::load(p);
  EXPECT_TRUE(b.ok()) << (b.ok() ? "" : b.error().message);
  return std::move(b).value();
}

std::string issue(TokenBook& book, const std::string& tenant, std::chrono::seconds ttl = 1h,
                  Clock::time_point now = t0) {
  auto t = book.issue(tenant, ttl, now);
  EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error().message);
  return t->token;
}

void expect_refused(const factory::Result<std::string>& r, const std::string& message) {
  ASSERT_FALSE(r.ok()) << "redeemed as " << *r;
  EXPECT_EQ(r.error().code, Errc::unauthenticated);
  EXPECT_EQ(r.error().message.rfind(message, 0), 0u) << r.error().message;
}

}  // namespace

TEST(EnrollTokens, IssuedTokenHasTheKubeadmShape) {
  TempDir tmp("tok");
  TokenBook book = load(tmp / "tokens.json");
  auto t = book.issue("team-a", 1h, t0);
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(std::regex_match(t->token, std::regex("[a-z0-9]{6}\\.[a-z0-9]{32}"))) << t->token;
  EXPECT_EQ(t->token.substr(0, 6), t->id);
  EXPECT_EQ(t->tenant, "team-a");
  EXPECT_EQ(t->expires_at, t0 + 1h);
  ASSERT_EQ(book.list().size(), 1u);
  EXPECT_EQ(book.list()[0].secret_sha256, factory::pki::sha256_hex(t->token.substr(7)));
  EXPECT_EQ(factory::enroll::token_state(book.list()[0], t0), "active");
  EXPECT_NE(issue(book, "team-a"), t->token);
}

TEST(EnrollTokens, RedeemsOnceThenAlreadyUsed) {
  TempDir tmp("tok");
  TokenBook book = load(tmp / "tokens.json");
  std::string token = issue(book, "team-a");
  auto tenant = book.redeem(token, t0 + 10min);
  ASSERT_TRUE(tenant.ok()) << tenant.error().message;
  EXPECT_EQ(*tenant, "team-a");
  expect_refused(book.redeem(token, t0 + 11min),
                 "token already used at " + format_rfc3339(t0 + 10min));
  EXPECT_EQ(factory::enroll::token_state(book.list()[0], t0 + 11min), "used");
}

TEST(EnrollTokens, UseIsOnDiskBeforeRedeemReturns) {
  // Stands in for a crash right after redeem() returned: a new process that
  // loads the book must see the token as used.
  TempDir tmp("tok");
  TokenBook book = load(tmp / "tokens.json");
  std::string token = issue(book, "team-a");
  ASSERT_TRUE(book.redeem(token, t0 + 1min).ok());
  TokenBook after_crash = load(tmp / "tokens.json");
  expect_refused(after_crash.redeem(token, t0 + 2min),
                 "token already used at " + format_rfc3339(t0 + 1min));
}

TEST(EnrollTokens, ExpiredTokenIsRefused) {
  TempDir tmp("tok");
  TokenBook book = load(tmp / "tokens.json");
  std::string token = issue(book, "team-a", 1h);
  expect_refused(book.redeem(token, t0 + 1h), "token expired at " + format_rfc3339(t0 + 1h));
  EXPECT_EQ(factory::enroll::token_state(book.list()[0], t0 + 1h), "expired");
  // Refusal changes nothing: still expired, not used.
  EXPECT_FALSE(load(tmp / "tokens.json").list()[0].used_at.has_value());
  // One second before expiry it works.
  std::string other = issue(book, "team-a", 1h);
  EXPECT_TRUE(book.redeem(other, t0 + 1h - 1s).ok());
}

TEST(EnrollTokens, UnknownAndWrongSecretLookTheSame) {
  TempDir tmp("tok");
  TokenBook book = load(tmp / "tokens.json");
  std::string token = issue(book, "team-a");
  expect_refused(book.redeem("zzzzzz." + std::string(32, 'a'), t0), "unknown token");
  std::string wrong_secret = token.substr(0, 7) + std::string(32, token[7] == 'a' ? 'b' : 'a');
  expect_refused(book.redeem(wrong_secret, t0), "unknown token");
  // The real one still works after those attempts.
  EXPECT_TRUE(book.redeem(token, t0).ok());
}

TEST(EnrollTokens, MalformedTokensAreRefused) {
  TempDir tmp("tok");
  TokenBook book = load(tmp / "tokens.json");
  std::string token = issue(book, "team-a");
  std::string upper = token;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const std::string& bad :
       {std::string(""), std::string("abc"), token.substr(0, token.size() - 1), token + "x",
        token.substr(0, 6) + ":" + token.substr(7), "." + token.substr(7), token.substr(0, 7),
        token + ".abc", upper, std::string("abcdef.") + std::string(31, 'a') + "_"}) {
    expect_refused(book.redeem(bad, t0), "token malformed");
  }
  // Surrounding whitespace (a token file's newline) is not part of the token.
  auto ok = book.redeem("  " + token + "\n", t0);
  ASSERT_TRUE(ok.ok()) << ok.error().message;
}

TEST(EnrollTokens, RevokeTenantRevokesOnlyItsUnusedTokens) {
  TempDir tmp("tok");
  TokenBook book = load(tmp / "tokens.json");
  std::string a1 = issue(book, "team-a");
  std::string a2 = issue(book, "team-a");
  std::string a_used = issue(book, "team-a");
  std::string b1 = issue(book, "team-b");
  ASSERT_TRUE(book.redeem(a_used, t0).ok());

  auto n = book.revoke_tenant("team-a", t0 + 1min);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 2u);
  EXPECT_EQ(*book.revoke_tenant("team-a", t0 + 1min), 0u);  // nothing left to revoke

  TokenBook reloaded = load(tmp / "tokens.json");
  expect_refused(reloaded.redeem(a1, t0 + 2min), "token revoked");
  expect_refused(reloaded.redeem(a2, t0 + 2min), "token revoked");
  expect_refused(reloaded.redeem(a_used, t0 + 2min), "token already used at");
  auto b = reloaded.redeem(b1, t0 + 2min);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, "team-b");
}

TEST(EnrollTokens, TheFileNeverHoldsTheSecret) {
  TempDir tmp("tok");
  fs::path path = tmp / "tokens.json";
  TokenBook book = load(path);
  std::string t1 = issue(book, "team-a");
  std::string t2 = issue(book, "team-b");
  ASSERT_TRUE(book.redeem(t2, t0).ok());
  ASSERT_TRUE(book.revoke_tenant("team-a", t0).ok());

  // The snapshot and the journal together hold every change.
  std::string text = factory::testing::slurp(path) + factory::testing::slurp(book.journal_path());
  for (const std::string& t : {t1, t2}) {
    std::string secret = t.substr(7);
    EXPECT_EQ(text.find(secret), std::string::npos) << "secret of " << t.substr(0, 6) << " on disk";
    EXPECT_EQ(text.find(secret.substr(0, 12)), std::string::npos);  // not even a piece of it
    EXPECT_NE(text.find(factory::pki::sha256_hex(secret)), std::string::npos);
    EXPECT_NE(text.find(t.substr(0, 6)), std::string::npos);  // the id is not secret
  }
  // And grep, as an admin would check it.
  auto grep = factory::testing::run(
      {"grep", "-c", t1.substr(7), path.string(), book.journal_path().string()});
  EXPECT_EQ(grep.exit_code, 1) << grep.output;
  for (const fs::path& p : {path, book.journal_path()}) {
    struct stat st {};
    ASSERT_EQ(::stat(p.c_str(), &st), 0) << p;
    EXPECT_EQ(st.st_mode & 07777, 0600u) << p;
  }
  // No temp files left beside them.
  EXPECT_EQ(std::distance(fs::directory_iterator(tmp.path()), fs::directory_iterator()), 2);
}

TEST(EnrollTokens, ReloadKeepsEveryField) {
  TempDir tmp("tok");
  fs::path path = tmp / "tokens.json";
  TokenBook book = load(path);
  std::string a = issue(book, "team-a", 2h);
  std::string b = issue(book, "team-b", 1h, t0 + 5min);
  ASSERT_TRUE(book.redeem(a, t0 + 30min).ok());
  ASSERT_TRUE(book.revoke_tenant("team-b", t0 + 31min).ok());

  TokenBook again = load(path);
  // list() is a snapshot (the book is shared between threads): keep it.
  const auto before = book.list(), after = again.list();
  ASSERT_EQ(after.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const auto& x = before[i];
    const auto& y = after[i];
    EXPECT_EQ(x.id, y.id);
    EXPECT_EQ(x.tenant, y.tenant);
    EXPECT_EQ(x.secret_sha256, y.secret_sha256);
    EXPECT_EQ(x.created_at, y.created_at);
    EXPECT_EQ(x.expires_at, y.expires_at);
    EXPECT_EQ(x.used_at, y.used_at);
    EXPECT_EQ(x.revoked, y.revoked);
  }
  EXPECT_EQ(after[0].used_at, t0 + 30min);
  EXPECT_EQ(after[1].created_at, t0 + 5min);
  EXPECT_TRUE(after[1].revoked);
}

TEST(EnrollTokens, MissingFileIsEmptyCorruptFileIsAnError) {
  TempDir tmp("tok");
  EXPECT_TRUE(load(tmp / "absent.json").list().empty());
  EXPECT_FALSE(fs::exists(tmp / "absent.json"));  // loading writes nothing

  std::string good_hash(64, 'a');
  for (const std::string& text :
       {std::string("{not json"), std::string("[]"), std::string("{\"version\":1}"),
        std::string("{\"version\":2,\"tokens\":[]}"),
        std::string("{\"version\":1,\"tokens\":[{\"id\":\"abcdef\"}]}"),
        "{\"version\":1,\"tokens\":[{\"id\":\"ABCDEF\",\"tenant\":\"t\",\"secret_sha256\":\"" +
            good_hash +
            "\",\"created_at\":\"2030-01-01T00:00:00Z\",\"expires_at\":\"2030-01-01T01:00:00Z\"}]}",
        "{\"version\":1,\"tokens\":[{\"id\":\"abcdef\",\"tenant\":\"t\",\"secret_sha256\":\"" +
            good_hash +
            "\",\"created_at\":\"yesterday\",\"expires_at\":\"2030-01-01T01:00:00Z\"}]}"}) {
    ASSERT_TRUE(factory::write_file_atomic(tmp / "bad.json", text, 0600).ok());
    auto b = TokenBook::load(tmp / "bad.json");
    ASSERT_FALSE(b.ok()) << text;
    EXPECT_NE(b.error().message.find("is corrupt"), std::string::npos) << b.error().message;
    EXPECT_NE(b.error().message.find("bad.json"), std::string::npos) << b.error().message;
  }
  // The well-formed version of the last one loads.
  ASSERT_TRUE(
      factory::write_file_atomic(
          tmp / "ok.json",
          "{\"version\":1,\"tokens\":[{\"id\":\"abcdef\",\"tenant\":\"t\",\"secret_sha256\":\"" +
              good_hash +
              "\",\"created_at\":\"2030-01-01T00:00:00Z\",\"expires_at\":\"2030-01-01T01:00:00Z\"}]"
              "}",
          0600)
          .ok());
  EXPECT_EQ(load(tmp / "ok.json").list().size(), 1u);
}

TEST(EnrollTokens, OldTokensArePrunedAfterADay) {
  TempDir tmp("tok");
  TokenBook book = load(tmp / "tokens.json");
  std::string expired = issue(book, "t1", 1h, t0);
  std::string used = issue(book, "t2", 72h, t0);
  ASSERT_TRUE(book.redeem(used, t0 + 1h).ok());
  std::string fresh = issue(book, "t3", 1h, t0 + 24h);  // saves at t0+24h: nothing old enough yet
  EXPECT_EQ(book.list().size(), 3u);
  issue(book, "t4", 1h, t0 + 26h);  // t1 expired 25h ago, t2 used 25h ago
  ASSERT_EQ(book.list().size(), 2u);
  EXPECT_EQ(book.list()[0].tenant, "t3");
  EXPECT_EQ(load(tmp / "tokens.json").list().size(), 2u);
  expect_refused(book.redeem(used, t0 + 26h), "unknown token");
}

TEST(EnrollTokens, RefusesBadTenantAndTtl) {
  TempDir tmp("tok");
  TokenBook book = load(tmp / "tokens.json");
  auto bad = book.issue("Team_A", 1h, t0);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, Errc::invalid_argument);
  EXPECT_FALSE(book.issue("t1", 0s, t0).ok());
  EXPECT_TRUE(book.list().empty());
  EXPECT_FALSE(fs::exists(tmp / "tokens.json"));
}

TEST(EnrollTokens, FailedWritesFailClosed) {
  TempDir tmp("tok");
  fs::path dir = tmp / "state";
  TokenBook book = load(dir / "tokens.json");
  std::string token = issue(book, "team-a");
  // Make every later write fail as on a full disk: no file may grow past
  // the journal's size now (chmod would not stop root, which the tests may
  // run as; the journal is held open, so moving the folder would not either).
  const auto size = fs::file_size(book.journal_path());
  struct rlimit before {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &before), 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit full = before;
  full.rlim_cur = size;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &full), 0);
  struct Restore {
    rlimit limit;
    decltype(old_handler) handler;
    ~Restore() {
      ::setrlimit(RLIMIT_FSIZE, &limit);
      ::signal(SIGXFSZ, handler);
    }
  } restore{before, old_handler};

  auto issued = book.issue("team-a", 1h, t0);
  ASSERT_FALSE(issued.ok());
  EXPECT_EQ(book.list().size(), 1u);  // the unsaved token was never shown and is gone

  auto r = book.redeem(token, t0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::unavailable);
  EXPECT_NE(r.error().message.find("create a new token"), std::string::npos) << r.error().message;
  EXPECT_EQ(r.error().message.find(token.substr(7)), std::string::npos);  // no secret in errors
  // Not recorded on disk, so not honoured again by this process either.
  expect_refused(book.redeem(token, t0), "token already used at");
}

// A fleet's rollout: every change is one journal line; the snapshot is
// rewritten only when the journal has outgrown the book, so N tokens cost
// O(N) writes, not N rewrites of a book of N (the O(N^2) that made 10,000
// tokens take 391 s).
TEST(EnrollTokens, ARolloutAppendsAndRewritesTheBookOnlyAsItDoubles) {
  TempDir tmp("tok");
  fs::path path = tmp / "tokens.json";
  TokenBook book = load(path);
  std::vector<std::string> tokens;
  for (int i = 0; i < 600; ++i) tokens.push_back(issue(book, "r" + std::to_string(i), 1h, t0));
  for (const auto& t : tokens) ASSERT_TRUE(book.redeem(t, t0 + 1min).ok());
  // 1,200 changes: three snapshots (at 256 records, at 512 with 512 tokens,
  // then 512 records later), not 1,200.
  auto snapshot = nlohmann::json::parse(factory::testing::slurp(path));
  EXPECT_EQ(snapshot["generation"], 3);
  EXPECT_LE(factory::testing::slurp(book.journal_path()).size(), 600u * 200);
  TokenBook again = load(path);
  auto all = again.list();
  ASSERT_EQ(all.size(), 600u);
  for (const auto& t : all) EXPECT_EQ(t.used_at, t0 + 1min) << t.id;
  expect_refused(again.redeem(tokens[599], t0 + 2min), "token already used at");
}

// A crash in the middle of an append leaves half a line that was never
// acknowledged: dropped at load, and cut off before the next append.
TEST(EnrollTokens, ATornLastLineIsDroppedAndCutBeforeTheNextAppend) {
  TempDir tmp("tok");
  fs::path path = tmp / "tokens.json";
  std::string a, b;
  {
    TokenBook book = load(path);
    a = issue(book, "team-a");
    b = issue(book, "team-b");
  }
  {
    std::ofstream j(path.string() + ".journal", std::ios::app);
    j << "{\"op\":\"use\",\"id\":\"" << a.substr(0, 6) << "\",\"at";
  }
  TokenBook book = load(path);
  ASSERT_EQ(book.list().size(), 2u);
  EXPECT_FALSE(book.list()[0].used_at);
  ASSERT_TRUE(book.redeem(a, t0).ok());
  std::string c = issue(book, "team-c");
  TokenBook again = load(path);
  ASSERT_EQ(again.list().size(), 3u);
  expect_refused(again.redeem(a, t0), "token already used at");
  EXPECT_TRUE(again.redeem(b, t0).ok());
  EXPECT_TRUE(again.redeem(c, t0).ok());
}

// A damaged line anywhere else is not a torn tail: skipping a "use" or a
// "revoke" would make a token good again, so the load is refused, naming
// the file and the offset.
TEST(EnrollTokens, ADamagedLineInTheJournalRefusesTheLoadNamingFileAndOffset) {
  TempDir tmp("tok");
  fs::path path = tmp / "tokens.json";
  std::string a;
  {
    TokenBook book = load(path);
    a = issue(book, "team-a");
    ASSERT_TRUE(book.redeem(a, t0).ok());
    issue(book, "team-b");
  }
  fs::path journal = path.string() + ".journal";
  std::string text = factory::testing::slurp(journal);
  std::size_t op = text.find("\"op\":\"use\"");
  ASSERT_NE(op, std::string::npos) << text;
  const std::size_t use = text.rfind('\n', op) + 1;  // where its line starts
  text[op + 2] = '#';                                // "o#": a record without an op
  ASSERT_TRUE(factory::write_file_atomic(journal, text, 0600).ok());
  auto b = TokenBook::load(path);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.error().message.find(journal.string() + " is corrupt at byte " + std::to_string(use)),
            std::string::npos)
      << b.error().message;

  // A use of a token the book never issued is damage too.
  std::string header = "{\"journal\":1,\"generation\":0}\n";
  ASSERT_TRUE(factory::write_file_atomic(
                  journal,
                  header + "{\"op\":\"use\",\"id\":\"zzzzzz\",\"at\":\"2030-01-01T00:00:00Z\"}\n",
                  0600)
                  .ok());
  b = TokenBook::load(path);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.error().message.find("unknown token zzzzzz"), std::string::npos) << b.error().message;
}

// A crash between a compaction's new snapshot and its new journal leaves the
// old journal beside a snapshot that already holds it: not replayed (its
// "issue" lines would otherwise read as tokens appearing twice). A journal
// newer than its snapshot cannot come from this code: refused.
TEST(EnrollTokens, AJournalAlreadyFoldedIntoTheSnapshotIsNotReplayed) {
  TempDir tmp("tok");
  fs::path path = tmp / "tokens.json";
  fs::path journal = path.string() + ".journal";
  std::string hash(64, 'a');
  std::string token = "{\"id\":\"abcdef\",\"tenant\":\"t\",\"secret_sha256\":\"" + hash +
                      "\",\"created_at\":\"2030-03-17T17:00:00Z\",\"expires_at\":"
                      "\"2030-03-18T17:00:00Z\"";
  ASSERT_TRUE(factory::write_file_atomic(path,
                                         "{\"version\":1,\"generation\":2,\"tokens\":[" + token +
                                             ",\"used_at\":\"2030-03-17T17:10:00Z\"}]}",
                                         0600)
                  .ok());
  std::string old_journal =
      "{\"journal\":1,\"generation\":1}\n{\"op\":\"issue\",\"token\":" + token + "}}\n";
  ASSERT_TRUE(factory::write_file_atomic(journal, old_journal, 0600).ok());
  TokenBook book = load(path);
  ASSERT_EQ(book.list().size(), 1u);
  EXPECT_TRUE(book.list()[0].used_at.has_value());
  // The next change replaces the folded journal with this generation's.
  issue(book, "team-b");
  EXPECT_EQ(factory::testing::slurp(journal).rfind("{\"generation\":2,\"journal\":1}\n", 0), 0u);
  EXPECT_EQ(load(path).list().size(), 2u);

  ASSERT_TRUE(factory::write_file_atomic(journal, "{\"journal\":1,\"generation\":3}\n", 0600).ok());
  auto b = TokenBook::load(path);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.error().message.find("newer than the book"), std::string::npos) << b.error().message;
}

namespace {

// A disk whose cache flush takes 20 ms (a busy spinning disk, a network
// volume): what makes one sync per change the rollout's limit. The real
// fdatasync still runs after the wait.
int slow_fdatasync(int fd) {
  std::this_thread::sleep_for(20ms);
  return ::fdatasync(fd);
}

// A disk that fails its flushes while `failing` is set (EIO, as a dying
// disk or a thin volume out of space does).
std::atomic<bool> failing{false};
int flaky_fdatasync(int fd) {
  if (failing.load()) {
    std::this_thread::sleep_for(5ms);
    errno = EIO;
    return -1;
  }
  return ::fdatasync(fd);
}

TokenBook load_with(const fs::path& p, factory::GroupCommitLog::SyncFn sync) {
  auto b = TokenBook::load(p, sync);
  EXPECT_TRUE(b.ok()) << (b.ok() ? "" : b.error().message);
  return std::move(b).value();
}

}  // namespace

// Enrollments redeem their tokens at once (the coordinator's workers): the
// changes made while one sync runs share the next, instead of one fdatasync
// each under the book's lock. Each redeem still returns only once its use is
// on disk: after the last one returns, a fresh load finds every token used.
TEST(EnrollTokens, ChangesMadeAtOnceShareTheirSyncs) {
  TempDir tmp("tok");
  fs::path path = tmp / "tokens.json";
  TokenBook book = load_with(path, &slow_fdatasync);
  constexpr int kThreads = 8, kEach = 6;
  std::vector<std::string> tokens;
  for (int i = 0; i < kThreads * kEach; ++i)
    tokens.push_back(issue(book, "r" + std::to_string(i), 1h, t0));
  const auto before = book.journal_syncs();
  EXPECT_EQ(before, static_cast<std::uint64_t>(kThreads * kEach));  // one after the other: one each

  std::atomic<int> redeemed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i)
        if (book.redeem(tokens[t * kEach + i], t0 + 1min).ok()) ++redeemed;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(redeemed.load(), kThreads * kEach);
  const auto syncs = book.journal_syncs() - before;
  // 48 changes from 8 threads: about one sync per round of the 8, not 48.
  EXPECT_LE(syncs, static_cast<std::uint64_t>(kThreads * kEach / 3)) << syncs << " syncs";
  EXPECT_GE(syncs, static_cast<std::uint64_t>(kEach));

  TokenBook again = load(path);
  auto all = again.list();
  ASSERT_EQ(all.size(), tokens.size());
  for (const auto& t : all) EXPECT_EQ(t.used_at, t0 + 1min) << t.id;
}

// A sync that fails fails every change written since the last good one,
// whichever thread waits for it: issues are taken back (never shown), uses
// stay refused in this process (fail closed), and the journal is cut back
// to what was durable before the next change, which succeeds once the disk
// does. The book loads after it.
TEST(EnrollTokens, AFailedSyncFailsEveryChangeItCoveredAndTheJournalRecovers) {
  TempDir tmp("tok");
  fs::path path = tmp / "tokens.json";
  TokenBook book = load_with(path, &flaky_fdatasync);
  std::vector<std::string> tokens;
  for (int i = 0; i < 4; ++i) tokens.push_back(issue(book, "r" + std::to_string(i), 1h, t0));
  const std::string good = factory::testing::slurp(book.journal_path());

  failing = true;
  std::vector<factory::Result<std::string>> answers(4, std::string());
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] { answers[i] = book.redeem(tokens[i], t0 + 1min); });
  for (auto& th : threads) th.join();
  auto issued = book.issue("late", 1h, t0);
  failing = false;

  for (auto& a : answers) {
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.error().code, Errc::unavailable);
    EXPECT_NE(a.error().message.find("fdatasync"), std::string::npos) << a.error().message;
  }
  ASSERT_FALSE(issued.ok());
  EXPECT_EQ(book.list().size(), 4u);  // the token whose issue failed is gone
  for (const auto& t : tokens) expect_refused(book.redeem(t, t0 + 2min), "token already used at");

  // The next change reopens the journal, cut back to the last good sync.
  std::string fresh = issue(book, "after", 1h, t0);
  ASSERT_TRUE(book.redeem(fresh, t0 + 3min).ok());
  // What was durable, then the two changes since: nothing of the failed ones.
  const std::string journal = factory::testing::slurp(book.journal_path());
  ASSERT_EQ(journal.rfind(good, 0), 0u);
  const std::string added = journal.substr(good.size());
  EXPECT_EQ(std::count(added.begin(), added.end(), '\n'), 2) << added;
  EXPECT_NE(added.find("\"after\""), std::string::npos) << added;
  TokenBook again = load(path);
  EXPECT_EQ(again.list().size(), 5u);
  expect_refused(again.redeem(fresh, t0 + 4min), "token already used at");
}
