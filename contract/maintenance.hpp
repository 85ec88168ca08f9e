#pragma once
// A maintenance notice: before a host drain stops a tenant's VM, the
// coordinator tells the tenant's agent when and where, so that the people
// and programs inside the guest hear of it ahead of time (a message on their
// terminals, a file their own scripts can watch) instead of finding their VM
// gone. Both sides use these types: the coordinator builds a notice and sends
// to_json() as the body of a `command` frame (protocol.hpp), and the agent
// reads it back with decode_maintenance_notice(), which checks every field,
// since the agent prints the notice on the guest's terminals and writes it
// where the customer's users read it.
//
// The command frame's body:
//   {"action": "maintenance", "notice_id", "state": "scheduled"|"cancelled",
//    "node", "deadline": RFC 3339 UTC ("2026-11-30T09:00:00Z"), "message"}
// A notice is named by its notice_id: the coordinator sends the same notice
// again after a reconnection, and the agent acts on it once (agent/cli/
// maintenance.hpp). "cancelled" withdraws the notice of that id.
//
// The agent's durable event (its spool, delivered like the plan's events),
// once per notice and state:
//   {"kind": "maintenance", "notice_id", "state": "received"|"cancelled",
//    "node", "deadline"}
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/error.hpp"

namespace factory::proto {

// The limits decode_maintenance_notice() holds a notice to.
namespace maintenance_limits {
inline constexpr std::size_t kNoticeId = 64;  // [A-Za-z0-9._-]
inline constexpr std::size_t kNode = 253;     // a DNS-1123 subdomain's cap
inline constexpr std::size_t kMessage = 512;  // bytes
}  // namespace maintenance_limits

// The agent's event for a notice: its kind and its two states.
inline constexpr std::string_view kMaintenanceEventKind = "maintenance";
inline constexpr std::string_view kMaintenanceEventReceived = "received";
inline constexpr std::string_view kMaintenanceEventCancelled = "cancelled";

enum class MaintenanceState { scheduled, cancelled };
const char* state_name(MaintenanceState s);  // "scheduled", "cancelled"

struct MaintenanceNotice {
  std::string notice_id;
  MaintenanceState state = MaintenanceState::scheduled;
  std::string node;  // the host being drained
  // When the VM will be stopped, to the second (what RFC 3339 UTC carries here).
  std::chrono::system_clock::time_point deadline;
  // Free text from the admin for the guest's users; may hold line breaks,
  // no other control character.
  std::string message;

  // The command frame's body, "action" included.
  nlohmann::json to_json() const;
  // The agent's event for this notice: "received" when scheduled, else "cancelled".
  nlohmann::json event() const;
  bool operator==(const MaintenanceNotice&) const = default;
};

// A command body read as a notice. Refused (invalid_argument, the message
// naming the field: "maintenance notice: deadline: ...") when a required
// field (notice_id, state, node, deadline) is missing or any field breaks its
// rule: notice_id 1 to 64 of [A-Za-z0-9._-]; state one of the two; node a
// host name (DNS labels of letters, digits and hyphens, at most 253 bytes);
// deadline RFC 3339 in UTC ("Z"; a fraction of a second is accepted and
// dropped); message at most 512 bytes, text that shows as it is on a
// terminal (display::is_display_safe) apart from its line breaks. "action",
// when present, must be "maintenance". Keys it does not know are ignored: a
// newer coordinator may say more. Never throws.
Result<MaintenanceNotice> decode_maintenance_notice(const nlohmann::json& body);

}  // namespace factory::proto
