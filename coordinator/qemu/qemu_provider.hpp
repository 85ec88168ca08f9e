#pragma once
// Tenants' VMs as QEMU processes on this host (`provider: qemu`): for
// platform teams with one GPU box and no Kubernetes, and for booting real
// guests in CI. Behind the same seam as KubeVirt (tenants/vm_provider.hpp).
//
// Each VM has a folder <vms_dir>/<tenant>/ (0700): vm.json (what it is: shape,
// SSH port, cards, accelerator; the coordinator's record of the VM), the
// NoCloud seed (user-data, meta-data and seed.iso labelled cidata, 0600: the
// user-data holds the one-time token), disk.qcow2 over the base image,
// and while it runs QEMU's pidfile, QMP socket, console.log and qemu.log.
//
// A VM with a vm.json is meant to run. The monitor thread checks every VM
// each second: one that runs is left alone (after a coordinator restart
// that is how running VMs are found again, never started twice); one that
// ended is started again with a capped backoff (the child supervisor; under
// systemd the unit restarts it and the monitor only re-creates a unit that
// is gone). Delete stops the VM and removes its folder.
//
// Threading: every call may wait (qemu-img, genisoimage, QMP, a VM's stop),
// so TenantService calls them on the worker pool; one mutex keeps them and
// the monitor from acting on a VM at once.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/qemu/accel.hpp"
#include "coordinator/qemu/launch.hpp"
#include "coordinator/qemu/supervisor.hpp"
#include "coordinator/tenants/vm_provider.hpp"

namespace factory::qemu {

struct QemuProviderOptions {
  std::string qemu_binary = "qemu-system-x86_64";
  std::string qemu_img = "qemu-img";
  std::string base_image;  // see load_base_image()
  std::string vms_dir;
  std::string accel = "auto";       // auto | kvm | tcg
  std::string supervisor = "auto";  // auto | systemd | child
  std::string ssh_listen = "127.0.0.1";
  std::string host_root = "/";  // sysfs and /etc for the GPU inventory
  std::chrono::milliseconds monitor_every{1000};
  // The longest wait between two restarts of a VM that keeps ending.
  std::chrono::milliseconds max_backoff{std::chrono::seconds(60)};
  // A drain's stop: how long the guest has to shut down after the ACPI
  // power button before QEMU is ended.
  std::chrono::milliseconds shutdown_grace{std::chrono::seconds(90)};
};

// The VM as vm.json records it.
struct VmRecord {
  std::string tenant, created_at, instance_id;
  int vcpus = 1;
  std::uint64_t memory_mib = 1024;
  std::uint64_t disk_bytes = 0;
  std::string ssh_listen;
  int ssh_port = 0;
  std::string gpu_resource;
  std::vector<std::string> gpus;
  std::string accel, accel_reason;
  nlohmann::json to_json() const;
  static Result<VmRecord> from_json(const nlohmann::json& j);
};

// What only this provider knows of a VM, beside what every provider answers
// (tenants::VmObservation, which carries the cards passed through and the
// instance): tenants shows it as the observation's details.
struct QemuDetails {
  std::string ssh_host;            // the host address the SSH port listens on
  std::string accelerator;         // "kvm" or "tcg"
  std::string accelerator_reason;  // why not KVM
  std::string supervisor;          // "systemd" (its unit) or "child" (the coordinator's)
  int pid = 0;                     // the QEMU process
  int restarts = 0;                // starts after the first (it exited, or the host rebooted)
  // The fields set, as `tenant show` prints them: restarts always, 0 too
  // (for a process the coordinator restarts, none is news).
  nlohmann::json to_json() const;
};

// observe() in this provider's own words.
struct QemuObservation {
  tenants::VmObservation vm;  // its details left empty: observe() fills them from qemu
  QemuDetails qemu;
};

class QemuProvider : public tenants::VmProvider {
 public:
  // Chooses the supervisor (an error when qemu.supervisor asks for systemd
  // where it does not run) and starts the monitor, which adopts or starts
  // the VMs already in vms_dir.
  static Result<std::unique_ptr<QemuProvider>> create(QemuProviderOptions opts);
  ~QemuProvider() override;  // stops the monitor; the VMs go on running

