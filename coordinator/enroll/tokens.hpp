#pragma once
// One-time bootstrap tokens, each bound to one tenant, like kubeadm's:
// "<id>.<secret>", id 6 and secret 32 characters of [a-z0-9]. The id names
// the token in listings and logs; the secret is shown once, when issued, and
// only its SHA-256 is kept (the secret's ~165 random bits make a slow hash
// unnecessary). The book lives in one JSON file, mode 0600, rewritten
// atomically on every change. Thread-safe.
#include <chrono>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

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

class TokenBook {
 public:
  // A missing file is an empty book; an unreadable or corrupt one is an error
  // (never silently treated as empty, which would lose revocations).
  static Result<TokenBook> load(const std::filesystem::path& path);

  // A new token for a valid tenant name; persisted before it is returned.
  Result<IssuedToken> issue(const std::string& tenant, std::chrono::seconds ttl,
                            Clock::time_point now = Clock::now());

  // Checks the token (surrounding whitespace ignored) and returns its tenant.
  // The token is recorded as used on disk BEFORE success is returned, so no
  // crash can let it be redeemed twice. Errc::unauthenticated with "token
  // malformed", "unknown token" (also for a wrong secret: no oracle for ids),
  // "token revoked", "token already used at <time>" or "token expired at <time>".
  Result<std::string> redeem(std::string_view token, Clock::time_point now = Clock::now());

  // The checks of redeem() without spending the token: its tenant, or the
  // same refusal. Enrollment asks this before it signs anything, so an
  // unknown token costs the coordinator a hash, not a signature.
  Result<std::string> check(std::string_view token, Clock::time_point now = Clock::now()) const;

  // Revokes every unused token of the tenant not revoked yet; returns how many.
  Result<size_t> revoke_tenant(const std::string& tenant, Clock::time_point now = Clock::now());

  std::vector<TokenRecord> list() const;
  const std::filesystem::path& path() const { return path_; }

 private:
  explicit TokenBook(std::filesystem::path path)
      : path_(std::move(path)), mu_(std::make_unique<std::mutex>()) {}
  Status save(Clock::time_point now);
  // The token's entry if it may be redeemed now, else why not.
  Result<std::vector<TokenRecord>::iterator> find_valid(std::string_view token,
                                                        Clock::time_point now);

  std::filesystem::path path_;
  std::vector<TokenRecord> tokens_;
  // Enrollments (on workers) and the API (token create) use the book at once.
  std::unique_ptr<std::mutex> mu_;
};

}  // namespace factory::enroll
