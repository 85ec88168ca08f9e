#pragma once
// `factory serve`: everything the coordinator runs, wired together. The
// state directory holds the CA, the admin token, the token book and the
// store; the agents endpoint (wss, mTLS after enrollment) and the API
// (admin + status feed) are two HTTPS listeners served by the io threads,
// with a worker pool for whatever may wait.
#include <memory>
#include <string>

#include "coordinator/config/coordinator_config.hpp"

namespace factory::net {
struct TlsServerOptions;
}

namespace factory::coordinator {

inline constexpr const char* kAdminTokenFile = "admin.token";
inline constexpr const char* kTokenBookFile = "tokens.json";
// Read-only API tokens, hashed (`factory token create --read-only`).
inline constexpr const char* kApiTokensFile = "api-tokens.json";
// The agents endpoint's TLS session ticket keys (common/net/tls_tickets.hpp),
// so agents resume after a restart. A secret: 0600, never logged.
inline constexpr const char* kTicketKeysFile = "tls-ticket-keys.json";
// The TLS certificate both listeners serve, and how often its age is checked:
// a comparison with the wall clock, so often, since an expired serving
// certificate turns every agent and admin away until the next check (a
// suspended host, or a clock set forward, finds it expired at once).
inline constexpr std::chrono::hours kServingCertTtl{24 * 30};
inline constexpr std::chrono::seconds kRenewalCheckEvery{10};
// How often freed memory is handed back to the system (malloc_trim). glibc
// keeps what a burst freed (an event flood, readers dropped) in its arenas
// for reuse, and a coordinator that peaked once would look that large for
// its life; trimming every so often gives it back within seconds.
inline constexpr std::chrono::seconds kMemoryTrimEvery{5};
// From when the coordinator (and `factory status`) warn that the CA expires.
inline constexpr std::chrono::hours kCaExpiryWarning{24 * 30};

class Coordinator {
 public:
  // Prepares the state directory (CA, admin token on first start), opens the
  // store and wires the modules together.
  static Result<std::unique_ptr<Coordinator>> open(CoordinatorConfig cfg);
  ~Coordinator();

  // Binds both listeners. Call run() after.
  Status start();
  // Runs until SIGINT/SIGTERM or stop().
  void run();
  void stop();

  const CoordinatorConfig& config() const { return cfg_; }
  int agents_port() const;
  int api_port() const;

 private:
  Coordinator() = default;
  void install_core_routes();
  Status issue_serving_certificate(net::TlsServerOptions& tls);
  net::TlsServerOptions agents_tls(const net::TlsServerOptions& serving) const;
  void schedule_renewal();
  void schedule_memory_trim();
  // Leader election (leader_election.enabled): what only the leader runs
  // starts when this replica takes the Lease and stops when it loses it.
  // Without an election this coordinator leads from start() on.
  void start_leader_election();
  void on_leadership(bool leading);

  CoordinatorConfig cfg_;
  struct Parts;  // every module's piece, in the order they are built
  std::unique_ptr<Parts> parts_;
  struct Net;
  std::unique_ptr<Net> net_;
};

// The admin token, created (0600) on first start.
Result<std::string> load_or_create_admin_token(const std::string& state_dir);

}  // namespace factory::coordinator
