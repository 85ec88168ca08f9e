#pragma once
// The tenant's record, typed: what the admin asked for (TenantSpec), who
// its agent is (AgentPresence), what its agent's events and the
// coordinator's own actions made of it (TenantStatus) and its model
// endpoint (EndpointState). The coordinator reads and writes the members;
// JSON is only the form at its edges, through to_json() and from_json():
// the database (sqlite_store.cpp), and the API and the feed
// (feed/tenant_view.cpp, the tenants module's `tenant show`), whose JSON
// is all the CLI reads. Every part has its to_json() for those views.
//
// Every field is optional where a record may lack its key: a key that was
// absent stays absent, so the JSON of every record written so far is the
// same after from_json and to_json. A key a type does not know (a newer
// coordinator's) is kept in its `extra` and written back as it was, at
// every level; so is a known key whose value is null. A value of the wrong
// type is an error naming its path ("spec.gpus: want an integer, not
// \"2\""), never an exception. Integers read whichever way nlohmann holds
// them: json(5) is a signed integer, a parsed "5" an unsigned one.
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "coordinator/store/endpoint_usage.hpp"
#include "coordinator/store/gpu_usage.hpp"

namespace factory::store {

// spec.guest_ranges: the host's ranges create read and what it chose for
// the guest cluster around them (tenants::TenantService::guest_ranges_for).
// The ranges themselves are the ranges module's JSON, passed to the agent's
// rke2 step as they are.
struct GuestRanges {
  std::optional<nlohmann::json> avoid;    // [{range, source}, ...]
  std::optional<nlohmann::json> pool;     // the pools a range is picked from
  std::optional<nlohmann::json> planned;  // {cluster-cidr, service-cidr, cluster-dns}
  std::optional<bool> fixed;              // the tier's catalog fixes them
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json to_json() const;
  bool operator==(const GuestRanges&) const = default;
};

// What the admin asked for, as create resolved it (tenants::stored_spec): the
// VM's shape (tenants::VmSpec, but its name) and the request's own fields.
// Empty for a tenant made by `factory token create`.
struct TenantSpec {
  std::optional<std::string> tier;
  std::optional<std::string> ns;  // "namespace"
  std::optional<std::string> cpu, memory, disk;
  std::optional<std::string> image;  // the cloud image's URL
  std::optional<int> gpus;
  std::optional<std::string> gpu_resource;
  std::optional<int> ssh_node_port;
  std::optional<bool> needs_mig;     // absent in records from before it was kept
  std::optional<bool> ssh_service;   // written only when false
  std::optional<int> endpoint_port;  // written only when not 0
  std::optional<std::map<std::string, std::string>> labels;  // written only when some
  std::optional<std::vector<std::string>> ssh_authorized_keys;
  std::optional<std::vector<std::string>> models;  // written only when some
  std::optional<GuestRanges> guest_ranges;
  // The project whose quota the tenant counts against (docs/usage.md);
  // absent in records from before projects: "default".
  std::optional<std::string> project;
  nlohmann::json extra = nlohmann::json::object();

  bool empty() const;  // no key at all
  nlohmann::json to_json() const;
  static Result<TenantSpec> from_json(const nlohmann::json& j);
  bool operator==(const TenantSpec&) const = default;
};

// The agent's identity, as enrollment and renewal record it (agents
// module): never what a connected agent says of itself now, which is the
// feed's (feed::AgentPresence).
struct AgentPresence {
  std::optional<std::string> agent_id;
  // The certificates that may connect as the agent: the one it enrolled
  // or renewed with and its successor; emptied by a revocation.
  std::optional<std::vector<std::string>> cert_serials;
  std::optional<std::string> certificate_expires_at;
  std::optional<std::string> enrolled_at;
  std::optional<std::string> hostname, version;
  std::optional<std::string> revoked_at;
  nlohmann::json extra = nlohmann::json::object();