  Status preflight(tenants::VmSpec& spec) override;
  Result<bool> has_user_data(const tenants::VmSpec& spec) override;
  // A model endpoint needs its port forwarded and its key kept; this
  // provider does neither yet, and preflight refuses such tiers.
  Result<std::string> api_key(const tenants::VmSpec& spec) override;
  Status put_api_key(const tenants::VmSpec& spec, const std::string& key,
                     std::vector<tenants::VmObject>& created) override;
  Status provision(const tenants::VmSpec& spec, const std::string& userdata,
                   std::vector<tenants::VmObject>& created) override;
  std::vector<std::pair<tenants::VmObject, Error>> remove(
      const std::vector<tenants::VmObject>& objects) override;
  Result<std::vector<tenants::VmObject>> destroy(const std::string& tenant,
                                                 const std::string& ns) override;
  Result<tenants::VmObservation> observe(const std::string& tenant, const std::string& ns) override;
  // What observe() answers, with the QEMU process's own fields typed.
  Result<QemuObservation> observe_qemu(const std::string& tenant);
  // Stops QEMU, picks the cards again (those it holds that are still good
  // first; never a quarantined one or one in avoid_gpus), records them in
  // vm.json, starts QEMU. The disk, seed and SSH port stay.
  Result<tenants::RestartOutcome> restart(const tenants::VmSpec& spec,
                                          const tenants::RestartRequest& req) override;
  // This host only: cordoned, no VM is created here (a file in vms_dir).
  Status set_node_schedulable(const std::string& node, bool schedulable) override;
  // Never: there is no other node.
  Result<tenants::Mobility> mobility(const tenants::VmSpec& spec) override;
  // Marks the VM halted (the monitor leaves it off), presses the ACPI power
  // button and waits up to shutdown_grace for the guest to end QEMU; then
  // (or at once, when it had ended) the supervisor's stop, so a systemd
  // unit does not start it again. Waits: called on a worker.
  Result<tenants::StopOutcome> stop(const tenants::VmSpec& spec) override;
  // Takes the mark away and starts QEMU; nothing when it runs.
  Status start(const tenants::VmSpec& spec) override;
  // No host cluster: only the user-mode network every guest is put on.
  Result<std::vector<ranges::Fact>> host_ranges() override {
    return std::vector<ranges::Fact>{{"10.0.2.0/24", "QEMU user-mode network (-netdev user)"}};
  }
  std::string user_data_location(const tenants::VmSpec& spec) const override {
    return vm_dir(spec.name) + "/user-data on the coordinator's host";
  }
  // Never named to anyone: api_key() refuses first, as this provider keeps no key.
  std::string api_key_location(const tenants::VmSpec&) const override { return "no key store"; }

  // One pass of the monitor (tests call it to not depend on timing).
  void check_vms();
  std::string supervisor_kind() const { return supervisor_->kind(); }

 private:
  struct Runtime {  // per VM, in memory: the monitor's restart bookkeeping
    int restarts = 0;
    std::chrono::steady_clock::time_point next_start{};
    std::chrono::milliseconds backoff{0};
    std::chrono::steady_clock::time_point started{};
    std::string last_exit;
    bool announced = false;
  };

  explicit QemuProvider(QemuProviderOptions opts);
  std::string vm_dir(const std::string& tenant) const;
  Result<Launch> launch_for(const VmRecord& r) const;
  Result<VmRecord> read_record(const std::string& tenant) const;
  // address -> tenant, and port -> tenant, over every vm.json.
  std::map<std::string, std::string> held_gpus() const;
  std::map<int, std::string> held_ports() const;
  // Probed once, at the first VM this process creates (KVM, else TCG).
  const Accelerator& accelerator(const BaseImage& image, int vcpus);
  // Starts the VM and waits until QEMU answers on QMP (or ended: its log's tail).
  Status start_vm(const VmRecord& r, Runtime& rt);
  Status stop_vm(const std::string& tenant);
  void monitor_loop();

  QemuProviderOptions opts_;
  std::unique_ptr<Supervisor> supervisor_;
  std::mutex mu_;  // VMs' folders and processes; held by each call and each monitor pass
  std::map<std::string, Runtime> runtime_;
  std::once_flag accel_once_;
  Accelerator accel_;
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  std::thread monitor_;
};

}  // namespace factory::qemu
