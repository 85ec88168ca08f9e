#pragma once
// One-time bootstrap tokens, each bound to one tenant, like kubeadm's:
// "<id>.<secret>", id 6 and secret 32 characters of [a-z0-9]. The id names
// the token in listings and logs; the secret is shown once, when issued, and
// only its SHA-256 is kept (the secret's ~165 random bits make a slow hash
// unnecessary). Thread-safe.
//
// On disk (mode 0600): a snapshot, `tokens.json`, and a journal beside it,
// `tokens.json.journal`, one JSON line per change (issue, use, revoke),
// fdatasync'd before the change is acknowledged. The snapshot is rewritten
// only when the journal has grown past the live tokens (or something was
// pruned), so a fleet's rollout writes in proportion to its size, not its
// square. Both carry a generation: a journal whose generation is not the
// snapshot's was folded into it by a compaction a crash interrupted, and is
// not replayed. A torn last line (a crash mid-append, never acknowledged) is
// dropped; any other damage refuses the load, as for the snapshot: a lost
// "use" or "revoke" would make a token good again.
#include <chrono>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/atomic_file.hpp"
#include "common/durations.hpp"
#include "common/error.hpp"

namespace factory::enroll {

inline constexpr size_t kTokenIdLength = 6;
inline constexpr size_t kTokenSecretLength = 32;
// Used, expired and revoked tokens stay this long (so a late retry reads
// "already used" rather than "unknown"), then are dropped on the next save.
inline constexpr std::chrono::hours kTokenRetention{24};

struct TokenRecord {
  std::string id;
  std::string tenant;
  std::string secret_sha256;  // lower-case hex
  Clock::time_point created_at;
  Clock::time_point expires_at;
  std::optional<Clock::time_point> used_at;
  bool revoked = false;
};

// "active", "used", "expired" or "revoked", for listings.
std::string token_state(const TokenRecord& t, Clock::time_point now = Clock::now());

struct IssuedToken {
  std::string token;  // "<id>.<secret>": the only time the secret exists outside the agent
  std::string id;
  std::string tenant;
  Clock::time_point expires_at;
};

// The rules both books below follow, written once so that their refusals
// read the same. A token's id and the SHA-256 of its secret, or "token
// malformed (...)" (surrounding whitespace is ignored).
struct TokenParts {
  std::string id;
  std::string secret_sha256;
};
Result<TokenParts> parse_token(std::string_view token);
// Whether the token `presented` may be redeemed now, judged against the book's
// entry for its id (`known`: null when the book has none): "unknown token"
// (also for a wrong secret, compared in constant time: no oracle for ids),
// "token revoked", "token already used at <time>", "token expired at <time>";
// all Errc::unauthenticated.
Status judge_token(const TokenRecord* known, const TokenParts& presented, Clock::time_point now);
// A new token for `tenant` (checked) valid for `ttl` from `now` (whole
// seconds): its entry, and the token itself ("<id>.<secret>") to show once.
struct NewToken {
  TokenRecord record;
  std::string token;
};
Result<NewToken> make_token(const std::string& tenant, std::chrono::seconds ttl,
                            Clock::time_point now);
// The refusal of a redeem whose use could not be recorded (fail closed).
Error use_not_recorded(const std::string& id, const Error& why);

// What enrollment, the admin API and tenant logic ask of the one-time
// tokens, whichever book keeps them: TokenBook (below: files in state_dir,
// one coordinator) or the replicas' shared database (coordinator/shared,
// when the store is PostgreSQL). Both give the same answers and the same
// refusals, word for word; TokenBook's comments say what each call means.
// Every call may wait on a disk or a database: call it from a worker.
class Tokens {
 public:
  virtual ~Tokens() = default;
  virtual Result<IssuedToken> issue(const std::string& tenant, std::chrono::seconds ttl,
                                    Clock::time_point now = Clock::now()) = 0;
  virtual Result<std::string> redeem(std::string_view token,
                                     Clock::time_point now = Clock::now()) = 0;
  virtual Result<std::string> check(std::string_view token,
                                    Clock::time_point now = Clock::now()) const = 0;
  virtual Result<size_t> revoke_tenant(const std::string& tenant,
                                       Clock::time_point now = Clock::now()) = 0;
  // Every token the book holds, oldest first (a database may fail to answer).
  virtual Result<std::vector<TokenRecord>> records() const = 0;
};

class TokenBook final : public Tokens {
 public:
  // A missing file is an empty book; an unreadable or corrupt one is an error
  // (never silently treated as empty, which would lose revocations).
  // `sync`: how the journal is flushed (::fdatasync; a test's slower disk).
  static Result<TokenBook> load(const std::filesystem::path& path,
                                GroupCommitLog::SyncFn sync = nullptr);

