#pragma once
// Host maintenance: `factory host drain NODE` and `undrain NODE`, as the
// tenants service carries them out (TenantService::drain, undrain,
// maintenance_pass; docs/maintenance.md).
//
// A drain, in order, each step journaled in the tenant's record
// (status.maintenance, store::MaintenanceJournal) before it acts:
//   1. the impact: every tenant whose VM runs on the node, its tier, whether
//      it could move (VmProvider::mobility); a dry run stops here;
//   2. each tenant journaled `noticed` with the deadline (now + --notice);
//   3. the node cordoned (no new VM lands on it);
//   4. each tenant's notice announced on the feed (an `action` event,
//      action "drain", state "notice") and sent to its agent (a `command`
//      frame, contract/maintenance.hpp), again whenever the agent connects
//      before the deadline;
//   5. at the deadline: journaled `stopping`, announced, the VM asked to
//      shut down (VmProvider::stop: ACPI, never a kill before its grace);
//   6. once the VM is off: `drained`, announced. With --move and a tenant
//      that can move, it is started again at once (`starting`): the node is
//      cordoned, so it lands elsewhere.
// An undrain journals every drained tenant of the node `starting` (a notice
// not yet acted on is withdrawn: `cancelled`), uncordons the node, starts
// each VM and calls it `back` once its agent is connected again with its
// plan ready: the same disk, plan journal and identity, no re-enrollment.
//
// Steps 5 and 6 and an undrain's starts are done by maintenance_pass(), on
// the maintenance thread, from the journals alone: a coordinator killed at
// any point carries on from them at its next start (the cordon made again
// for every node with a tenant noticed, stopping or drained).
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace factory::tenants {

struct DrainRequest {
  std::string node;
  // How long the tenants have between the notice and the stop.
  std::chrono::seconds notice{std::chrono::minutes(10)};
  bool move = false;     // start each tenant that can move on another node
  std::string message;   // the admin's words, shown to the guest's users
  bool dry_run = false;  // the impact only; nothing changed
};

struct UndrainRequest {
  std::string node;
  bool dry_run = false;
};

// One tenant a drain concerns, as the impact and the progress show it.
struct MaintenanceEntry {
  std::string tenant, tier, phase;
  std::string state;  // its journal's state, "" before the drain
  bool agent_connected = false;
  bool can_move = false;
  std::string why_not;  // why it cannot move, when it cannot
  std::string deadline, note, error;
  nlohmann::json to_json() const;
};

// A node's maintenance: the impact before a drain, the progress after.
struct HostMaintenance {
  std::string node;
  bool dry_run = false;
  std::string notice_id, deadline;  // a drain's
  std::vector<MaintenanceEntry> tenants;
  // Tenants whose VM could not be looked at, so whether they are on the
  // node is not known: one line each. A drain refuses while there are any.
  std::vector<std::string> unknown;
  // Every tenant is at the end of what was asked (drained, or back).
  bool done = false;
  nlohmann::json to_json() const;
};

// Whether a journal state is one a drain holds the node for: the node stays
// cordoned while any tenant is in one.
bool holds_node_cordoned(const std::string& state);

}  // namespace factory::tenants
