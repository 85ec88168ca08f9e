#pragma once
// Tenants as a coordinator service: create / list / show / delete / retry,
// behind the admin API (install_routes) that `factory tenant ...` calls, and
// the plan each tenant's agent is sent.
//
// Create is idempotent and recorded before it acts. In order:
//   1. validate the request, resolve the tier's VM shape (request.hpp);
//   2. provider preflight, read-only: reachable, names not someone else's,
//      node port free, GPUs available (picks the GPU resource);
//   3. store the record: phase "creating", spec = the resolved request;
//   4. unless the VM's user-data already exists (a re-run): a fresh one-time
//      bootstrap token and the rendered user-data (generated password);
//   5. provider provision: Namespace if missing, Secret, VirtualMachine,
//      Service;
//   6. phase "pending" (the agent has not enrolled yet).
// On a failure after 3 the call rolls back what IT created (objects, token)
// and drops the record it created. When the rollback itself cannot finish
// (the API went away), or the record existed before this call (a re-run),
// the record stays in phase "failed" with the reason in status.kube.error:
// running `create` again finishes the tenant, `delete` removes it. A
// coordinator that dies mid-create leaves phase "creating", handled alike.
//
// With Tenant objects (tenants.source: kubernetes; `objects` given), the
// admin API's create and delete go through the Tenant as well, so the
// cluster's Tenants stay the one source of truth: create_with_object,
// remove_with_object. The Tenant controller calls create and remove, which
// never touch the Tenant it is reconciling.
//
// Threading: every call here may wait on the cluster, so the routes run on
// the coordinator's worker pool, never an io thread; create, delete and
// retry are serialized among themselves, show runs beside them.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "common/durations.hpp"
#include "common/error.hpp"
#include "contract/catalog.hpp"
#include "contract/cluster_ranges.hpp"
#include "coordinator/api/router.hpp"
#include "coordinator/enroll/tokens.hpp"
#include "coordinator/feed/tenant_view.hpp"
#include "coordinator/store/store.hpp"
#include "coordinator/tenants/agent_binary.hpp"
#include "coordinator/tenants/agent_control.hpp"
#include "coordinator/tenants/agent_rollout.hpp"
#include "coordinator/tenants/cloud_init.hpp"
#include "coordinator/tenants/maintenance.hpp"
#include "coordinator/tenants/request.hpp"
#include "coordinator/tenants/tenant_objects.hpp"
#include "coordinator/tenants/usage_meter.hpp"
#include "coordinator/tenants/usage_report.hpp"
#include "coordinator/tenants/vm_provider.hpp"

