#pragma once
// The agent's connection to the coordinator: enroll once with the bootstrap
// token (after checking the server against the pinned CA), then mTLS sessions
// that replay the spool, send heartbeats, renew the certificate before it
// expires, and hand plans and commands to the plan runner. Reconnects with
// capped exponential backoff and full jitter, after a random first delay.
#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "agent/cli/config.hpp"
#include "agent/link/spool.hpp"

namespace factory::agent {

// Exit status when the agent can never succeed without an admin's help
// (token refused, certificate revoked). systemd's RestartPreventExitStatus=3
// keeps it from restarting in a loop.
inline constexpr int kExitNeedsAdmin = 3;

struct LinkCallbacks {
  std::function<void(const nlohmann::json& plan_frame_body)> on_plan;
  std::function<void(const nlohmann::json& command)> on_command;
  // Extra fields for each heartbeat (current plan hash, health summary).
  std::function<nlohmann::json()> heartbeat_fields;
};

class AgentLink {
 public:
  AgentLink(AgentConfig cfg, EventSpool& spool, LinkCallbacks cb);
  ~AgentLink();
  // Blocks until stop() or a failure that needs an admin. Returns the exit status.
  int run();
  // Thread-safe.
  void stop();
  void wake();

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace factory::agent
