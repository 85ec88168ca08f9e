#pragma once
// The one seam between tenant logic (store record, tokens, user-data,
// revocation: service.hpp) and where VMs actually run: check, create,
// observe and delete a VM with this shape, these GPUs and this user-data.
// Two providers, each in its own module and neither known here: KubeVirt in
// the host cluster (coordinator/kubevirt, the default) and plain QEMU
// processes on a single host with the cards passed through by vfio-pci
// (coordinator/qemu, `provider: qemu`).
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "contract/cluster_ranges.hpp"
#include "coordinator/tenants/vm_spec.hpp"

namespace factory::tenants {

// One object the provider made ("Secret", "tenants", "tenant-1-cloud-init";
// for QEMU "QemuDisk", "", "tenant-1").
struct VmObject {
  std::string kind;
  std::string ns;  // empty for cluster-scoped objects
  std::string name;
  std::string ref() const { return ns.empty() ? kind + "/" + name : kind + "/" + ns + "/" + name; }
};

// What the provider sees of a tenant's VM now: what every provider answers,
// and what only this one knows in its own type, shown beside it.
struct VmObservation {
  bool exists = false;  // the VM object
  std::string status;   // KubeVirt's printableStatus: Starting, Running, ErrorUnschedulable
  std::string phase;    // the VMI's phase: Pending, Scheduling, Scheduled, Running ("" none)
  std::string ip, node;
  std::string reason;          // why it is not running, when the provider says
  int ssh_node_port = 0;       // where `ssh -p` reaches it on the node
  int endpoint_node_port = 0;  // where the model endpoint listens on the node (its tier has one)
  std::string provider;        // "kubevirt" or "qemu"
  // The host PCI addresses passed through, where the provider names them
  // (qemu); a restart leaves them when a card fault was recorded.
  std::vector<std::string> gpus;
  // What runs now, to tell one boot from the next: the VMI's uid (KubeVirt),
  // "pid:N" of the QEMU process; "" while nothing runs.
  std::string instance;
  // The provider's own word on when `instance` started running and, once it
  // finished, when it stopped (RFC 3339, the provider's clock; "" when it
  // does not say): KubeVirt's status.phaseTransitionTimestamps of the VMI
  // (Running; Succeeded or Failed), the kernel's start time of the QEMU
  // process. GPU usage is counted from these (docs/usage.md), never from
  // what the guest says.
  std::string running_since, stopped_at;
  // The VM runs with its cards now: the provider says Running.
  bool running() const { return !instance.empty() && (phase == "Running" || phase == "running"); }
  // What only this provider knows (the QEMU provider's process and
  // accelerator), written by its own type's to_json(): tenant logic reads none
  // of it, `tenant show` prints it with the fields above. An object.
  nlohmann::json details = nlohmann::json::object();
  // The fields above, then `details`' keys.
  nlohmann::json to_json() const;
};

// What `factory tenant restart` asks of the provider: stop the VM and start
// it again, on cards that are healthy now, keeping its disk and identity.
struct RestartRequest {
  // The instance the restart is to replace (VmObservation::instance, as the
  // tenant's journal recorded it before acting). When another one runs now,
  // off every card in avoid_gpus, the restart happened already: a restart
  // resumed after a crash never restarts the VM twice.
  std::string from_instance;
  // Host cards (PCI addresses) it must not come back on: those a card fault
  // was recorded on. A quarantined card is never picked anyway.
  std::vector<std::string> avoid_gpus;
  bool dry_run = false;  // say what would happen; change nothing
};

struct RestartOutcome {
  bool restarted = false;  // false: nothing to do (done already), or a dry run
  std::vector<std::string> gpus_before, gpus_after;  // host addresses, where known
  std::string note;                                  // what was done or would be, one line
};

// Whether a tenant's VM could run on another node of the host cluster (a
// drain's --move), and why not: a passed-through GPU cannot live-migrate,
// so a move is a stop and a start elsewhere, which the VM's disk and the
// other nodes' free cards must allow.
struct Mobility {
  bool can_move = false;
  std::string why_not;  // one line when it cannot: "its disk is on node-local storage (...)"
};

// What a stop (a host drain) did.
struct StopOutcome {
  bool stopped = false;  // false: it was off already
  std::string note;      // one line: what was done
};

class VmProvider {
 public:
  virtual ~VmProvider() = default;