namespace factory::tenants {

struct TenantServiceOptions {
  std::string default_namespace = "tenants";
  // Bootstrap tokens written into user-data: the VM must import its image,
  // boot and enroll within this.
  std::chrono::seconds token_ttl{std::chrono::hours(24)};
  // What every tenant's user-data tells its guest (cloud_init.hpp):
  std::string coordinator_url;   // the wss:// URL the agent dials (external_url)
  std::string agent_binary_url;  // where it downloads the agent (and an upgrade, by hash)
  // Without an AgentBinary in the deps: the agent's hash ("" when there is
  // no binary to serve) and the file, for the message when it is missing.
  std::string agent_binary_sha256;
  std::string agent_binary_path;
  // How long past an upgrade order's confirm_within_s the coordinator
  // waits for the agent's outcome before calling it failed.
  std::chrono::seconds upgrade_grace{std::chrono::minutes(5)};
  std::string ca_pem;  // the coordinator CA the agent pins
  // A guest cluster's ranges (tiers with an rke2 step): what the host's API
  // does not show that they must avoid (guest_ranges.avoid in the config),
  // and where they are picked (cluster_ranges.hpp).
  std::vector<ranges::Fact> guest_ranges_avoid;
  ranges::Pool guest_ranges_pool;
  // Model endpoints (tiers with an endpoint section): the CA their
  // certificates chain to (what callers trust), and the host in their URLs
  // and certificates (endpoints.host, or external_url's host).
  std::string endpoint_ca_pem;
  std::string endpoint_host;
  // GPU usage (docs/usage.md): how often the leader looks at each tenant's
  // VM, and what is written when (usage_meter.hpp).
  std::chrono::seconds usage_every{15};
  UsageMeterOptions usage;
  // Per-project limits on the GPUs tenants hold (docs/usage.md): project ->
  // card model -> GPUs. A project not named, or a model not named, has none.
  std::map<std::string, std::map<std::string, int>> project_gpu_quotas;
};

// What the service works with, all owned by the server and outliving it.
struct TenantServiceDeps {
  store::Store& store;
  enroll::Tokens& tokens;
  const feed::TenantView& view;  // the record as the status feed shows it
  AgentControl& agents;
  // Puts an `action` event for the tenant on the status feed (never waits):
  // every action on a tenant is announced before it acts, and its end too.
  std::function<void(const std::string& tenant, const nlohmann::json& action)> announce;
  // The agent binary served (agent_binary.hpp): new tenants' hash, and what
  // upgrades install. Null: opts.agent_binary_sha256, and no upgrades.
  AgentBinary* agent_binary = nullptr;
  // An agent upgrade ended, by result (factory_agent_upgrades_total).
  std::function<void(const std::string& result)> count_upgrade;
};

struct CreateOutcome {
  bool created = false;           // false: it existed complete already, nothing changed
  std::vector<VmObject> objects;  // what this call created
  std::string password;           // set when this call wrote the user-data
  std::string api_key;            // set when this call made the endpoint's API key
  std::string note;               // e.g. why no password is shown
  std::string tenant_object;      // "ns/name" of the Tenant create_with_object wrote
};

class TenantService {
 public:
  // objects: where the admin API keeps its Tenants (tenants.source:
  // kubernetes); null when the coordinator's store is the truth.
  TenantService(TenantServiceDeps deps, catalog::Catalog catalog,
                std::unique_ptr<VmProvider> provider, TenantServiceOptions opts,
                std::unique_ptr<TenantObjects> objects = nullptr);
  ~TenantService();

  // POST /v1/tenants, GET/DELETE /v1/tenants/{name}, POST /v1/tenants/{name}/retry.
  // (GET /v1/tenants, the list, is the status feed's.)
  void install_routes(coordinator::ApiRouter& router);

  Result<CreateOutcome> create(const TenantRequest& req);
  // POST /v1/tenants. With Tenant objects: the request's Tenant written
  // first (a Tenant asking the same is fine; one asking something else is
  // refused, already_exists, saying to edit or delete it with kubectl), then
  // create, all under the changes lock, so the controller's create of that
  // Tenant waits and then finds the tenant complete. A create that fails and
  // leaves no record deletes the Tenant it wrote: a refused create leaves
  // nothing for the controller to retry. Without: create.
  Result<CreateOutcome> create_with_object(const TenantRequest& req);
  // Every object, the agent's certificate and unused tokens, the record.
  // ns_hint: where to look when there is no record ("" = the default).
  Result<nlohmann::json> remove(const std::string& name, const std::string& ns_hint);
  // DELETE /v1/tenants/{name}. With Tenant objects: the Tenant's deletion
  // asked first (the controller's finalizer holds it, so a coordinator that
  // dies half-way leaves a Tenant being deleted, which the controller
  // finishes, never a live Tenant without its tenant), then remove, then
  // the finalizer taken off so the Tenant goes. Its answer is remove's plus
  // "tenant_object": {"ref", "found", "finalizer_removed"}. Without: remove.
  Result<nlohmann::json> remove_with_object(const std::string& name, const std::string& ns_hint);
  // The record as the status feed shows it, plus the VM as the provider sees
  // it now ("vm") and the plan's steps in plan order ("plan_steps").
  Result<nlohmann::json> show(const std::string& name);
  // A model endpoint's URL, API key and CA; with rotate, a new key first:
  // stored in the provider's Secret, its hash recorded and sent to the
  // connected agent, whose proxy refuses the old key from then on.
  Result<nlohmann::json> credentials(const std::string& name, bool rotate);
  // Asks the tenant's agent to re-run its failed plan (from `step` if set).
  Result<nlohmann::json> retry(const std::string& name, const std::string& step);
  // Stops the tenant's VM and starts it again on cards that are healthy now
  // (VmProvider::restart), keeping its disk and identity: the fix for a
  // tenant on a faulted card. Journaled in the record (status.restart:
  // state restarting, the instance it replaces, the cards to avoid) and
  // announced on the feed before the provider acts; a coordinator killed
  // half-way finishes it at its next start (resume_actions). dry_run: what
  // would happen, nothing changed, nothing announced.
  Result<nlohmann::json> restart(const std::string& name, bool dry_run);
  // How the provider's objects of a created tenant differ from what its
  // create made (VmProvider::drift): one line each, empty when they do not.
  // Reads the cluster; a tenant not (fully) created has no drift.
  Result<std::vector<std::string>> drift(const std::string& name);
  // Puts a created tenant's objects back as its create made them: what is
  // missing made again (a missing user-data Secret with a new one-time
  // token; a missing API key Secret by a rotation), what was edited
  // applied again. The record, the agent's identity and the disk stay.
  Result<nlohmann::json> repair(const std::string& name);
  // Finishes the restarts a killed coordinator left journaled. Waits on the
  // provider: the coordinator runs it on a worker once it serves.
  void resume_actions();

