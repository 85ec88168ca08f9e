#pragma once
// Tier upgrades for running tenants (issue 27, point 3): a tenant keeps the
// plan it was provisioned with (its pins) until the admin upgrades it to the
// plan its tier has in the catalog now. Both sides use what is here:
//
//  - diff_plans(): which steps of the tenant's plan differ from the
//    catalog's (kind, params, timeout or retries), which are new, which are
//    gone, and the pins that move (pins.hpp, read off the steps). The
//    coordinator shows it (`tenant show`, `tenant upgrade --dry-run`) and
//    sends the changed and new steps' ids in the order; the agent runs only
//    those.
//  - step_kind_can_go_back(): the step kinds a failed upgrade can undo by
//    running the step again with the previous plan's params (the driver:
//    its previous pinned packages, reinstalled, rebooted into and
//    verified). A failure in any other kind leaves the tenant degraded.
//  - TierUpgradeOrder: the `command` frame's body, action "tier_upgrade":
//      {"action": "tier_upgrade", "upgrade_id", "from_hash", "to_hash",
//       "plan": {...the new plan...}, "steps": [ids to run]}
//    The agent acts only when the plan it has finished is from_hash, checks
//    that plan hashes to to_hash, and acts on an upgrade_id once.
//  - The agent's report, a durable event:
//      {"kind": "tier_upgrade", "upgrade_id", "state", "from_hash",
//       "to_hash", "step"?, "message"?, "diagnosis"?}
//    state: started | rolling_back | succeeded | rolled_back | failed | refused
//    (TierUpgradeState). The coordinator decodes it with its other events
//    (coordinator/agents/messages.hpp), bounded like them.
//
// An agent that knows tier upgrades says so in its hello (protocol.hpp's
// kAgentFeatures); the coordinator sends no order to one that does not, and
// says why, rather than letting it run the new plan as a fresh one.
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"
#include "contract/pins.hpp"

namespace factory::proto {

inline constexpr std::string_view kTierUpgradeEventKind = "tier_upgrade";
// The feature an agent names in its hello when it runs tier upgrade orders.
inline constexpr std::string_view kFeatureTierUpgrade = "tier_upgrade";

namespace tier_upgrade_limits {
inline constexpr std::size_t kUpgradeId = 64;  // [A-Za-z0-9._-]
inline constexpr std::size_t kSteps = 1024;
}  // namespace tier_upgrade_limits

enum class TierUpgradeState { started, rolling_back, succeeded, rolled_back, failed, refused };
const char* state_name(TierUpgradeState s);
std::optional<TierUpgradeState> tier_upgrade_state_from(std::string_view s);
// Whether the upgrade is over in this state (succeeded, rolled_back, refused;
// failed too: what follows is the admin's `tenant retry`).
bool is_final(TierUpgradeState s);

struct TierUpgradeOrder {
  std::string upgrade_id;
  std::string from_hash;
  std::string to_hash;
  nlohmann::json plan;             // the new plan, as catalog::Tier::plan() makes it
  std::vector<std::string> steps;  // ids of the steps to run, in plan order

  // The command frame's body, "action" included.
  nlohmann::json to_json() const;
};

// A command body read as an order: upgrade_id 1 to 64 of [A-Za-z0-9._-];
// from_hash and to_hash 64 lower-case hex digits; plan an object whose
// canonical hash is to_hash; steps a list of ids each naming a step of the
// plan. Errors are invalid_argument, one line naming the field ("tier
// upgrade: plan: hashes to 1f..., not to_hash 9a..."). Never throws.
Result<TierUpgradeOrder> decode_tier_upgrade_order(const nlohmann::json& body);

}  // namespace factory::proto

namespace factory::catalog {

// How one step of a plan moves from one plan to the next.
struct StepChange {
  enum class Kind { changed, added, removed };
  std::string id;
  std::string kind;  // the step kind (the new one where it changed)
  Kind change = Kind::changed;
  std::vector<std::string> fields;  // what differs: "params.version", "timeout_seconds", ...
  bool can_go_back = false;         // a failure in it is undone (changed steps only)
  nlohmann::json to_json() const;   // {id, kind, change, fields, can_go_back}
};

struct PinChange {
  std::string what;
  std::string from, to;  // "" where not pinned, or absent from that plan
  nlohmann::json to_json() const;
};

struct PlanDiff {
  std::vector<StepChange> steps;  // in the new plan's order, removed ones last
  std::vector<PinChange> pins;
  // Top-level sections other than the steps that differ ("health", "endpoint").
  std::vector<std::string> sections;
  // The ids of the steps the upgrade runs: changed and added, in plan order.
  std::vector<std::string> to_run() const;
  bool empty() const { return steps.empty() && sections.empty(); }
  nlohmann::json to_json() const;  // {steps, pins, sections, runs}
};

// The difference between two plans as Tier::plan() makes them (a plan that
// is not an object, or has no steps, counts as having none).
PlanDiff diff_plans(const nlohmann::json& from, const nlohmann::json& to);

// The step kinds a failed upgrade can undo (nvidia_driver).
bool step_kind_can_go_back(std::string_view kind);

}  // namespace factory::catalog
