#pragma once
// The bootstrap tokens of replicas that share a database: enroll::Tokens
// with the file book's answers and refusals, word for word, and what two
// replicas could race decided by the database. A token is redeemed by one
// UPDATE that only an unused, unrevoked, unexpired row with the token's
// secret matches, so of any number of replicas redeeming one token exactly
// one succeeds; the others read "token already used at <time>". Only the
// secrets' SHA-256 are stored, as in the file book. Thread-safe; every call
// waits on the database (call it from a worker, as the file book's).
#include <atomic>
#include <memory>

#include "coordinator/enroll/tokens.hpp"
#include "coordinator/shared/database.hpp"

namespace factory::shared {

class SharedTokenBook final : public enroll::Tokens {
 public:
  explicit SharedTokenBook(std::shared_ptr<const Database> db) : db_(std::move(db)) {}

  Result<enroll::IssuedToken> issue(const std::string& tenant, std::chrono::seconds ttl,
                                    Clock::time_point now = Clock::now()) override;
  Result<std::string> redeem(std::string_view token, Clock::time_point now = Clock::now()) override;
  Result<std::string> check(std::string_view token,
                            Clock::time_point now = Clock::now()) const override;
  Result<size_t> revoke_tenant(const std::string& tenant,
                               Clock::time_point now = Clock::now()) override;
  Result<std::vector<enroll::TokenRecord>> records() const override;

 private:
  // The token's row, when there is one.
  Result<std::optional<enroll::TokenRecord>> find(const std::string& id) const;
  // Drops tokens past their retention, at most once a minute (as the file
  // book): a failure is left for the next pass.
  void prune(Clock::time_point now);

  std::shared_ptr<const Database> db_;
  std::atomic<std::int64_t> last_prune_{0};  // unix seconds
};

}  // namespace factory::shared