  // Host maintenance (maintenance.hpp). POST /v1/hosts/{node}/drain: the
  // impact (dry_run), or the tenants journaled, the node cordoned and the
  // notices out; the rest is the maintenance thread's.
  Result<HostMaintenance> drain(const DrainRequest& req);
  // POST /v1/hosts/{node}/undrain: notices withdrawn, stopped tenants
  // journaled to start, the node uncordoned; the starts are the thread's.
  Result<HostMaintenance> undrain(const UndrainRequest& req);
  // GET /v1/hosts/{node}/maintenance: where each tenant of the node is.
  Result<HostMaintenance> maintenance(const std::string& node);
  // Agent self-update (agent_rollout.hpp). POST /v1/agents/upgrade: the
  // plan (dry_run), or every selected tenant journaled pending and
  // announced; the orders are rollout_pass()'s.
  Result<AgentRolloutView> upgrade_agents(const UpgradeRequest& req);
  // GET /v1/agents/upgrade: the latest rollout, tenant by tenant.
  Result<AgentRolloutView> agent_rollout();
  // One pass over the upgrade journals (the leader's maintenance thread):
  // outcomes announced, orders sent within max_unavailable, the late ones
  // failed, the rest of a rollout that went wrong held.
  void rollout_pass();

  // One look at every tenant's VM, folded into its GPU usage (the leader's
  // maintenance thread; at most every opts.usage_every).
  void usage_pass();
  // GET /v1/usage: GPU time and endpoint use per tenant over a window, the
  // deleted tenants' included (usage_report.hpp), open intervals to the
  // latest look (UsageMeter::catch_up). Reads the store's archive
  // from the disk: a worker's call.
  Result<nlohmann::json> usage_report(const UsageQuery& q);
  // What the tenant's agent is owed at each connection: the notice of a
  // drain it has not confirmed, the upgrade order it has not carried out
  // (AgentService::set_pending_commands).
  std::vector<nlohmann::json> pending_commands(const store::TenantRecord& t) const;
  // One pass over every journal (the notices again to agents that connected,
  // the stops at their deadline, the starts), waiting on the provider.
  void maintenance_pass();
  // The thread that runs maintenance_pass() every `every` while active (the
  // leader only); stopped by stop_maintenance() or the destructor.
  void start_maintenance(std::chrono::milliseconds every);
  void set_maintenance_active(bool active);
  void stop_maintenance();

