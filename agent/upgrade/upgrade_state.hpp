#pragma once
// The record of the agent's self-update (docs/agent-upgrades.md, "In the
// guest"): one JSON file, <state_dir>/upgrade/state.json (0600, written
// atomically and fsync'd), read and written by three programs that never run
// at the same moment by design but may by accident: the agent that takes an
// order, the new binary that confirms it, and the guard that systemd runs
// from the previous binary around every start and stop and at the deadline.
// Every read-modify-write holds UpgradeStateLock (flock on state.json.lock),
// so a confirmation and the deadline's rollback cannot both win.
//
// The file is the guard's whole world: it needs no config, no network and no
// coordinator, so what it acts on (binary_path, the slots, the deadline) is
// all here.
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "common/durations.hpp"
#include "common/error.hpp"

namespace factory::agent {

// The unit's ExecStart (deploy/factory-agent.service, cloud-init's
// install-agent.sh): where every guest has its agent.
inline constexpr const char* kDefaultAgentBinaryPath = "/usr/local/bin/factory-agent";
inline constexpr const char* kAgentUnit = "factory-agent.service";
// The transient timer (and its service) that runs the guard at the deadline.
inline constexpr const char* kDeadlineUnit = "factory-agent-upgrade-deadline";
inline constexpr const char* kUpgradeDropIn =
    "/etc/systemd/system/factory-agent.service.d/50-factory-upgrade.conf";
// Starts the new binary gets before the guard puts the previous one back.
inline constexpr int kMaxCandidateStarts = 3;

// Where the upgrade keeps its files, under the agent's state directory.
struct UpgradeLayout {
  std::filesystem::path dir;  // <state_dir>/upgrade

  static UpgradeLayout in(const std::filesystem::path& state_dir) {
    return {state_dir / "upgrade"};
  }
  std::filesystem::path state_file() const { return dir / "state.json"; }
  // The slots: factory-agent-<first 16 hex digits of its SHA-256>, 0755.
  std::filesystem::path bin_dir() const { return dir / "bin"; }
};

enum class UpgradePhase { installing, refused, trying, confirmed, rolled_back };
const char* phase_name(UpgradePhase p);

// What systemd told ExecStopPost about the last stop of the unit.
struct ServiceExit {
  std::string service_result;  // $SERVICE_RESULT: success, exit-code, signal, core-dump, ...
  std::string exit_code;       // $EXIT_CODE: exited, killed, dumped
  std::string exit_status;     // $EXIT_STATUS: 1, TERM, SEGV, ...
  bool operator==(const ServiceExit&) const = default;
};

struct UpgradeState {
  std::string upgrade_id;
  std::string from_version, to_version;
  std::string from_sha256, to_sha256;
  // As the guest sees it (the unit's ExecStart); a guard with --root reads it
  // under that root.
  std::string binary_path = kDefaultAgentBinaryPath;
  std::string stable;     // slot of the previous binary: what a rollback runs
  std::string candidate;  // slot of the new one
  UpgradePhase phase = UpgradePhase::installing;
  std::optional<Clock::time_point> deadline;  // trying: confirm before this
  int confirm_within_s = 0;
  int starts = 0;  // starts of the unit while trying (ExecStartPre)
  std::optional<ServiceExit> last_exit;
  std::string reason;     // refused, rolled_back: why, in one line
  bool reported = false;  // the phase's final event is in the spool
  // Keys this build does not know (a newer binary wrote them): kept and
  // written back, so the older guard never strips what the newer one needs.
  nlohmann::json extra = nlohmann::json::object();

  nlohmann::json to_json() const;
  // Every field checked (a version is a version, a slot an absolute path, ...):
  // invalid_argument naming the field.
  static Result<UpgradeState> from_json(const nlohmann::json& j);
};

// nullopt when there is no file (no upgrade ever ordered).
Result<std::optional<UpgradeState>> load_upgrade_state(const std::filesystem::path& file);
Status save_upgrade_state(const std::filesystem::path& file, const UpgradeState& s);

// An exclusive flock on <state file>.lock, held while it lives; waits for
// the holder (a guard or the agent, each holding it for milliseconds).
class UpgradeStateLock {
 public:
  static Result<UpgradeStateLock> acquire(const std::filesystem::path& state_file);
  ~UpgradeStateLock();
  UpgradeStateLock(UpgradeStateLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  UpgradeStateLock& operator=(UpgradeStateLock&&) = delete;
  UpgradeStateLock(const UpgradeStateLock&) = delete;

 private:
  explicit UpgradeStateLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace factory::agent
