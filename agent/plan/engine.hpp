#pragma once
// The plan engine: runs a tier's plan step by step, journaled so that it
// converges whatever interrupts it.
//
// For each step: journal "running" (counting the entry), check() -> already
// done: skipped; else apply() -> verify(). A step that needs a reboot is
// journaled "reboot_requested" with the current boot id before the reboot hook
// runs; when the agent starts again, a changed boot id means the reboot
// happened and the step is verified, an unchanged one means it did not and it
// is requested again (a bounded number of times). Failures are retried as the
// step's spec says; the last one stops the plan with the message, the output
// tail and the diagnosis. A step entered max_entries times without finishing
// (the agent died inside it each time) is failed instead of looping.
//
// Plans are content-addressed: a plan whose hash the journal shows finished
// is not applied again; a new hash starts a new journal (the old one is kept
// as journal.prev.json). A corrupt journal is set aside and the plan starts
// over.
//
// Tier upgrades (contract/tier_upgrade.hpp): tier_upgrade() takes an order
// to move from the finished plan it has to a newer plan of the tier, and
// runs it as a new generation of the journal in which only the order's
// steps are pending (the rest are carried over as done). The journal's
// header says so (JournalState::tier_upgrade, role "upgrade", with the plan
// it replaces). When a step of it fails and every step it changed so far
// can go back (catalog::step_kind_can_go_back), the engine starts a second
// generation, role "rollback": the previous plan, with those steps pending
// again under their previous params (the driver: its previous packages,
// reinstalled, rebooted into and verified). Each generation is journaled
// before it acts, so a kill or a reboot anywhere resumes it; each outcome
// is reported once as a `tier_upgrade` event (started, rolling_back,
// succeeded, rolled_back, failed, refused). A failure that cannot go back
// stays failed: `retry()` runs it again, and its success finishes the
// upgrade. The engine is synchronous: the agent runs it on a thread of its own;
// status_json() may be called from any thread.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "agent/plan/journal.hpp"
#include "agent/plan/plan_spec.hpp"
#include "agent/plan/step.hpp"
#include "common/error.hpp"

namespace factory::agent {

struct PlanEngineOptions {
  int max_entries = 3;          // entries without finishing before a step is failed
  int max_reboot_requests = 3;  // reboots one step may ask for
  std::chrono::milliseconds retry_delay{std::chrono::seconds(10)};  // times the failure count
  // Between a failed attempt and the next. Default: a wait that interrupt() ends.
  std::function<void(std::chrono::milliseconds)> sleep;
};

// Events, as the coordinator ingests them:
//   {"kind":"progress","plan_hash":h,"step":id,"state":"started|skipped|succeeded|failed|
//    reboot_requested|progress","attempt":n,"message":..,"output_tail":..,"diagnosis":{..}}
//   {"kind":"plan","plan_hash":h,"tier":t,"state":"running|succeeded|failed",
//    "steps_total":n,"steps_done":k[,"message":..][,"failed_step":id]}
//   {"kind":"journal_reset","plan_hash":h,"reason":..,"message":..}
using PlanEventSink = std::function<void(nlohmann::json)>;
// Asks the guest to reboot. Returning means the request was made; the agent
// then waits to be stopped.
using RebootHook = std::function<Status()>;

class PlanEngine {
 public:
  enum class Outcome {
    succeeded,  // every step done (now or before)
    failed,     // a step failed; retry() runs it again
    rebooting,  // a reboot was requested; resume() after the guest is back
    idle,       // no plan to run (resume() without a journal)
    stopped,    // interrupt(): the step under way resumes at the next start
  };
  static const char* to_string(Outcome o);

  PlanEngine(GuestEnv env, StepRegistry steps, PlanEventSink sink, RebootHook reboot,
             PlanEngineOptions options = {});

  // Runs the plan the coordinator sent (see plan_spec.hpp).
  Outcome run(const nlohmann::json& plan);
  // Continues the plan stored in the journal: what the agent does at start,
  // before the coordinator is reachable (e.g. after the driver's reboot).
  Outcome resume();
  // Resets a failed plan from its failed step, or from `step_id` (that step and
  // every later one run again), and runs it. Errors when there is nothing to retry.
  Result<Outcome> retry(const std::optional<std::string>& step_id = std::nullopt);
  // Runs a tier upgrade order (the command body, action "tier_upgrade"). An
  // order it cannot take (not from the plan it finished, a plan still
  // running or failed, a malformed order) is refused with a tier_upgrade
  // event, and nothing changes. An order it has taken already (same
  // upgrade_id) carries on where its journal is.
  Outcome tier_upgrade(const nlohmann::json& order);

