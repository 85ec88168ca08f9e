#pragma once
// What a coordinator replica takes from the database it shares with the
// others (the store's, `store: postgres://…`), in place of what state_dir
// holds on a single host (issue 26): the agents' CA (every replica signs
// agents' certificates and serves the same chain), the model endpoints' CA,
// the admin token, the bootstrap tokens and the read-only API tokens. With
// the SQLite store none of this is used: state_dir holds them as before.
//
// The first replica to start on an empty database makes each secret (or
// brings what its state_dir holds: a single host moving to PostgreSQL keeps
// its CA, its admin token, and every enrolled agent), and every later one,
// or one racing it, reads that one back (SharedSecrets). state_dir then
// holds copies for the CLI beside the replica: ca.crt and endpoint-ca.crt
// (0644) and the admin token (0600), never a key; a CA key of another CA
// there is refused, not overwritten, as a CA pair that does not match is.
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "coordinator/api/auth.hpp"
#include "coordinator/enroll/ca.hpp"
#include "coordinator/enroll/tokens.hpp"
#include "coordinator/shared/database.hpp"

namespace factory::shared {

// The names of the shared secrets (shared_secrets.name).
inline constexpr const char* kAgentsCaSecret = "agents_ca";
inline constexpr const char* kEndpointCaSecret = "endpoint_ca";
inline constexpr const char* kAdminTokenSecret = "admin_token";
// How often a replica reads the read-only API tokens again: a token created
// through one replica is good on every other within this (and a query).
inline constexpr std::chrono::milliseconds kApiTokenRefresh{2000};

// Whether the config's `store:` names PostgreSQL: replicas on it share.
bool shares_state(const std::string& store);

class Replica {
 public:
  // Connects to the database (conninfo: the config's `store:`), takes or
  // makes every shared secret, and writes the copies of state_dir (made
  // 0700 if missing); admin_token_file is where the CLI reads the admin
  // token (state_dir/admin.token).
  static Result<std::unique_ptr<Replica>> open(const std::string& conninfo,
                                               const std::filesystem::path& state_dir,
                                               const std::filesystem::path& admin_token_file);
  // Stops the refresh of the API tokens (share_api_tokens).
  ~Replica();
  Replica(const Replica&) = delete;
  Replica& operator=(const Replica&) = delete;

  // As CertificateAuthority::load_or_create and the admin token's file
  // answer them on a single host.
  Result<enroll::CertificateAuthority> ca() const { return *ca_; }
  Result<enroll::CertificateAuthority> endpoint_ca() const { return *endpoint_ca_; }
  Result<std::string> admin_token() const { return admin_; }
  // The bootstrap tokens, in the database.
  std::unique_ptr<enroll::Tokens> token_book() const;
  // `auth` reads its read-only tokens from the database now, adds new ones
  // there, and reads them again every `every` on a thread of this replica's
  // (never an io thread: a check reads memory only), until this replica is
  // destroyed; `auth` must outlive it.
  Status share_api_tokens(coordinator::ApiAuth& auth,
                          std::chrono::milliseconds every = kApiTokenRefresh);

  const std::shared_ptr<const Database>& database() const { return db_; }

 private:
  Replica() = default;
  void refresh_loop(coordinator::ApiAuth& auth, std::chrono::milliseconds every);

  std::shared_ptr<const Database> db_;
  std::optional<enroll::CertificateAuthority> ca_, endpoint_ca_;
  std::string admin_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread refresher_;
};

}  // namespace factory::shared