  // Read-only checks before anything is recorded or created: the provider
  // answers, no object of the VM's names belongs to someone else, an
  // explicit SSH node port is free, and the GPUs can be supplied. Picks
  // spec.gpu_resource when it is empty ("any allowlisted"). One line on
  // failure, saying why and what to do.
  virtual Status preflight(VmSpec& spec) = 0;

  // Whether the VM's user-data is stored already. A re-run of an
  // interrupted create keeps it: the VM may have read its token already.
  virtual Result<bool> has_user_data(const VmSpec& spec) = 0;

  // Creates what is missing, in order. `userdata` empty: keep the stored
  // one. Every object this call creates is appended to `created` as soon as
  // it exists (also when a later one fails), so the caller can roll back.
  virtual Status provision(const VmSpec& spec, const std::string& userdata,
                           std::vector<VmObject>& created) = 0;

  // Deletes these objects, last first; returns those it could not delete.
  virtual std::vector<std::pair<VmObject, Error>> remove(const std::vector<VmObject>& objects) = 0;

  // Deletes everything the provider holds for the tenant (by its known names
  // in `ns` and by Factory's labels anywhere); returns what it deleted.
  // Nothing found is not an error.
  virtual Result<std::vector<VmObject>> destroy(const std::string& tenant,
                                                const std::string& ns) = 0;

  virtual Result<VmObservation> observe(const std::string& tenant, const std::string& ns) = 0;

  // Drift: how what the provider holds for a tenant that was created
  // differs from what provision() would make of `spec` now, one line each
  // ("Service tenants/t1-ssh is missing", "VirtualMachine tenants/t1:
  // spec.running is false, not absent"). Empty: as it was made. What a
  // person changed by hand is repaired by provisioning again
  // (TenantService::repair). The default knows only observe(): the VM is
  // there or it is not.
  virtual Result<std::vector<std::string>> drift(const VmSpec& spec);

  // What the host's own cluster network uses, for a guest cluster to pick
  // its ranges around (cluster_ranges.hpp). KubeVirt: read from the host
  // cluster's API (coordinator/kubevirt/host_ranges.hpp). A provider with no
  // host cluster has none.
  virtual Result<std::vector<ranges::Fact>> host_ranges() = 0;

  // The tenant's API key (a tier with a model endpoint): "" when none is
  // stored yet. The provider is the only keeper of the key itself.
  virtual Result<std::string> api_key(const VmSpec& spec) = 0;
  // Stores the API key, replacing one stored before (a rotation). What this
  // call creates is appended to `created`, for the caller's rollback.
  virtual Status put_api_key(const VmSpec& spec, const std::string& key,
                             std::vector<VmObject>& created) = 0;

  // Stops the VM and starts it again (RestartRequest). KubeVirt: deletes the
  // VMI, which virt-controller starts again for runStrategy Always; its
  // device plugin allocates the cards again from those it still advertises
  // (a quarantined card is off vfio-pci, so not among them). QEMU: stops the
  // process, picks its cards again (keeping those still good), starts it.
  virtual Result<RestartOutcome> restart(const VmSpec& spec, const RestartRequest& req) = 0;

  // Host maintenance (tenants/maintenance.hpp). The node a VM runs on is
  // VmObservation::node.
  //
  // Cordons (schedulable false) or uncordons a node: no new VM is placed on
  // a cordoned one. KubeVirt: the Node's spec.unschedulable, as `kubectl
  // cordon` sets it. Idempotent.
  virtual Status set_node_schedulable(const std::string& node, bool schedulable) = 0;
  // Whether the tenant's VM could be started on another node now (Mobility).
  virtual Result<Mobility> mobility(const VmSpec& spec) = 0;
  // Stops the VM cleanly and keeps it off (spec.halted is true): the guest
  // is asked to shut down (ACPI), never killed before its grace has passed;
  // its disk, user-data and identity stay. Returns once it is asked; the
  // caller watches observe() until `instance` is empty. Idempotent.
  virtual Result<StopOutcome> stop(const VmSpec& spec) = 0;
  // Lets the stopped VM run again (spec.halted is false). Idempotent:
  // starting a running VM does nothing.
  virtual Status start(const VmSpec& spec) = 0;

  // Where the VM's user-data (and so the ubuntu password) is kept, as the
  // admin would look for it: "Secret tenants/tenant-1-cloud-init".
  virtual std::string user_data_location(const VmSpec& spec) const = 0;
  // Where the tenant's API key is kept, by the name the admin would look for
  // when it is missing: "tenant-1-endpoint-key".
  virtual std::string api_key_location(const VmSpec& spec) const = 0;
};

}  // namespace factory::tenants
