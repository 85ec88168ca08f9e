#pragma once
// The plan journal: the agent's memory of where it is in a plan, on disk so it
// survives the agent being killed and the guest rebooting. It is written
// (atomically, fsync'd) BEFORE each action, so after any interruption the
// agent knows which step it was in and what it had asked for (a reboot, and
// from which boot).
//
// Files under <state_dir>/plan/:
//   journal.json          the current plan's journal
//   journal.prev.json     the previous plan's, kept when a new plan arrives
//   journal.corrupt.json  a journal that failed to load, kept for post-mortems
//
// The file is JSON lines: a header (schema, plan hash, tier, state, the plan
// itself) and then one record per step, in the plan's order, each line with a
// checksum of its own. A header that does not parse, has the wrong schema or
// a wrong checksum makes the journal "corrupt": the engine sets it aside and
// starts the plan over (every step's check() makes that cheap). A damaged
// step record costs only that step: it is skipped with a warning naming the
// file and its offset, that step starts over from its check, and every
// record after it is kept. The whole file is replaced atomically, so a crash
// never tears it; damage comes from the disk or a hand.
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"

namespace factory::agent {

enum class StepState { pending, running, succeeded, failed, reboot_requested };
enum class PlanState { running, succeeded, failed };

const char* to_string(StepState s);
const char* to_string(PlanState s);
std::optional<StepState> step_state_from(const std::string& s);
std::optional<PlanState> plan_state_from(const std::string& s);

struct StepRecord {
  std::string id;
  std::string kind;
  StepState state = StepState::pending;
  bool skipped = false;  // check() found it already done
  std::string phase;     // what it was doing: check | apply | verify | verify_after_reboot
  int attempts = 0;      // apply() calls
  int failures = 0;      // failed attempts, against the step's retries
  int entries = 0;       // times entered without finishing: the crash counter
  int reboot_requests = 0;
  std::string boot_id;       // the boot in which the last reboot was requested
  std::string message;       // last outcome, one line
  std::string output_tail;   // last lines of the failing command
  nlohmann::json diagnosis;  // null, or Diagnosis::to_json()
  std::string started_at;    // RFC 3339
  std::string finished_at;

  void reset();  // back to pending, counters cleared (retry)
  nlohmann::json to_json() const;
};

struct JournalState {
  std::string plan_hash;
  std::string tier;
  nlohmann::json plan;  // the plan itself, so it resumes after boot without the coordinator
  PlanState state = PlanState::running;
  std::vector<StepRecord> steps;
  std::string created_at;
  std::string updated_at;
  // A tier upgrade's generation of the journal (engine.hpp), else null:
  // {"id", "role": "upgrade"|"rollback", "from_hash", "to_hash", "steps",
  //  "previous_plan" (role upgrade: the plan it replaces), "failed_step",
  //  "reason", "diagnosis" (role rollback: why it goes back), "reported"
  //  (the last state reported to the coordinator)}. Absent from the file
  // when null, so a journal without one reads as it always did.
  nlohmann::json tier_upgrade = nullptr;

  size_t steps_done() const;  // succeeded steps
  // Everything in one document (status, tests); on disk it is split in lines.
  nlohmann::json to_json() const;
};

class PlanJournal {
 public:
  static constexpr const char* kSchema = "factory.plan-journal/v2";
  // Output tails are capped so a chatty failing command cannot bloat the journal.
  static constexpr size_t kMaxTail = 4096;

  explicit PlanJournal(std::filesystem::path dir);

  struct Loaded {
    enum class Kind { missing, ok, corrupt } kind = Kind::missing;
    JournalState state;
    std::string problem;  // why it is corrupt
    // ok, but with damaged step records skipped: "<file> offset N: ..." each
    std::vector<std::string> repairs;
  };
  Loaded load() const;
  Status save(JournalState& state) const;  // stamps updated_at; atomic + fsync
  Status archive() const;                  // journal.json -> journal.prev.json
  // journal.json copied to journal.prev.json, journal.json left in place:
  // the next save() replaces it atomically, so a crash between the two
  // never leaves the agent without a journal.
  Status keep_previous() const;
  Status quarantine() const;  // journal.json -> journal.corrupt.json

  const std::filesystem::path& dir() const { return dir_; }
  std::filesystem::path file() const { return dir_ / "journal.json"; }
  std::filesystem::path prev_file() const { return dir_ / "journal.prev.json"; }
  std::filesystem::path corrupt_file() const { return dir_ / "journal.corrupt.json"; }

  // Parses and checks a journal (the header's schema, checksum, plan hash;
  // each step record's checksum and place in the plan). A damaged step
  // record is replaced by a fresh one and described in `repairs` ("offset N:
  // ..."); only a damaged header is an error. Used by load(); public for tests.
  static Result<JournalState> parse(const std::string& text,
                                    std::vector<std::string>* repairs = nullptr);
  // The file's text for a state (what save() writes).
  static std::string serialize(const JournalState& state);

 private:
  Status rename_current(const std::filesystem::path& to) const;
  std::filesystem::path dir_;
};

}  // namespace factory::agent
