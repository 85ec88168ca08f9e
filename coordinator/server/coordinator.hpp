#pragma once
// `factory serve`: everything the coordinator runs, wired together. The
// state directory holds the CA, the admin token, the token book and the
// store; the agents endpoint (wss, mTLS after enrollment) and the API
// (admin + status feed) are two HTTPS listeners on one io_context thread.
#include <memory>
#include <string>

#include "coordinator/agents/agent_service.hpp"
#include "coordinator/api/router.hpp"
#include "coordinator/config/coordinator_config.hpp"
#include "coordinator/enroll/ca.hpp"
#include "coordinator/enroll/tokens.hpp"
#include "coordinator/store/store.hpp"

namespace boost::asio {
class io_context;
}

namespace factory::tenants {
class TenantService;
}

namespace factory::coordinator {

inline constexpr const char* kAdminTokenFile = "admin.token";
inline constexpr const char* kTokenBookFile = "tokens.json";

class Coordinator {
 public:
  // Prepares the state directory (CA, admin token on first start) and opens the store.
  static Result<std::unique_ptr<Coordinator>> open(CoordinatorConfig cfg);
  ~Coordinator();

  // Binds both listeners. Call run() after.
  Status start();
  // Runs until SIGINT/SIGTERM or stop().
  void run();
  void stop();

  const CoordinatorConfig& config() const { return cfg_; }
  store::Store& store() { return *store_; }
  AgentService& agents() { return *agents_; }
  ApiRouter& router() { return *router_; }
  tenants::TenantService& tenants() { return *tenants_; }
  enroll::TokenBook& tokens() { return *tokens_; }
  const enroll::CertificateAuthority& ca() const { return *ca_; }
  boost::asio::io_context& io();
  int agents_port() const;
  int api_port() const;
  // SHA-256 of the agent binary served at /v1/agent/binary ("" when absent).
  const std::string& agent_binary_sha256() const { return agent_sha256_; }
  const std::string& agent_binary_path() const { return agent_binary_; }
  std::string prometheus_metrics() const;

 private:
  Coordinator() = default;
  void install_core_routes();

  CoordinatorConfig cfg_;
  std::unique_ptr<enroll::CertificateAuthority> ca_;
  std::unique_ptr<enroll::TokenBook> tokens_;
  std::unique_ptr<store::Store> store_;
  std::unique_ptr<AgentService> agents_;
  std::unique_ptr<ApiRouter> router_;
  std::unique_ptr<tenants::TenantService> tenants_;
  std::string agent_binary_, agent_sha256_;
  struct Net;
  std::unique_ptr<Net> net_;
};

// The admin token, created (0600) on first start.
Result<std::string> load_or_create_admin_token(const std::string& state_dir);

}  // namespace factory::coordinator
