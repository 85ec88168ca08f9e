#pragma once
// What tenant logic asks of the tenants' agents, and no more: the server
// implements it with the agents module, which tenants may not depend on
// (agents already depend on the store and feed that tenants write).
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"

namespace factory::tenants {

class AgentControl {
 public:
  virtual ~AgentControl() = default;
  // Voids the tenant's agent identity (certificates, unused tokens) and
  // drops its connection: nothing enrolls or connects as the tenant after.
  virtual Status revoke(const std::string& tenant) = 0;
  // Sends a command frame to the tenant's connected agent; false when none is.
  virtual bool send_command(const std::string& tenant, const nlohmann::json& body) = 0;
  // Tells the tenant's connected agent its endpoint's current key hash (after
  // a rotation); false when none is connected.
  virtual bool push_endpoint(const std::string& tenant) = 0;
  // What the tenant's connected agent says its build can do (its hello's
  // features, contract/protocol.hpp); nullopt when none is connected.
  virtual std::optional<std::vector<std::string>> agent_features(const std::string& tenant) = 0;
};

}  // namespace factory::tenants
