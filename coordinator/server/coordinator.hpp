#pragma once
// `factory serve`: everything the coordinator runs, wired together. The
// state directory holds the CA, the admin token, the token book and the
// store; the agents endpoint (wss, mTLS after enrollment) and the API
// (admin + status feed) are two HTTPS listeners on one io_context thread.
#include <memory>
#include <string>

#include "coordinator/config/coordinator_config.hpp"

namespace factory::coordinator {

inline constexpr const char* kAdminTokenFile = "admin.token";
inline constexpr const char* kTokenBookFile = "tokens.json";

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

  CoordinatorConfig cfg_;
  struct Parts;  // every module's piece, in the order they are built
  std::unique_ptr<Parts> parts_;
  struct Net;
  std::unique_ptr<Net> net_;
};

// The admin token, created (0600) on first start.
Result<std::string> load_or_create_admin_token(const std::string& state_dir);

}  // namespace factory::coordinator