  // A new token for a valid tenant name; persisted before it is returned.
  Result<IssuedToken> issue(const std::string& tenant, std::chrono::seconds ttl,
                            Clock::time_point now = Clock::now()) override;

  // Checks the token (surrounding whitespace ignored) and returns its tenant.
  // The token is recorded as used on disk BEFORE success is returned, so no
  // crash can let it be redeemed twice. Errc::unauthenticated with "token
  // malformed", "unknown token" (also for a wrong secret: no oracle for ids),
  // "token revoked", "token already used at <time>" or "token expired at <time>".
  Result<std::string> redeem(std::string_view token, Clock::time_point now = Clock::now()) override;

  // The checks of redeem() without spending the token: its tenant, or the
  // same refusal. Enrollment asks this before it signs anything, so an
  // unknown token costs the coordinator a hash, not a signature.
  Result<std::string> check(std::string_view token,
                            Clock::time_point now = Clock::now()) const override;

  // Revokes every unused token of the tenant not revoked yet; returns how many.
  Result<size_t> revoke_tenant(const std::string& tenant,
                               Clock::time_point now = Clock::now()) override;

  // Every token the book holds, oldest first.
  std::vector<TokenRecord> list() const;
  Result<std::vector<TokenRecord>> records() const override { return list(); }
  const std::filesystem::path& path() const { return path_; }
  // fdatasync calls made on the journal: changes made at once share one.
  std::uint64_t journal_syncs() const { return journal_->syncs(); }
  std::filesystem::path journal_path() const { return path_.string() + ".journal"; }

 private:
  TokenBook(std::filesystem::path path, GroupCommitLog::SyncFn sync)
      : path_(std::move(path)),
        journal_(std::make_unique<GroupCommitLog>(sync)),
        mu_(std::make_unique<std::mutex>()) {}
  // Writes one change to the journal (opening or starting it first), then
  // compacts when the journal has outgrown the book. Under mu_. The change
  // is durable once durable() returns for the mark, which is called
  // without mu_: changes made meanwhile by other threads share its sync.
  Result<GroupCommitLog::Mark> record(const std::string& line);
  Status durable(GroupCommitLog::Mark m) { return journal_->wait_durable(m); }
  // The journal's file is given up after a failed write or sync: cut back,
  // when it is opened again, to what is known durable.
  void drop_journal();
  Status open_journal();
  // The snapshot file: these tokens at that generation, written atomically.
  Status write_snapshot(const std::vector<TokenRecord>& tokens, std::uint64_t generation);
  // Rewrites the snapshot as the book is now, then starts an empty journal.
  Status compact();
  // Drops tokens past their retention; compacts when any went.
  void prune(Clock::time_point now);
  // The token's entry if it may be redeemed now, else why not.
  Result<TokenRecord*> find_valid(std::string_view token, Clock::time_point now);

  std::filesystem::path path_;
  std::unordered_map<std::string, TokenRecord> tokens_;  // by id
  std::uint64_t generation_ = 0;
  std::unique_ptr<GroupCommitLog> journal_;
  std::uint64_t journal_lines_ = 0;       // records in the current journal
  std::uint64_t journal_good_bytes_ = 0;  // before a torn tail found at load
  bool journal_current_ = false;          // the file on disk is this generation's
  std::uint64_t compact_after_ = 0;       // journal records that trigger a compaction
  Clock::time_point last_prune_{};
  // Enrollments (on workers) and the API (token create) use the book at once.
  std::unique_ptr<std::mutex> mu_;
};

}  // namespace factory::enroll