  // {"plan_hash","tier","state":"none|running|succeeded|failed","steps_total","steps_done",
  //  "updated_at","steps":[{"id","kind","state","skipped","attempts","failures","entries",
  //  "reboot_requests","message","output_tail","diagnosis","started_at","finished_at"}]}
  nlohmann::json status_json() const;

  // The agent is stopping (thread-safe, no way back): the plan stops at the
  // next step boundary, and a step whose command was stopped under it
  // (CommandStop) is neither failed nor counted as a crash: the
  // journal keeps it running, and at the next start its check() decides
  // whether it resumes or runs again. A retry delay under way ends at once.
  void interrupt();
  bool interrupted() const { return interrupted_; }

  const PlanJournal& journal() const { return journal_; }

 private:
  enum class StepRun { done, failed, rebooting, interrupted };

  Outcome execute(const PlanSpec& spec);
  StepRun run_step(const PlanSpec& spec, size_t i);
  StepRun succeed_step(const PlanSpec& spec, size_t i, bool skipped, const std::string& message);
  StepRun fail_step(const PlanSpec& spec, size_t i, const StepOutcome& outcome);
  StepRun request_reboot(const PlanSpec& spec, size_t i, const std::string& message);
  StepRun leave_interrupted(const PlanSpec& spec, size_t i);
  void pause(std::chrono::milliseconds d);
  Outcome finish_plan(const PlanSpec& spec, PlanState state, const std::string& message = {});
  Outcome report_finished(const PlanSpec& spec);
  // After a plan operation: what a tier upgrade's generation does next (go
  // back, or report its end). ran: the plan ran in this operation (else
  // only what was not reported yet is).
  Outcome settle_tier_upgrade(const PlanSpec& spec, Outcome outcome, bool ran);
  Outcome go_back(const nlohmann::json& upgrade, const std::vector<std::string>& steps,
                  const StepRecord& failed);
  void report_tier_upgrade(const nlohmann::json& upgrade, const char* state, bool ran,
                           const std::string& step = {}, const std::string& message = {},
                           const nlohmann::json& diagnosis = nullptr);
  void refuse_tier_upgrade(const nlohmann::json& order, const std::string& why);
  // A new generation of the journal: the current one kept as
  // journal.prev.json, then `st` saved over it.
  bool start_generation(JournalState st);
  bool start_new(const PlanSpec& spec);
  void report_corrupt(const std::string& plan_hash, const std::string& problem);
  PlanJournal::Loaded load_journal();
  Result<PlanSpec> adopt_loaded(const PlanJournal::Loaded& loaded);

  // Journal writes happen under mu_ so status_json() sees a whole state.
  Status commit(const std::function<void(JournalState&)>& change);
  void emit(nlohmann::json event) const;
  // attempt 0: the attempt under way (failures + 1).
  void emit_step(const PlanSpec& spec, size_t i, const std::string& state,
                 const std::string& message = {}, const std::string& tail = {},
                 const nlohmann::json& diagnosis = nullptr, int attempt = 0) const;
  void emit_plan(const PlanSpec& spec, const std::string& state, const std::string& message = {},
                 const std::string& failed_step = {}) const;
  StepRecord record(size_t i) const;

  GuestEnv env_;
  StepRegistry steps_;
  PlanEventSink sink_;
  RebootHook reboot_;
  PlanEngineOptions opts_;
  PlanJournal journal_;

  std::atomic<bool> interrupted_{false};
  std::mutex pause_mu_;
  std::condition_variable pause_cv_;

  std::mutex run_mu_;      // one plan operation at a time
  mutable std::mutex mu_;  // guards state_
  JournalState state_;
  bool have_state_ = false;
};

// The real reboot: `systemctl reboot`, or `reboot` where there is no systemctl
// (both looked up on PATH, so a simulated guest supplies its own).
RebootHook system_reboot_hook();

}  // namespace factory::agent
