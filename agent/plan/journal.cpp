#include "agent/plan/journal.hpp"

#include <cstdio>
#include <system_error>

#include "agent/plan/plan_spec.hpp"
#include "common/atomic_file.hpp"
#include "common/catalog.hpp"
#include "common/durations.hpp"

namespace factory::agent {

using nlohmann::json;

namespace {

const std::pair<StepState, const char*> kStepStates[] = {
    {StepState::pending, "pending"},
    {StepState::running, "running"},
    {StepState::succeeded, "succeeded"},
    {StepState::failed, "failed"},
    {StepState::reboot_requested, "reboot_requested"},
};
const std::pair<PlanState, const char*> kPlanStates[] = {{PlanState::running, "running"},
                                                         {PlanState::succeeded, "succeeded"},
                                                         {PlanState::failed, "failed"}};

std::string now_text() {
  return format_rfc3339(Clock::now());
}

// The checksum covers the canonical form of everything but itself, so it is
// independent of how the file is indented.
std::string checksum_of(json doc) {
  doc.erase("checksum");
  return catalog::sha256_hex(catalog::canonical_json(doc));
}

Error corrupt(const std::string& what) {
  return Error(Errc::protocol, what);
}

template <class T>
bool get_to(const json& o, const char* key, T& out) {
  if (!o.contains(key)) return false;
  try {
    out = o[key].get<T>();
    return true;
  } catch (const json::exception&) {
    return false;
  }
}

}  // namespace

const char* to_string(StepState s) {
  for (auto& [v, n] : kStepStates)
    if (v == s) return n;
  return "unknown";
}
const char* to_string(PlanState s) {
  for (auto& [v, n] : kPlanStates)
    if (v == s) return n;
  return "unknown";
}
std::optional<StepState> step_state_from(const std::string& s) {
  for (auto& [v, n] : kStepStates)
    if (s == n) return v;
  return std::nullopt;
}
std::optional<PlanState> plan_state_from(const std::string& s) {
  for (auto& [v, n] : kPlanStates)
    if (s == n) return v;
  return std::nullopt;
}

void StepRecord::reset() {
  StepRecord fresh;
  fresh.id = id;
  fresh.kind = kind;
  *this = fresh;
}

json StepRecord::to_json() const {
  return {{"id", id},
          {"kind", kind},
          {"state", to_string(state)},
          {"skipped", skipped},
          {"phase", phase},
          {"attempts", attempts},
          {"failures", failures},
          {"entries", entries},
          {"reboot_requests", reboot_requests},
          {"boot_id", boot_id},
          {"message", message},
          {"output_tail", output_tail},
          {"diagnosis", diagnosis},
          {"started_at", started_at},
          {"finished_at", finished_at}};
}

size_t JournalState::steps_done() const {
  size_t n = 0;
  for (auto& s : steps) n += s.state == StepState::succeeded;
  return n;
}

json JournalState::to_json() const {
  json steps_json = json::array();
  for (auto& s : steps) steps_json.push_back(s.to_json());
  return {{"schema", PlanJournal::kSchema},
          {"plan_hash", plan_hash},
          {"tier", tier},
          {"state", to_string(state)},
          {"created_at", created_at},
          {"updated_at", updated_at},
          {"plan", plan},
          {"steps", steps_json}};
}

PlanJournal::PlanJournal(std::filesystem::path dir) : dir_(std::move(dir)) {}

Result<JournalState> PlanJournal::parse(const std::string& text) {
  if (text.empty()) return corrupt("the file is empty");
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return corrupt("not valid JSON (truncated?)");
  if (!doc.is_object()) return corrupt("not a JSON object");
  if (!doc.contains("schema") || doc["schema"] != kSchema)
    return corrupt(std::string("schema is not ") + kSchema);
  std::string sum;
  if (!get_to(doc, "checksum", sum)) return corrupt("no checksum");
  if (sum != checksum_of(doc))
    return corrupt("checksum mismatch (the file was altered or damaged)");

  JournalState st;
  std::string state;
  if (!get_to(doc, "plan_hash", st.plan_hash) || !get_to(doc, "tier", st.tier) ||
      !get_to(doc, "state", state) || !doc.contains("plan") || !doc.contains("steps") ||
      !doc["steps"].is_array())
    return corrupt("missing plan_hash, tier, state, plan or steps");
  get_to(doc, "created_at", st.created_at);
  get_to(doc, "updated_at", st.updated_at);
  auto ps = plan_state_from(state);
  if (!ps) return corrupt("unknown plan state '" + state + "'");
  st.state = *ps;
  st.plan = doc["plan"];
  auto spec = parse_plan(st.plan);
  if (!spec) return corrupt("stored plan: " + spec.error().message);
  if (spec->hash != st.plan_hash) return corrupt("stored plan does not match its hash");
  if (spec->steps.size() != doc["steps"].size())
    return corrupt("step records do not match the plan");
  for (size_t i = 0; i < doc["steps"].size(); ++i) {
    const json& r = doc["steps"][i];
    StepRecord rec;
    std::string s;
    if (!r.is_object() || !get_to(r, "id", rec.id) || !get_to(r, "state", s))
      return corrupt("step record " + std::to_string(i) + " has no id or state");
    if (rec.id != spec->steps[i].id) return corrupt("step records do not match the plan");
    auto ss = step_state_from(s);
    if (!ss) return corrupt("step '" + rec.id + "' has unknown state '" + s + "'");
    rec.state = *ss;
    rec.kind = spec->steps[i].kind;
    get_to(r, "skipped", rec.skipped);
    get_to(r, "phase", rec.phase);
    get_to(r, "attempts", rec.attempts);
    get_to(r, "failures", rec.failures);
    get_to(r, "entries", rec.entries);
    get_to(r, "reboot_requests", rec.reboot_requests);
    get_to(r, "boot_id", rec.boot_id);
    get_to(r, "message", rec.message);
    get_to(r, "output_tail", rec.output_tail);
    get_to(r, "started_at", rec.started_at);
    get_to(r, "finished_at", rec.finished_at);
    if (r.contains("diagnosis")) rec.diagnosis = r["diagnosis"];
    st.steps.push_back(std::move(rec));
  }
  return st;
}

PlanJournal::Loaded PlanJournal::load() const {
  Loaded out;
  std::error_code ec;
  if (!std::filesystem::exists(file(), ec)) return out;
  auto text = read_file(file());
  if (!text) {
    out.kind = Loaded::Kind::corrupt;
    out.problem = text.error().message;
    return out;
  }
  auto st = parse(*text);
  if (!st) {
    out.kind = Loaded::Kind::corrupt;
    out.problem = st.error().message;
    return out;
  }
  out.kind = Loaded::Kind::ok;
  out.state = std::move(*st);
  return out;
}

Status PlanJournal::save(JournalState& state) const {
  if (auto s = ensure_dir(dir_, 0700); !s) return s.error().with_context("plan journal");
  state.updated_at = now_text();
  if (state.created_at.empty()) state.created_at = state.updated_at;
  for (auto& r : state.steps)
    if (r.output_tail.size() > kMaxTail)
      r.output_tail = r.output_tail.substr(r.output_tail.size() - kMaxTail);
  json doc = state.to_json();
  doc["checksum"] = checksum_of(doc);
  auto s = write_file_atomic(file(), doc.dump(2, ' ', false, json::error_handler_t::replace) + "\n",
                             0600);
  if (!s) return s.error().with_context("plan journal");
  return ok_status();
}

Status PlanJournal::rename_current(const std::filesystem::path& to) const {
  std::error_code ec;
  if (!std::filesystem::exists(file(), ec)) return ok_status();
  if (std::rename(file().c_str(), to.c_str()) != 0)
    return errno_error("plan journal: rename " + file().string() + " to " + to.filename().string(),
                       errno);
  return fsync_dir(dir_);
}

Status PlanJournal::archive() const {
  return rename_current(prev_file());
}
Status PlanJournal::quarantine() const {
  return rename_current(corrupt_file());
}

}  // namespace factory::agent