  // What the server gives the agents module as the tenants' plans, sent at
  // each hello: {"hash", "plan"} of the plan the tenant runs (its record's
  // status.tier_plan, kept from then on when it had none), not the
  // catalog's of the day; none while a tier upgrade is open (the agent's
  // journal holds which plan runs) or for a record from before plans were
  // kept whose agent reported another plan (tier_upgrade.cpp).
  std::optional<nlohmann::json> plan_for(const store::TenantRecord& t) const;
  // The step ids an agent's progress may name: the running plan's and a
  // tier upgrade's new plan's.
  std::optional<std::vector<std::string>> plan_step_ids(const store::TenantRecord& t) const;
  // The tier upgrade order the tenant's agent is owed at its connection
  // (journaled, not yet taken by the agent), as a command body.
  std::optional<nlohmann::json> tier_upgrade_owed(const store::TenantRecord& t) const;
  // POST /v1/tenants/{name}/tier-upgrade: the steps and pins that differ
  // between the plan the tenant runs and its tier's in the catalog; unless
  // dry_run, the upgrade journaled (status.tier_upgrade), announced (an
  // `action` event, tier_upgrade, requested) and sent to the agent. Refused,
  // saying why, when the tenant is not ready, an upgrade is open, the agent
  // is not connected or does not know tier upgrades.
  Result<nlohmann::json> tier_upgrade(const std::string& name, bool dry_run);

  const catalog::Catalog& catalog() const { return catalog_; }

 private:
  // The user-data of tenant `name` but its token and password (placeholders).
  CloudInitParams user_data_params(const std::string& name,
                                   const std::vector<std::string>& ssh_keys, bool login) const;
  Status rollback(store::TenantRecord& rec, bool record_is_new, const std::string& token_id,
                  const std::vector<VmObject>& created, const Error& cause);
  nlohmann::json plan_steps(const store::TenantRecord& t) const;
  // The tier's plan in the catalog now, with the tenant's own models and
  // guest ranges: {"hash", "plan"}.
  std::optional<nlohmann::json> catalog_plan_for(const store::TenantRecord& t) const;
  // The plan the tenant runs: status.tier_plan, or for a record from before
  // plans were kept the catalog's when the agent reported no other.
  std::optional<nlohmann::json> running_plan(const store::TenantRecord& t) const;
  // `tenant show`'s tier_pins: the running plan's hash and pins, the
  // catalog's hash, and what differs (catalog::diff_plans).
  nlohmann::json tier_pins_view(const store::TenantRecord& t) const;
  // The VM of a tenant as it was first resolved (vm_spec_from_stored): a
  // re-run of create builds the same objects even if the catalog changed
  // meanwhile. The default namespace, and the catalog's needs_mig for a
  // record written before it was kept.
  VmSpec stored_vm(const store::TenantRecord& t) const;
  // What a restart of the tenant asks its provider: replace the instance
  // running now; leave the host cards it holds when a card fault was
  // recorded on it since it last started (every card, where the provider
  // names them, as a guest's report cannot say which host card it is when
  // there are several).
  RestartRequest restart_request(const store::TenantRecord& t, const VmObservation& obs) const;
  // The restart journaled in `rec` (status.restart), carried out to its end.
  Result<nlohmann::json> run_restart(store::TenantRecord rec, const VmSpec& vm);
  // What `tenant show` offers for a tenant on a faulted card: the restart,
  // with where it would go, or why none can move it now.
  nlohmann::json restart_offer(const store::TenantRecord& t, const VmObservation& obs);
  // Host maintenance's parts (maintenance.cpp).
  Result<HostMaintenance> host_view(const std::string& node, bool with_mobility);
  std::optional<nlohmann::json> notice_command(const store::TenantRecord& t, bool cancelled) const;
  bool agent_connected(const std::string& tenant) const;
  void announce_maintenance(const std::string& tenant, const char* action, const std::string& state,
                            nlohmann::json extra);
  void send_notice(const std::string& tenant);
  void stop_for_maintenance(const store::TenantRecord& t);
  void start_after_maintenance(const store::TenantRecord& t);
  void wake_maintenance();
  // A provider call of the maintenance that failed is tried again after
  // kRetryAfter, not at every pass (keys: "cordon <node>", "stop <tenant>").
  static constexpr std::chrono::seconds kRetryAfter{15};
  bool retry_due(const std::string& key, Clock::time_point now) const;
  void retry_later(const std::string& key, Clock::time_point now);
  void retry_clear(const std::string& key);
  void record_error(const std::string& tenant, const std::string& error);

