#pragma once
// Agent self-update, the coordinator's side (issue 27 point 2;
// docs/agent-rollouts.md): `factory agents upgrade` as the tenants service
// carries it out (TenantService::upgrade_agents, agent_rollout,
// rollout_pass). The guest's side is the agent's (docs/agent-upgrades.md);
// the two meet in contract/agent_upgrade.hpp.
//
// A rollout, in order, each step journaled in the tenant's record
// (status.agent_upgrade, store::AgentUpgradeJournal) before it acts:
//   1. the plan: the binary served now (agent_binary.hpp, read again for
//      the request) and, per tenant, its agent's version and connection and
//      what the rollout would do: upgrade, current (it runs that version
//      already) or skip (never enrolled, not connected, revoked, an upgrade
//      under way); a dry run stops here. A binary without a version mark,
//      or a rollout under way, refuses the rest;
//   2. every selected tenant journaled `pending` (its order's fields kept
//      whole: upgrade id, version, sha256, URL, size, confirm_within_s) and
//      announced on the feed (`action` event, action agent_upgrade, state
//      pending), before any order is sent;
//   3. the rest is rollout_pass()'s, on the maintenance thread of the leader,
//      from the journals alone: at most max_unavailable tenants `sent` or
//      `installing` at a time, in the rollout's order; each journaled `sent`,
//      announced, and the order sent to its agent if connected (else at its
//      next connection: pending_commands, on any replica, while the agent
//      runs another version);
//   4. the agent's outcome (its durable agent_upgrade event, projected by
//      the agents module onto its own tenant's journal, for the upgrade id
//      the journal holds only) announced and counted
//      (factory_agent_upgrades_total{result}); no outcome within
//      confirm_within_s + agents.upgrade_grace (5 minutes) is `failed`, unless the
//      agent is connected running the version ordered: then `upgraded`
//      (its report was lost, the version it runs is the proof);
//   5. after the first rolled_back, refused or failed, every tenant of the
//      rollout still `pending` is `held` ("held: <tenant> rolled back:
//      <reason>"): nothing more is ordered until an admin starts another
//      rollout.
#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "contract/agent_upgrade.hpp"

namespace factory::tenants {

struct UpgradeRequest {
  std::vector<std::string> tenants;  // by name; or
  bool all = false;                  // every tenant
  int max_unavailable = 1;           // tenants sent or installing at once
  int confirm_within_s = proto::kDefaultConfirmSeconds;
  bool dry_run = false;

  // The POST /v1/agents/upgrade body: {tenants:[...] | all:true,
  // max_unavailable, confirm_within_s, dry_run}, every field checked.
  static Result<UpgradeRequest> from_json(const nlohmann::json& body);
};

inline constexpr int kMaxUnavailableLimit = 1000;

// One tenant of a rollout, as the plan and the progress show it.
struct UpgradeEntry {
  std::string tenant;
  std::string version;  // what its agent runs, as it last reported ("" unknown)
  bool connected = false;
  std::string action;  // upgrade | current | skip (the plan's)
  std::string why;     // skip's reason
  std::string state;   // its journal's, "" before the rollout journaled it
  std::string upgrade_id, reason, sent_at, done_at;
  int order = -1;
  nlohmann::json to_json() const;
};

struct AgentRolloutView {
  std::string rollout_id;
  bool dry_run = false;
  std::string version, sha256, binary_path;  // the target
  std::uint64_t size = 0;
  std::string cannot_upgrade;  // why the binary cannot be ordered ("" when it can)
  int max_unavailable = 1, confirm_within_s = proto::kDefaultConfirmSeconds;
  std::vector<UpgradeEntry> tenants;
  // No tenant pending, sent or installing.
  bool done = false;
  nlohmann::json to_json() const;
};

// States of status.agent_upgrade.
inline bool upgrade_in_flight(const std::string& s) {
  return s == "sent" || s == "installing";
}
inline bool upgrade_under_way(const std::string& s) {
  return s == "pending" || upgrade_in_flight(s);
}
// The agent's or the coordinator's word that the rollout must stop.
inline bool upgrade_went_wrong(const std::string& s) {
  return s == "rolled_back" || s == "refused" || s == "failed";
}
// "rolled back", "refused", ... for a sentence.
std::string upgrade_state_words(const std::string& s);

}  // namespace factory::tenants
