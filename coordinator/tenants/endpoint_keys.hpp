#pragma once
// Several keys per model endpoint (issue 28, `factory tenant keys`): named
// keys beside the tenant's own (the key named "default", which `tenant
// credentials --rotate` replaces), each with optional limits per minute.
// The coordinator makes each key and answers it once, at create; the record
// keeps its SHA-256 only (store::EndpointKey), and the tenant's connected
// agent is sent a fresh `endpoint` frame after every change, so the proxy
// takes a new key, and refuses a revoked one, at once.
//
// Admin API (admin token only; the create answer holds the key):
//   POST   /v1/tenants/{name}/keys         {"name", "rpm"?, "tpm"?, "dry_run"?}
//   GET    /v1/tenants/{name}/keys
//   DELETE /v1/tenants/{name}/keys/{key}[?dry_run=true]
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "common/error.hpp"
#include "coordinator/api/router.hpp"
#include "coordinator/store/store.hpp"
#include "coordinator/tenants/agent_control.hpp"

namespace factory::tenants {

// The key the tenant record's key_sha256 is: never created nor revoked here.
inline constexpr const char* kDefaultKeyName = "default";
// Named keys a tenant may have at once (the default not counted).
inline constexpr std::size_t kMaxEndpointKeys = 32;
// The largest limit one may set: a minute's requests or tokens.
inline constexpr std::int64_t kMaxKeyLimit = 1'000'000'000;

// [a-z0-9][a-z0-9-]{0,62}: safe in a label, a path segment and a terminal.
Status validate_key_name(const std::string& name);

struct KeyRequest {
  std::string tenant, name;
  std::optional<std::int64_t> rpm, tpm;
  bool dry_run = false;
};

class EndpointKeys {
 public:
  EndpointKeys(store::Store& store, AgentControl& agents) : store_(store), agents_(agents) {}

  // {tenant, key, api_key (not on a dry run), created_at, rpm?, tpm?,
  //  guest_told, dry_run}
  Result<nlohmann::json> create(const KeyRequest& r);
  // {tenant, keys: [{name, created_at?, rpm?, tpm?, usage?}]}, "default" first.
  Result<nlohmann::json> list(const std::string& tenant) const;
  // {tenant, key, revoked, guest_told, dry_run}
  Result<nlohmann::json> revoke(const std::string& tenant, const std::string& name, bool dry_run);

  void install_routes(coordinator::ApiRouter& r);

 private:
  Result<store::TenantRecord> endpoint_tenant(const std::string& tenant) const;

  store::Store& store_;
  AgentControl& agents_;
  std::mutex mu_;  // one change at a time, so two creates of one name cannot both pass
};

}  // namespace factory::tenants