  bool empty() const;
  nlohmann::json to_json() const;
  static Result<AgentPresence> from_json(const nlohmann::json& j);
  bool operator==(const AgentPresence&) const = default;
};

// status.kube: the VM's objects as create and delete left them.
struct KubeStatus {
  std::optional<std::string> state;  // creating | created | failed
  std::optional<std::string> ns;     // "namespace"
  std::optional<std::string> started_at, created_at;
  std::optional<std::string> gpu_resource;
  std::optional<std::vector<std::string>> objects;  // "Kind/namespace/name" refs
  std::optional<std::string> bootstrap_token_id;
  std::optional<std::string> error;
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json to_json() const;
  bool operator==(const KubeStatus&) const = default;
};

// A diagnosis as an agent sent it: status.diagnoses by code (the diagnosis
// event, less its id) and a plan step's own (code, summary, fix, details).
struct DiagnosisRecord {
  std::optional<std::string> kind;  // "diagnosis" (the event's)
  std::optional<std::string> code, summary, fix;
  std::optional<nlohmann::json> details;  // free-form, bounded by the agent's reader
  std::optional<std::string> time;        // the agent's clock (the event's)
  std::optional<bool> truncated;          // the event's
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json to_json() const;
  bool operator==(const DiagnosisRecord&) const = default;
};

// status.plan.steps[id]: what the step's progress events said, latest
// field by field (agents/projection.cpp).
struct PlanStep {
  std::optional<std::string> state;
  std::optional<std::string> started_at;  // the agent's clock, when it began
  std::optional<std::string> time;        // the agent's clock, its latest event
  std::optional<bool> truncated;
  std::optional<std::int64_t> attempt;
  std::optional<std::string> message;
  std::optional<std::string> output_tail;  // the last bytes only
  std::optional<DiagnosisRecord> diagnosis;
  std::optional<double> percent;
  std::optional<std::uint64_t> completed, total, allocatable, expected;
  std::optional<nlohmann::json> ranges;  // the guest cluster's ranges as an rke2 step chose them
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json to_json() const;
  bool operator==(const PlanStep&) const = default;
};

// status.plan: the plan events' latest fields, and the steps.
struct PlanStatus {
  std::optional<std::string> hash, tier, state, message, failed_step;
  std::optional<std::uint64_t> steps_total, steps_done;
  std::optional<std::string> time;
  std::optional<bool> truncated;
  std::optional<std::map<std::string, PlanStep>> steps;
  nlohmann::json extra = nlohmann::json::object();

  // Without the steps: where the plan is, for an event's announcement.
  nlohmann::json to_json(bool with_steps = true) const;
  bool operator==(const PlanStatus&) const = default;
};

// status.gpu_faults[key]: a card fault, as the coordinator first saw it
// (agents/card_faults.hpp).
struct GpuFaultRecord {
  std::optional<int> gpu;
  std::optional<std::string> uuid, serial, name, pci_bus_id;
  std::optional<std::string> kind;  // lost | xid | row_remap_failure
  std::optional<int> xid;           // kind xid
  std::optional<std::string> code, summary, fix;
  std::optional<std::string> first_seen;
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json to_json() const;
  bool operator==(const GpuFaultRecord&) const = default;
};

// status.restart: the journal of the latest restart (tenants module),
// written before it starts and again when it ends.
struct RestartJournal {
  std::optional<std::string> state;  // restarting | done | failed
  std::optional<std::string> requested_at, finished_at;
  std::optional<std::string> from_instance;
  std::optional<std::vector<std::string>> avoid_gpus, gpus_before, gpus_after;
  std::optional<std::string> note, error;
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json to_json() const;
  bool operator==(const RestartJournal&) const = default;
};

// status.maintenance: the journal of a host drain as it concerns this
// tenant (tenants/maintenance.hpp), written before each act. States, in
// order: noticed (the notice is out, the VM runs until the deadline),
// stopping (the guest was asked to shut down), drained (the VM is off; the
// disk, plan journal and identity stay), starting (undrain or --move asked
// for it again), back (it runs and its agent is connected again). A drain
// undone before its deadline ends cancelled.
struct MaintenanceJournal {
  std::optional<std::string> state;
  std::optional<std::string> node, notice_id;
  std::optional<std::string> noticed_at, deadline;  // RFC 3339
  std::optional<bool> move;                         // --move: start it again elsewhere
  std::optional<std::string> notice_sent_at;        // delivered to a connected agent
  std::optional<std::string> guest_received_at;     // the agent's own event said so
  std::optional<std::string> stop_requested_at, stopped_at;
  std::optional<std::string> start_requested_at, back_at, cancelled_at;
  std::optional<std::string> instance_before;  // what ran before the stop
  std::optional<std::string> node_after;       // where it runs again
  std::optional<std::string> note, error;
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json to_json() const;
  bool operator==(const MaintenanceJournal&) const = default;
};

// status.tier_plan: the plan the tenant runs ({hash, plan}), kept from its
// create or its last tier upgrade, so a catalog that changed changes
// nothing in the guest until `factory tenant upgrade` (tenants/tier_upgrade.cpp,
// docs/tier-upgrades.md). The view shows its hash only.
struct TierPlan {
  std::optional<std::string> hash;
  std::optional<nlohmann::json> plan;
  std::optional<std::string> pinned_at;
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json to_json() const;
  bool operator==(const TierPlan&) const = default;
};

// status.tier_upgrade: the journal of the latest tier upgrade, written
// before the order goes to the agent and as its reports come. States:
// requested (journaled and announced, the order sent or owed to the
// agent), running (the agent took it), rolling_back, and the ends:
// succeeded (tier_plan is the new plan), rolled_back (back on the previous
// pins, the tenant ready), failed (the tenant degraded; `tenant retry`),
// refused (the agent changed nothing).
struct TierUpgradeJournal {
  std::optional<std::string> id, state;
  std::optional<std::string> requested_at, started_at, finished_at;
  std::optional<std::string> from_hash, to_hash;
  std::optional<nlohmann::json> to_plan;          // the plan it moves to (not in the view)
  std::optional<std::vector<std::string>> steps;  // the steps it runs
  std::optional<nlohmann::json> pins;             // [{what, from, to}]
  std::optional<std::string> failed_step, message;
  std::optional<DiagnosisRecord> diagnosis;
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json to_json() const;
  bool operator==(const TierUpgradeJournal&) const = default;
};

// status.agent_upgrade: the journal of the latest agent self-update ordered
// for this tenant (tenants/agent_rollout.hpp, docs/agent-rollouts.md),
// written before each act. States: pending (selected by a rollout, not yet
// ordered), sent (the order is out: sent to the agent now if connected, and
// at each of its connections while it runs another version), installing
// (the agent took the order), then one of upgraded, rolled_back, refused
// (the agent's own words, in reason), failed (no outcome within
// confirm_within_s + 5 minutes), held (not ordered: another tenant of the
// rollout failed first) or cancelled. The order's fields are kept whole, so
// the order sent again after a restart is the same order.
struct AgentUpgradeJournal {
  std::optional<std::string> state;
  std::optional<std::string> upgrade_id;  // this tenant's order
  std::optional<std::string> rollout_id;  // the rollout it is part of
  std::optional<int> order;               // its place in the rollout, from 0
  std::optional<int> max_unavailable;     // the rollout's
  std::optional<std::string> from_version, to_version, to_sha256;
  std::optional<std::uint64_t> size;
  std::optional<std::string> url;
  std::optional<int> confirm_within_s;
  std::optional<std::string> requested_at, sent_at, installing_at, done_at;  // RFC 3339
  std::optional<std::string> reason;     // the agent's (sanitized) or the coordinator's
  std::optional<std::string> announced;  // the last state announced on the feed
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json to_json() const;
  bool operator==(const AgentUpgradeJournal&) const = default;
};

// What the agent's events and the coordinator's actions made of the
// tenant. Its JSON is the view's top level (feed::TenantView).
struct TenantStatus {
  std::optional<KubeStatus> kube;
  std::optional<PlanStatus> plan;
  std::optional<std::map<std::string, DiagnosisRecord>> diagnoses;
  std::optional<std::map<std::string, GpuFaultRecord>> gpu_faults;
  std::optional<RestartJournal> restart;
  std::optional<MaintenanceJournal> maintenance;
  std::optional<TierPlan> tier_plan;
  std::optional<TierUpgradeJournal> tier_upgrade;
  std::optional<AgentUpgradeJournal> agent_upgrade;
  // The GPU time its VM ran, as the provider saw it (gpu_usage.hpp).
  std::optional<GpuUsage> gpu_usage;
  nlohmann::json extra = nlohmann::json::object();

