#pragma once
// What the coordinator remembers: tenants (spec, agent identity, derived
// status), and every event agents sent, stored exactly once. One interface;
// the embedded backend keeps files under the state directory. A Kubernetes
// backend (CRD + Lease) fits behind the same interface.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.hpp"

namespace factory::store {

struct TenantRecord {
  std::string name;
  std::string tier;               // catalog item; empty for a token-only tenant
  // creating | pending | enrolled | provisioning | ready | failed | deleting
  std::string phase = "pending";
  std::string created_at;
  nlohmann::json spec = nlohmann::json::object();    // what the admin asked for
  nlohmann::json agent = nlohmann::json::object();   // identity: agent_id, cert_serial, ...
  nlohmann::json status = nlohmann::json::object();  // derived from events: plan, health, ...

  nlohmann::json to_json() const;
  static Result<TenantRecord> from_json(const nlohmann::json& j);
};

struct StoredEvent {
  std::string agent_id;
  uint64_t id = 0;  // the agent's durable event id
  std::string received_at;
  nlohmann::json event;
};

class Store {
 public:
  virtual ~Store() = default;
  virtual std::vector<TenantRecord> list_tenants() const = 0;
  virtual std::optional<TenantRecord> get_tenant(const std::string& name) const = 0;
  virtual Status put_tenant(const TenantRecord& t) = 0;
  virtual Status delete_tenant(const std::string& name) = 0;

  // Durable before it returns. false (not an error) when this agent's event
  // id was already stored: that is the duplicate a reconnect replays.
  virtual Result<bool> append_event(const std::string& tenant, const StoredEvent& e) = 0;
  virtual uint64_t last_event_id(const std::string& tenant, const std::string& agent_id) const = 0;
  virtual std::vector<StoredEvent> recent_events(const std::string& tenant, size_t max) const = 0;
  virtual size_t event_count(const std::string& tenant) const = 0;
};

// Files under dir: tenants/<name>.json (atomic writes), events/<name>.jsonl
// (durable appends; a torn last line from a crash is cut off on open).
Result<std::unique_ptr<Store>> open_file_store(const std::string& dir);

}  // namespace factory::store