  // Agent self-update's parts (agent_rollout.cpp).
  std::optional<nlohmann::json> upgrade_command(const store::TenantRecord& t) const;
  void announce_upgrade(const std::string& tenant, const store::AgentUpgradeJournal& j);
  // Writes the journal's new state (if it still is `from`), then announces it.
  bool move_upgrade(const std::string& tenant, const std::string& from, const std::string& to,
                    const std::string& reason);
  std::string agent_version_of(const store::TenantRecord& t) const;
  std::string agent_binary_sha256() const;

  // https://<endpoint host>:<node port>, "" until the Service has its port.
  std::string endpoint_url(int node_port) const;
  // What `tenant show` says of a model endpoint: its URL and whether it
  // answers an authenticated GET /v1/models now (a call to the guest).
  nlohmann::json endpoint_view(const store::TenantRecord& t, const VmObservation* obs);
  // For a tier with an rke2 step: the host's facts to avoid, the pool,
  // the ranges the agent will get unless the guest's own networks move it
  // ("planned") and whether the catalog fixes them; nullopt for other
  // tiers. Reads the host cluster (a worker thread's call). Refuses a
  // catalog's fixed ranges that clash, naming the clash.
  Result<std::optional<store::GuestRanges>> guest_ranges_for(const catalog::Tier& tier);

  TenantServiceDeps deps_;
  catalog::Catalog catalog_;
  std::unique_ptr<VmProvider> provider_;
  TenantServiceOptions opts_;
  std::unique_ptr<TenantObjects> objects_;  // null: no Tenant objects
  // Changes to tenants run on the worker pool, one at a time: two creates
  // of one name, or a create racing its delete, must not interleave.
  // Recursive: create_with_object holds it across the Tenant's write and
  // create itself (remove_with_object alike).
  std::recursive_mutex changes_mu_;
  // Nodes this process cordoned or uncordoned as the journals asked
  // (guarded by changes_mu_): made again once after each start or new
  // leadership, not at every pass.
  std::set<std::string> cordoned_, uncordoned_;
  std::map<std::string, Clock::time_point> retry_at_;
  // The tenants whose journal is under way, as the last full scan found
  // them (guarded by changes_mu_), and when that was.
  static constexpr std::chrono::seconds kMaintenanceScanEvery{10};
  std::set<std::string> maint_tenants_;
  Clock::time_point maint_last_scan_{};
  std::atomic<bool> maint_rescan_{true};
  // The tenants whose upgrade journal may still need the pass (guarded by
  // changes_mu_), as the last full scan found them.
  std::set<std::string> upgrade_tenants_;
  Clock::time_point upgrade_last_scan_{};
  std::atomic<bool> upgrade_rescan_{true};
  std::atomic<bool> maint_forget_cordons_{false};
  // GPU usage (usage_meter.hpp): the meter, and when the last pass ran.
  UsageMeter usage_meter_{deps_.store, opts_.usage};
  Clock::time_point usage_last_pass_{};
  // The maintenance thread.
  std::mutex maint_mu_;
  std::condition_variable maint_cv_;
  std::thread maint_thread_;
  std::chrono::milliseconds maint_every_{1000};
  bool maint_active_ = false, maint_stop_ = false, maint_wake_ = false;
};

// HTTP status for an error of the service (400 bad input, 404, 409 state,
// 502 when the cluster or its API failed us, 500 for our own bugs).
int http_status_for(const Error& e);

}  // namespace factory::tenants