  bool empty() const;
  nlohmann::json to_json() const;
  static Result<TenantStatus> from_json(const nlohmann::json& j);
  bool operator==(const TenantStatus&) const = default;
};

// A named key of a model endpoint (issue 28, `factory tenant keys`): its
// SHA-256 only (the key is shown once, at create, and kept nowhere), and
// its optional limits per minute.
struct EndpointKey {
  std::optional<std::string> name;
  std::optional<std::string> sha256;
  std::optional<std::string> created_at;
  std::optional<std::int64_t> rpm;  // requests per minute
  std::optional<std::int64_t> tpm;  // tokens (prompt + completion) per minute
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json to_json() const;
  bool operator==(const EndpointKey&) const = default;
};

// A tier with a model endpoint. The hash of its API key only: the key
// itself lives in the provider's Secret.
struct EndpointState {
  std::optional<std::string> key_sha256;
  std::optional<int> port;  // the guest's port
  std::optional<std::string> host;
  std::optional<std::string> rotated_at;
  std::optional<std::string> url;  // once the Service has its node port
  // The named keys beside the one above (which is the key named
  // "default"); absent until the first is created.
  std::optional<std::vector<EndpointKey>> keys;
  // What the keys used, from the agent's endpoint_usage events.
  std::optional<EndpointUsage> usage;
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json to_json() const;
  static Result<EndpointState> from_json(const nlohmann::json& j);
  bool operator==(const EndpointState&) const = default;
};

struct TenantRecord {
  std::string name;
  std::string tier;  // catalog item; empty for a token-only tenant
  // creating | pending | enrolled | provisioning | ready | failed | deleting
  std::string phase = "pending";
  std::string created_at;
  TenantSpec spec;
  AgentPresence agent;
  TenantStatus status;
  std::optional<EndpointState> endpoint;
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json to_json() const;
  // An error names the field whose value is not of its type.
  static Result<TenantRecord> from_json(const nlohmann::json& j);
  bool operator==(const TenantRecord&) const = default;
};

}  // namespace factory::store
