#pragma once
// Who may call the admin API: the admin token (every route), read-only API
// tokens (GET of the status feed: tenants, events, metrics, the dashboard),
// and the dashboard's sessions, which a browser gets by signing in with
// either token and keeps in an HttpOnly, Secure, SameSite=Strict cookie. A
// session reads what a read-only token reads, whichever token opened it: a
// cookie rides along with requests the user did not mean, so it never
// carries the right to change anything.
//
// Read-only tokens are kept as SHA-256 hashes in a 0600 file, or in the
// database replicas share (ApiTokenStore); the token itself is printed once. Sessions live in
// memory (a restart signs everyone out). Thread-safe; every check is a hash and a map lookup (no
// waiting on an io thread); creating a token writes the file (call it from a worker).
//
// What is limited is accounted per token (its "principal"), so that no
// read-only token can take what the admin needs: each token holds at most
// kMaxSessionsPerToken sessions (its own oldest makes room for its next);
// the admin token's sessions are never evicted by anyone else's, and
// read-only tokens together hold at most kMaxReadOnlySessions (past it a
// sign-in is refused, no one else's session is evicted). The status feed
// counts its readers the same way (feed/event_bus.hpp).
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"
#include "common/net/server.hpp"

namespace factory::coordinator {

enum class Access { none, read_only, admin };
const char* access_name(Access a);  // "none" | "read-only" | "admin"

inline constexpr const char* kSessionCookie = "factory_session";

// Who made a request, as far as the limits care.
struct Caller {
  Access access = Access::none;
  // "admin", or "read-only:<token id>"; a session is its opening token's.
  std::string principal;
  bool by_session = false;
};
inline constexpr const char* kAdminPrincipal = "admin";

struct ReadOnlyToken {
  std::string id, created_at;
};

struct IssuedToken {
  std::string id, token, created_at;
};

// A read-only token as it is kept: its id, the SHA-256 of the token, when.
struct StoredApiToken {
  std::string id, sha256, created_at;
};

// Where read-only tokens are kept when coordinators share them (the
// replicas' database, coordinator/shared) instead of the file of
// ApiAuth::load. Both calls may wait on the database: never on an io thread.
class ApiTokenStore {
 public:
  virtual ~ApiTokenStore() = default;
  virtual Status add(const StoredApiToken& token) = 0;
  // Every token kept, oldest first.
  virtual Result<std::vector<StoredApiToken>> all() const = 0;
};

class ApiAuth {
 public:
  explicit ApiAuth(std::string admin_token) : admin_(std::move(admin_token)) {}

  // Read-only tokens from `path` (absent: none yet); new ones are saved there.
  Status load(std::string path);
  // Or from a store other coordinators share: what it holds now, and new
  // ones are added there. Checks still read memory only; refresh() (from a
  // worker, every few seconds) takes in what the others added, and drops
  // what was deleted from the store.
  Status use_store(std::shared_ptr<ApiTokenStore> store);
  Status refresh();
  Result<IssuedToken> create_read_only_token();
  std::vector<ReadOnlyToken> read_only_tokens() const;

  // What an Authorization: Bearer token may do.
  Access bearer(std::string_view token) const;
  // The caller of a request: its bearer token or, without an Authorization
  // header, its session cookie. access none: neither is good.
  Caller identify(const net::HttpRequestIn& req) const;

  struct Session {
    std::string cookie_value;
    Access opened_with = Access::none;
    std::chrono::system_clock::time_point expires_at;
    std::string principal;  // the token that opened it
  };
  // A new session for a valid token. Errors: unauthenticated (not a token
  // of this coordinator), unavailable (read-only sessions are at their cap).
  Result<Session> sign_in(std::string_view token);
  // The access a session cookie's value grants: read_only or none.
  Access session(std::string_view cookie_value) const;
  void sign_out(std::string_view cookie_value);
  std::size_t session_count() const;

  static constexpr std::chrono::hours kSessionLife{12};
  static constexpr std::size_t kMaxSessionsPerToken = 64;
  static constexpr std::size_t kMaxReadOnlySessions = 960;

 private:
  // The access and principal of a bearer token (none: not one).
  Caller lookup(std::string_view token) const;
  std::optional<Caller> session_caller(std::string_view cookie_value) const;
  Status save_locked() const;
  std::string admin_;
  mutable std::mutex mu_;
  std::string path_;
  std::shared_ptr<ApiTokenStore> store_;
  // Orders a creation and a refresh, so that a refresh that read the store
  // before a token was added cannot drop it from memory after. Never held
  // by a check: they take only mu_, and only for the lookup.
  std::mutex store_mu_;
  std::vector<StoredApiToken> tokens_;
  // sha256 of the cookie value -> session, so the map holds no usable secret.
  std::map<std::string, Session> sessions_;
};

// The value of the session cookie in a request ("" when none).
std::string session_cookie(const net::HttpRequestIn& req);
// Set-Cookie for a session, and the one that ends it.
std::string session_set_cookie(const ApiAuth::Session& s);
std::string session_clear_cookie();
// False when a browser says the request comes from another site: an Origin
// that is not this server's own (its Host), or Sec-Fetch-Site cross-site.
// A request with neither header (curl, a same-origin GET) passes.
bool same_origin(const net::HttpRequestIn& req);

}  // namespace factory::coordinator
