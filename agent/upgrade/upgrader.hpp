#pragma once
// The agent's self-update (issue 27; docs/agent-upgrades.md, "In the guest"),
// the agent's side of contract/agent_upgrade.hpp:
//
// An order (a command with action "upgrade"), once per upgrade_id (the state
// file says which it has seen, across restarts): the event "installing";
// the binary downloaded from the coordinator (its CA only) and checked
// against the order's size and SHA-256 and its own version mark; kept in a
// slot beside the previous binary, which is kept in a slot too (the stable
// one); the state "trying" with its deadline; the systemd drop-in that runs
// the guard from the stable binary around every start and stop; binary_path
// switched to the new slot in one rename; the deadline timer armed; and
// systemd asked to restart the unit. Any failure before the switch is the
// event "refused" with the reason, and binary_path and the unit are left as
// they were.
//
// The new binary, once it has connected and a health sample went out,
// confirms: the state "confirmed", the event "upgraded", the timer stopped,
// older slots deleted. Any binary that starts after a rollback reports it
// ("rolled_back", with the guard's reason), once: the state's `reported`
// is set only after the spool took the event.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "agent/guest/env.hpp"
#include "agent/link/spool.hpp"
#include "agent/upgrade/upgrade_state.hpp"
#include "common/error.hpp"
#include "contract/agent_upgrade.hpp"

namespace factory::net {
class HttpCancel;
}

namespace factory::agent {

struct UpgradeOptions {
  // The unit's ExecStart, as the guest sees it (agent config `binary_path`).
  std::string binary_path = kDefaultAgentBinaryPath;
  // The coordinator's CA as a file (agent config `ca_file`), for the
  // download when the state directory holds no identity yet; the identity's
  // CA (what the link trusts since enrollment) comes first.
  std::string ca_file;
  // The version this process runs and its executable: what tells the new
  // binary from the old one at start (tests play either with other values).
  std::string running_version;  // empty: agent_version()
  std::filesystem::path self_exe = "/proc/self/exe";
  std::function<Clock::time_point()> now = [] { return Clock::now(); };
  std::chrono::milliseconds download_timeout{std::chrono::seconds(30)};
  // Whether the plan is running a step: the restart waits for it to end,
  // at most plan_settle, so a step is seldom cut (one that is, is resumed
  // by the plan journal at the next start, as after any stop).
  std::function<bool()> plan_busy;
  std::chrono::milliseconds plan_settle{std::chrono::seconds(60)};
};

// What handle() did with an order.
enum class UpgradeOutcome {
  restarting,  // the new binary is in place; systemd was asked to restart the unit
  current,     // the order's binary is the one running: "upgraded" at once
  refused,     // the event "refused" (with the reason) was emitted; nothing changed
  repeated,    // an order of this upgrade_id was acted on already: nothing done
  invalid,     // not a valid order: logged, nothing done, nothing emitted
};
const char* outcome_name(UpgradeOutcome o);

class Upgrader {
 public:
  Upgrader(GuestEnv env, EventSpool& spool, UpgradeOptions options);
  // stop(), then joins.
  ~Upgrader();
  Upgrader(const Upgrader&) = delete;
  Upgrader& operator=(const Upgrader&) = delete;

  UpgradeLayout layout() const { return UpgradeLayout::in(env_.state_dir); }

  // At the agent's start, before the link runs: reports what the last run
  // left to report (a rollback, an order interrupted mid-install, a
  // confirmation whose event was not yet spooled), and tells whether this
  // process is a new binary on trial, which then confirms at the first
  // on_health_sent().
  void on_start();
  bool on_trial() const { return on_trial_; }

  // Acts on an "upgrade" command's body now, on the caller's thread. Never throws.
  UpgradeOutcome handle(const nlohmann::json& command);
  // For the link's thread, which must not wait on a download: handled on
  // this object's thread, in order. Bounded: past kMaxQueued waiting, an
  // order is dropped with a warning (the coordinator sends it again).
  static constexpr std::size_t kMaxQueued = 4;
  void submit(nlohmann::json command);

  // The link sent a health sample on a welcomed session. On trial: the
  // confirmation, on this object's thread (it runs systemctl).
  void on_health_sent();
  // The confirmation itself, on the caller's thread: true when this call
  // confirmed (or found confirmed and reported) the trial.
  bool confirm();

  // Ends a download under way (it refuses, as the agent stops), handles
  // nothing more, joins the thread.
  void stop();

 private:
  void work();
  UpgradeOutcome install(const proto::AgentUpgradeOrder& order);
  UpgradeOutcome refuse(const proto::AgentUpgradeOrder& order, const std::string& reason,
                        std::optional<UpgradeState> state);
  Status emit(const UpgradeState& s, proto::AgentUpgradeState what);
  void report_final(UpgradeState& s);
  void prune_slots(const UpgradeState& s);
  std::string trusted_ca() const;
  std::string running_version() const;
  bool runs_candidate(const UpgradeState& s) const;
  void wait_for_plan();

  GuestEnv env_;
  EventSpool& spool_;
  UpgradeOptions options_;
  std::mutex handling_;  // one order (or confirmation) at a time, whichever thread
  std::atomic<bool> on_trial_{false};
  std::atomic<bool> confirm_asked_{false};

  std::mutex mu_;  // guards what follows
  std::condition_variable cv_;
  std::deque<nlohmann::json> queue_;
  bool confirm_pending_ = false;
  bool stopping_ = false;
  std::shared_ptr<net::HttpCancel> cancel_;
  std::thread worker_;
};

}  // namespace factory::agent
