#include "agent/plan/journal.hpp"

#include <cstdio>
#include <system_error>

#include "agent/plan/plan_spec.hpp"
#include "common/atomic_file.hpp"
#include "common/durations.hpp"
#include "contract/catalog.hpp"

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

std::string journal_now_text() {
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
  json j = {{"schema", PlanJournal::kSchema},
            {"plan_hash", plan_hash},
            {"tier", tier},
            {"state", to_string(state)},
            {"created_at", created_at},
            {"updated_at", updated_at},
            {"plan", plan},
            {"steps", steps_json}};
  if (!tier_upgrade.is_null()) j["tier_upgrade"] = tier_upgrade;
  return j;
}

PlanJournal::PlanJournal(std::filesystem::path dir) : dir_(std::move(dir)) {}

namespace {

// One step record from its line, checked against the step the plan has at
// its place; why not, when it is damaged.
Result<StepRecord> parse_step_record(std::string_view line, const StepSpec& want) {
  json r = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (r.is_discarded() || !r.is_object()) return corrupt("not valid JSON");
  std::string sum;
  if (!get_to(r, "checksum", sum)) return corrupt("no checksum");
  if (sum != checksum_of(r)) return corrupt("checksum mismatch");
  StepRecord rec;
  std::string s;
  if (!get_to(r, "id", rec.id) || !get_to(r, "state", s)) return corrupt("no id or state");
  if (rec.id != want.id)
    return corrupt("it is step '" + rec.id + "', the plan has '" + want.id + "' here");
  auto ss = step_state_from(s);
  if (!ss) return corrupt("unknown state '" + s + "'");
  rec.state = *ss;
  rec.kind = want.kind;
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
  return rec;
}

}  // namespace

Result<JournalState> PlanJournal::parse(const std::string& text,
                                        std::vector<std::string>* repairs) {
  if (text.empty()) return corrupt("the file is empty");
  // Lines with their offsets; a last line without its '\n' is kept too (it
  // is then damaged, or whole but for the newline).
  std::vector<std::pair<size_t, std::string_view>> lines;
  for (size_t pos = 0; pos < text.size();) {
    size_t nl = text.find('\n', pos);
    size_t end = nl == std::string::npos ? text.size() : nl;
    lines.push_back({pos, std::string_view(text).substr(pos, end - pos)});
    pos = end + 1;
  }
  json doc = json::parse(lines[0].second, nullptr, /*allow_exceptions=*/false);
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
  size_t step_count = 0;
  if (!get_to(doc, "plan_hash", st.plan_hash) || !get_to(doc, "tier", st.tier) ||
      !get_to(doc, "state", state) || !doc.contains("plan") || !get_to(doc, "steps", step_count))
    return corrupt("missing plan_hash, tier, state, plan or steps");
  get_to(doc, "created_at", st.created_at);
  get_to(doc, "updated_at", st.updated_at);
  auto ps = plan_state_from(state);
  if (!ps) return corrupt("unknown plan state '" + state + "'");
  st.state = *ps;
  st.plan = doc["plan"];
  if (doc.contains("tier_upgrade")) {
    if (!doc["tier_upgrade"].is_object() && !doc["tier_upgrade"].is_null())
      return corrupt("tier_upgrade is not an object");
    st.tier_upgrade = doc["tier_upgrade"];
  }
  auto spec = parse_plan(st.plan);
  if (!spec) return corrupt("stored plan: " + spec.error().message);
  if (spec->hash != st.plan_hash) return corrupt("stored plan does not match its hash");
  if (spec->steps.size() != step_count) return corrupt("step records do not match the plan");

  // Line i+1 is step i's record, whatever is in it: a damaged line is known
  // by its place, and costs only its own step.
  bool repaired = false;
  for (size_t i = 0; i < step_count; ++i) {
    const StepSpec& want = spec->steps[i];
    std::string why;
    size_t offset = text.size();
    if (i + 1 < lines.size()) {
      offset = lines[i + 1].first;
      auto rec = parse_step_record(lines[i + 1].second, want);
      if (rec) {
        st.steps.push_back(std::move(*rec));
        continue;
      }
      why = rec.error().message;
    } else {
      why = "missing (the file ends before it)";
    }
    StepRecord fresh;
    fresh.id = want.id;
    fresh.kind = want.kind;
    st.steps.push_back(std::move(fresh));
    repaired = true;
    if (repairs)
      repairs->push_back("offset " + std::to_string(offset) + ": the record of step '" + want.id +
                         "' (" + std::to_string(i + 1) + " of " + std::to_string(step_count) +
                         ") is damaged (" + why +
                         "): skipped, and the step starts over from its check; the records "
                         "after it are kept");
  }
  // A finished plan with a step it no longer knows the end of runs again:
  // the steps' checks find what is done.
  if (repaired) st.state = PlanState::running;
  return st;
}

std::string PlanJournal::serialize(const JournalState& state) {
  json header = state.to_json();
  header.erase("steps");
  header["steps"] = state.steps.size();
  header["checksum"] = checksum_of(header);
  auto line = [](const json& j) {
    return j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  };
  std::string out = line(header);
  for (const auto& r : state.steps) {
    json rec = r.to_json();
    rec["checksum"] = checksum_of(rec);
    out += line(rec);
  }
  return out;
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
  std::vector<std::string> repairs;
  auto st = parse(*text, &repairs);
  if (!st) {
    out.kind = Loaded::Kind::corrupt;
    out.problem = st.error().message;
    return out;
  }
  out.kind = Loaded::Kind::ok;
  out.state = std::move(*st);
  for (auto& r : repairs) out.repairs.push_back(file().string() + " " + r);
  return out;
}

Status PlanJournal::save(JournalState& state) const {
  if (auto s = ensure_dir(dir_, 0700); !s) return s.error().with_context("plan journal");
  state.updated_at = journal_now_text();
  if (state.created_at.empty()) state.created_at = state.updated_at;
  for (auto& r : state.steps)
    if (r.output_tail.size() > kMaxTail)
      r.output_tail = r.output_tail.substr(r.output_tail.size() - kMaxTail);
  auto s = write_file_atomic(file(), serialize(state), 0600);
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
Status PlanJournal::keep_previous() const {
  std::error_code ec;
  if (!std::filesystem::exists(file(), ec)) return ok_status();
  auto text = read_file(file());
  if (!text) return text.error().with_context("plan journal");
  if (auto s = write_file_atomic(prev_file(), *text, 0600); !s)
    return s.error().with_context("plan journal");
  return ok_status();
}

Status PlanJournal::quarantine() const {
  return rename_current(corrupt_file());
}

}  // namespace factory::agent
