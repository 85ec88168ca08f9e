#pragma once
// The agent <-> coordinator wire protocol: JSON text frames over wss.
//
// Every frame is an envelope {"v":1,"type":T,"seq":N,"ack":M?,"body":{...}}.
//  - `seq` numbers the sender's frames on this connection, from 1.
//  - Reliable frames (type "event") also carry body.id, the agent's durable
//    event id from its on-disk spool. The coordinator stores an event before
//    it acknowledges it ({"type":"ack","body":{"event_id":id}}, cumulative),
//    and drops any id it already stored, so delivery is at least once and
//    storage exactly once, across reconnects, reboots and crashes on either side.
//  - "health" frames are state, not history: no id, no acknowledgement, not
//    spooled; each replaces the tenant's latest sample (health_sample.hpp),
//    and one lost in an outage is superseded by the next.
//  - Unknown types are ignored with a warning (forward compatible). A bad
//    frame is answered with an "error" frame; the connection survives.
//  - Frames are capped at kMaxFrameBytes, except "plan" which may be larger
//    and "enroll" which must be smaller: it is what a stranger (no client
//    certificate yet) may send, a token and a CSR, and every stranger's
//    unfinished frame is memory the coordinator holds until its deadline.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "common/error.hpp"

namespace factory::proto {

inline constexpr int kVersion = 1;
inline constexpr size_t kMaxFrameBytes = 64 * 1024;
inline constexpr size_t kMaxPlanFrameBytes = 1024 * 1024;
inline constexpr size_t kMaxEnrollFrameBytes = 8 * 1024;
inline constexpr std::string_view kAgentPath = "/v1/agent";

namespace type {
// agent -> coordinator
inline constexpr std::string_view kEnroll = "enroll";  // {token, csr, agent_version}
// {agent_id, agent_version, hostname, features?}: features names what this
// agent's build can do beyond the protocol's first version (kAgentFeatures);
// an older agent sends none.
inline constexpr std::string_view kHello = "hello";
inline constexpr std::string_view kEvent = "event";    // {id, time, kind, ...}
inline constexpr std::string_view kRenew = "renew";    // {csr}
inline constexpr std::string_view kHealth = "health";  // HealthSample (health_sample.hpp)
// A model endpoint's guest asks for its server certificate: {csr}
inline constexpr std::string_view kEndpointCsr = "endpoint_csr";
// {pending_events, dropped_events, plan_hash?, plan_state?, steps_done?, steps_total?}
inline constexpr std::string_view kHeartbeat = "heartbeat";
// coordinator -> agent
inline constexpr std::string_view kEnrolled = "enrolled";  // {tenant, certificate, ca, expires_at}
inline constexpr std::string_view kWelcome = "welcome";  // {tenant, server_version, last_event_id}
inline constexpr std::string_view kPlan = "plan";        // {hash, plan}
inline constexpr std::string_view kCertificate = "certificate";  // {certificate, expires_at}
// {action, ...}: one of the actions below. An action the agent does not know
// is ignored with a warning.
//   {action: "retry", step?}: the plan runner runs the failed plan again
//   {action: "maintenance", notice_id, state, node, deadline, message}: a
//     host drain will stop the VM (MaintenanceNotice, maintenance.hpp)
//   {action: "upgrade", upgrade_id, version, sha256, url, size,
//     confirm_within_s}: install another agent binary (AgentUpgradeOrder,
//     agent_upgrade.hpp)
//   {action: "tier_upgrade", upgrade_id, from_hash, to_hash, plan, steps}:
//     run the steps of a newer plan of the tenant's tier, going back where
//     a step kind can (TierUpgradeOrder, tier_upgrade.hpp)
inline constexpr std::string_view kCommand = "command";
// A model endpoint's key hash, and its certificate when it asked:
// {key_sha256, keys, url?, certificate?, ca?, expires_at?} (endpoint_grant.hpp)
inline constexpr std::string_view kEndpoint = "endpoint";
// both
inline constexpr std::string_view kAck = "ack";      // {event_id?} and/or envelope ack
inline constexpr std::string_view kError = "error";  // {code, message}
}  // namespace type

// The actions of a "command" frame (type::kCommand).
namespace action {
inline constexpr std::string_view kRetry = "retry";
inline constexpr std::string_view kMaintenance = "maintenance";
inline constexpr std::string_view kUpgrade = "upgrade";           // agent_upgrade.hpp
inline constexpr std::string_view kTierUpgrade = "tier_upgrade";  // tier_upgrade.hpp
}  // namespace action

// What this build's agent names in its hello's features.
inline constexpr std::string_view kAgentFeatures[] = {"tier_upgrade"};

struct Envelope {
  int v = kVersion;
  std::string type;
  uint64_t seq = 0;
  std::optional<uint64_t> ack;
  nlohmann::json body = nlohmann::json::object();
};

// Validates size, JSON syntax, version and envelope shape. Never throws.
Result<Envelope> parse(std::string_view frame);
std::string serialize(const Envelope& e);
size_t max_frame_bytes_for(std::string_view type);

}  // namespace factory::proto
