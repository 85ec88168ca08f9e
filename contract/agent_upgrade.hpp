#pragma once
// Agent self-update (issue 27, point 2): what the coordinator orders and what
// the agent reports back. Both sides use these types: the coordinator builds
// an order and sends to_json() as the body of a `command` frame
// (protocol.hpp); the agent reads it back with decode_agent_upgrade_order(),
// which checks every field, since the agent downloads and runs what it names.
// The agent's reports are durable events (its spool, delivered like the
// plan's, so each is stored once); the coordinator reads them with
// decode_agent_upgrade_event(), which checks every field, since the guest is
// the customer's and its words are shown on the feed and the CLI.
//
// The command frame's body:
//   {"action": "upgrade", "upgrade_id", "version", "sha256", "url", "size",
//    "confirm_within_s"}
// The agent downloads url (the coordinator's agent binary, over HTTPS with
// the coordinator's CA), checks size and sha256, installs it beside the
// binary it runs (A/B), restarts through systemd, and the new binary must
// connect and report health within confirm_within_s, else the previous
// binary is put back and started by the guest itself (agent/upgrade).
// An order is named by its upgrade_id: the coordinator sends it again after
// every reconnection until it hears the outcome, and the agent acts on an id
// once.
//
// The agent's event, once per upgrade_id and state:
//   {"kind": "agent_upgrade", "upgrade_id", "state", "from_version",
//    "to_version", "reason"}
//   state: "installing"   the order was taken: the download begins
//          "refused"      nothing was changed (hash or size mismatch, the
//                         download failed, no systemd, disk full): reason says
//          "upgraded"     the new binary runs, connected and reported health
//                         (sent by the new binary)
//          "rolled_back"  the new binary did not confirm in time, the previous
//                         one runs again (sent by the previous binary): reason
//                         says what the new one did ("exited with status 1 at
//                         start, 3 times", "no health report within 120 s")
//
// The version an agent binary carries is in its bytes, after the mark
// kAgentVersionMark, so the coordinator can tell the version of the file it
// serves without running it (agent_binary_version()).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/error.hpp"

namespace factory::proto {

namespace agent_upgrade_limits {
inline constexpr std::size_t kUpgradeId = 64;  // [A-Za-z0-9._-]
inline constexpr std::size_t kVersion = 64;    // [A-Za-z0-9.+~_-], starting with an alnum
inline constexpr std::size_t kUrl = 2048;
inline constexpr std::size_t kReason = 512;  // bytes, display-safe text
// The largest binary an agent downloads (today's is about 12 MiB).
inline constexpr std::uint64_t kMaxSize = 256ull * 1024 * 1024;
inline constexpr int kMinConfirmSeconds = 10;
inline constexpr int kMaxConfirmSeconds = 3600;
}  // namespace agent_upgrade_limits

// How long the new binary has to connect and report health by default.
inline constexpr int kDefaultConfirmSeconds = 120;

inline constexpr std::string_view kAgentUpgradeEventKind = "agent_upgrade";

// In the agent binary's bytes: the mark, then the version, then at least one
// NUL. The agent reserves kAgentVersionField bytes after the mark (its
// version NUL-padded), so a build can be stamped with another version of up
// to kVersion bytes in place.
inline constexpr std::string_view kAgentVersionMark =
    "\x01"
    "factory-agent-version:";
inline constexpr std::size_t kAgentVersionField = agent_upgrade_limits::kVersion + 1;

struct AgentUpgradeOrder {
  std::string upgrade_id;
  std::string version;  // what the new binary reports once it runs
  std::string sha256;   // 64 lower-case hex digits
  std::string url;      // https://
  std::uint64_t size = 0;
  int confirm_within_s = kDefaultConfirmSeconds;

  // The command frame's body, "action" included.
  nlohmann::json to_json() const;
  bool operator==(const AgentUpgradeOrder&) const = default;
};

enum class AgentUpgradeState { installing, refused, upgraded, rolled_back };
const char* state_name(AgentUpgradeState s);  // "installing", ..., "rolled_back"

struct AgentUpgradeEvent {
  std::string upgrade_id;
  AgentUpgradeState state = AgentUpgradeState::installing;
  std::string from_version;
  std::string to_version;
  std::string reason;  // may be empty (installing, upgraded)

  // The durable event, "kind" included.
  nlohmann::json to_json() const;
  bool operator==(const AgentUpgradeEvent&) const = default;
};

// True for a version as agents report it: 1 to 64 of [A-Za-z0-9.+~_-],
// starting with a letter or a digit ("0.1.0", "0.2.0-rc.1+build.7").
bool is_agent_version(std::string_view s);

// A command body read as an order. Refused (invalid_argument, the message
// naming the field: "agent upgrade: sha256: ...") when a field is missing or
// breaks its rule: upgrade_id 1 to 64 of [A-Za-z0-9._-]; version as
// is_agent_version(); sha256 64 lower-case hex digits; url https:// with no
// space or control character, at most 2048 bytes; size 1 to kMaxSize;
// confirm_within_s (optional, default 120) 10 to 3600. "action", when
// present, must be "upgrade". Unknown keys are ignored. Never throws.
Result<AgentUpgradeOrder> decode_agent_upgrade_order(const nlohmann::json& body);

// An event body read as an agent upgrade report (same rules for upgrade_id
// and the versions, which may be empty only when unknown: from_version of an
// order the agent refused before it could tell; reason at most 512 bytes of
// display-safe text). "kind" must be "agent_upgrade". Never throws.
Result<AgentUpgradeEvent> decode_agent_upgrade_event(const nlohmann::json& body);

// The version a binary's bytes carry after kAgentVersionMark, or not_found
// ("no factory-agent version mark: not an agent binary, or one older than
// 0.1.0's self-update"), or invalid_argument when the mark is followed by
// something that is not a version.
Result<std::string> agent_binary_version(std::string_view binary);

}  // namespace factory::proto
