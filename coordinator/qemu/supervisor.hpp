#pragma once
// Who keeps a tenant's QEMU running. Where systemd runs (it is PID 1), the VM
// is the transient unit factory-vm-<tenant> (`systemd-run`, Restart=always):
// it outlives the coordinator, systemd restarts it, `systemctl status` shows
// it. Elsewhere (containers, CI machines) it is a child of the coordinator in
// a session of its own, so it outlives the coordinator too, and the
// provider's monitor starts it again when it ends.
//
// Either way the VM is found again by its pidfile (QEMU writes it and holds
// a lock on it while it runs, so a second QEMU of the same VM refuses to
// start) and reached through its QMP socket.
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "coordinator/qemu/launch.hpp"

namespace factory::qemu {

struct ProcState {
  bool running = false;
  int pid = 0;
  std::string last_exit;     // how it ended last, when known ("exited 0", "killed by signal 9")
  int restarts = 0;          // the supervisor's own count (systemd's NRestarts); 0 for child
  bool unit_loaded = false;  // systemd: the unit exists (also while it waits to restart)
};

// The QEMU of this pidfile, if one runs: the pid in the file is alive, not a
// zombie, and its command line names this pidfile (a reused pid does not).
int running_qemu_pid(const std::string& pidfile);

// When the process started, by the kernel's account (its start time in
// /proc/<pid>/stat after the boot time of /proc/stat), in unix seconds; 0
// when it cannot be read. What GPU usage counts a QEMU's interval from:
// the host's clock, not the guest's.
std::int64_t process_started_unix(int pid);

class Supervisor {
 public:
  virtual ~Supervisor() = default;
  virtual std::string kind() const = 0;  // "systemd" or "child"
  // Whether it restarts an ended VM by itself (the monitor then only starts
  // a VM whose unit is gone, e.g. after the host rebooted).
  virtual bool restarts_itself() const = 0;
  // Starts the VM's process; the caller checked that it does not run.
  virtual Status start(const Launch& l, const std::vector<std::string>& qemu) = 0;
  virtual ProcState state(const Launch& l) = 0;
  // Ends the VM and waits until it is gone: QMP `quit`, then SIGTERM, then
  // SIGKILL once `grace` has passed.
  virtual Status stop(const Launch& l, std::chrono::milliseconds grace) = 0;
};

// "systemd" when systemd is the init system (/run/systemd/system exists, as
// sd_booted() decides) and systemd-run is on PATH, else "child". mode:
// qemu.supervisor (auto | systemd | child).
Result<std::string> choose_supervisor(const std::string& mode);
std::unique_ptr<Supervisor> make_supervisor(const std::string& kind);

}  // namespace factory::qemu
