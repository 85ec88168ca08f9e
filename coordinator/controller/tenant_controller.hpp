#pragma once
// The Tenant controller (issue 26): Tenant objects (factory.dev/v1alpha1) in
// the host cluster are the source of truth for tenants when the coordinator
// runs with `tenants.source: kubernetes`, and this reconciles them through
// the same TenantService that `factory tenant create|delete` calls:
//
//   - a Tenant without Factory's finalizer gets it first, so that deleting
//     the Tenant waits for the tenant's removal;
//   - a Tenant with no tenant behind it is created (TenantService::create,
//     idempotent: a create that was cut off is finished, never made twice);
//   - a created tenant whose objects a person edited or deleted (drift) is
//     put back (TenantService::repair), and the Degraded condition says what
//     was changed;
//   - a spec edit that a running tenant cannot take (the VM's shape) is
//     said in the Degraded condition, and nothing is changed;
//   - a Tenant being deleted has its tenant removed (TenantService::remove:
//     every object once, the agent's identity revoked), then its finalizer
//     taken off, so the API server lets it go;
//   - the status (phase, conditions, step, GPU, endpoint URL,
//     observedGeneration) is written only when it differs from what the
//     object holds: a pass over an unchanged tenant writes nothing.
// Every action on a tenant is announced on the feed before it acts.
//
// Level-based: a watch brings changes at once, and every resync period the
// whole collection is listed and every Tenant reconciled again, which is
// what notices drift, a record that moved on (agent connected, plan done)
// and a change the watch missed.
//
// Only the leader reconciles (kube::LeaderElector; a coordinator without
// leader election is always active). set_active never waits: the elector
// calls it from its own thread, which must renew the Lease on time. The
// work runs on the controller's own thread: every step of it waits on the
// cluster.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "coordinator/feed/tenant_view.hpp"
#include "coordinator/kube/client.hpp"
#include "coordinator/store/store.hpp"
#include "coordinator/tenants/service.hpp"
#include "coordinator/tenants/tenant_objects.hpp"
#include "coordinator/tenants/tenant_resource.hpp"

namespace factory::controller {

// The finalizer that holds a Tenant until its tenant is removed.
using tenants::kTenantFinalizer;

struct TenantControllerOptions {
  std::string ns = "tenants";  // where Tenants live ("" = every namespace)
  // Every Tenant reconciled again at least this often (drift is noticed
  // within it, and within the 60 s).
  std::chrono::seconds resync{10};
  // After a failed call to the API server: wait, doubling, up to 30 s.
  std::chrono::milliseconds retry_min{std::chrono::milliseconds(500)};
};

struct TenantControllerStats {
  std::uint64_t passes = 0;      // resyncs begun
  std::uint64_t reconciled = 0;  // Tenants reconciled
  std::uint64_t writes = 0;      // writes to Tenants (finalizer, status)
  std::uint64_t creates = 0, removes = 0, repairs = 0;
};

class TenantController {
 public:
  using Announce = std::function<void(const std::string& tenant, const nlohmann::json& action)>;

  TenantController(kube::KubeClient client, tenants::TenantService& service,
                   const store::Store& store, const feed::TenantView& view, Announce announce,
                   TenantControllerOptions opts = {});
  ~TenantController();  // stop()
  TenantController(const TenantController&) = delete;
  TenantController& operator=(const TenantController&) = delete;

  // Starts the thread (idle until active).
  void start();
  // Leading or not. Never waits; a pass under way stops at the next Tenant.
  void set_active(bool active);
  // Ends the thread and waits for it (at most the reconcile under way and
  // one watch line). Not on an io thread.
  void stop();

  TenantControllerStats stats() const;

 private:
  void run();
  bool should_run() const { return active_ && !stopping_; }
  // One pass: list, reconcile each; returns the list's resourceVersion
  // ("" when the list failed).
  std::string resync();
  void reconcile(nlohmann::json tenant);
  // Deletion: the tenant removed, then the finalizer off.
  void finalize(const nlohmann::json& tenant);
  // Writes `obj` with `finalizers`, conditional on its resourceVersion.
  Result<nlohmann::json> put_finalizers(const nlohmann::json& obj,
                                        const nlohmann::json& finalizers);
  void write_status(const nlohmann::json& obj, const nlohmann::json& status);
  // The SSH keys a Tenant names by secretKeyRef, read from its namespace.
  Result<std::vector<std::string>> referenced_keys(const std::string& ns,
                                                   const std::vector<tenants::SecretKeyRef>& refs);
  void announce(const std::string& tenant, const std::string& action, const std::string& state,
                nlohmann::json extra = nlohmann::json::object());
  void wait_for(std::chrono::milliseconds d);

  kube::KubeClient client_;
  tenants::TenantService& service_;
  const store::Store& store_;
  const feed::TenantView& view_;
  Announce announce_;
  TenantControllerOptions opts_;

  std::atomic<bool> active_{false};
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread thread_;
  // A create that failed, said in the Tenant's status until one works, and
  // tried again after a growing pause (10 s, doubling, at most 5 min)
  // rather than at every event, unless the spec changed (a new generation).
  struct CreateFailure {
    std::string error;
    std::int64_t generation = 0;
    int attempts = 0;
    std::chrono::steady_clock::time_point next_try;
  };
  std::map<std::string, CreateFailure> create_failures_;
  mutable std::mutex stats_mu_;
  TenantControllerStats stats_;
};

}  // namespace factory::controller
