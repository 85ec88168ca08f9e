#include "agent/plan/engine.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <thread>

#include "agent/guest/facts.hpp"
#include "common/durations.hpp"
#include "common/subprocess.hpp"
#include "contract/catalog.hpp"
#include "contract/tier_upgrade.hpp"

namespace factory::agent {

using nlohmann::json;
using Clock_ = std::chrono::steady_clock;

namespace {

std::string now_text() {
  return format_rfc3339(Clock::now());
}

std::string plural(int n, const std::string& word) {
  return std::to_string(n) + " " + word + (n == 1 ? "" : "s");
}

// A step that throws is a bug in the agent, not a reason to die: the plan
// stops at that step with the exception's text, and the journal stays sound.
template <class F>
StepOutcome guarded(const char* what, F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    return StepOutcome::failure(std::string(what) + " threw: " + e.what() +
                                " (a bug in the agent)");
  }
}

std::string catalog_hash_or_empty(const json& plan) {
  return plan.is_object() ? catalog::plan_hash(plan) : std::string();
}

}  // namespace

const char* PlanEngine::to_string(Outcome o) {
  switch (o) {
    case Outcome::succeeded:
      return "succeeded";
    case Outcome::failed:
      return "failed";
    case Outcome::rebooting:
      return "rebooting";
    case Outcome::idle:
      return "idle";
    case Outcome::stopped:
      return "stopped";
  }
  return "unknown";
}

RebootHook system_reboot_hook() {
  return []() -> Status {
    CommandSpec cmd;
    cmd.argv = which("systemctl").empty() ? std::vector<std::string>{"reboot"}
                                          : std::vector<std::string>{"systemctl", "reboot"};
    cmd.timeout = std::chrono::minutes(1);
    auto r = run_checked(cmd);
    if (!r) return r.error();  // request_reboot says "could not reboot the guest: ..."
    return ok_status();
  };
}

PlanEngine::PlanEngine(GuestEnv env, StepRegistry steps, PlanEventSink sink, RebootHook reboot,
                       PlanEngineOptions options)
    : env_(std::move(env)),
      steps_(std::move(steps)),
      sink_(std::move(sink)),
      reboot_(std::move(reboot)),
      opts_(std::move(options)),
      journal_(env_.state_dir / "plan") {
  if (!opts_.sleep) opts_.sleep = [this](std::chrono::milliseconds d) { pause(d); };
  // Know the last plan's state from the start, so the agent can report it
  // before it runs anything.
  auto loaded = journal_.load();
  if (loaded.kind == PlanJournal::Loaded::Kind::ok) {
    state_ = std::move(loaded.state);
    have_state_ = true;
  }
}

void PlanEngine::interrupt() {
  {
    std::lock_guard lk(pause_mu_);
    interrupted_ = true;
  }
  pause_cv_.notify_all();
}

void PlanEngine::pause(std::chrono::milliseconds d) {
  std::unique_lock lk(pause_mu_);
  pause_cv_.wait_for(lk, d, [this] { return interrupted_.load(); });
}

// ---------------------------------------------------------------------------
// Events and journal plumbing.

void PlanEngine::emit(json event) const {
  if (!sink_) return;
  try {
    sink_(std::move(event));
  } catch (const std::exception& e) {
    spdlog::warn("plan: event sink failed: {}", e.what());
  }
}

StepRecord PlanEngine::record(size_t i) const {
  std::lock_guard lock(mu_);
  return state_.steps.at(i);
}

void PlanEngine::emit_step(const PlanSpec& spec, size_t i, const std::string& state,
                           const std::string& message, const std::string& tail,
                           const json& diagnosis, int attempt) const {
  if (attempt <= 0) attempt = record(i).failures + 1;
  json e = {{"kind", "progress"},
            {"plan_hash", spec.hash},
            {"step", spec.steps[i].id},
            {"state", state},
            {"attempt", attempt}};
  if (!message.empty()) e["message"] = message;
  if (!tail.empty()) e["output_tail"] = tail;
  if (!diagnosis.is_null()) e["diagnosis"] = diagnosis;
  emit(std::move(e));
}

void PlanEngine::emit_plan(const PlanSpec& spec, const std::string& state,
                           const std::string& message, const std::string& failed_step) const {
  size_t done;
  {
    std::lock_guard lock(mu_);
    done = state_.steps_done();
  }
  json e = {{"kind", "plan"}, {"plan_hash", spec.hash},           {"tier", spec.tier},
            {"state", state}, {"steps_total", spec.steps.size()}, {"steps_done", done}};
  if (!message.empty()) e["message"] = message;
  if (!failed_step.empty()) e["failed_step"] = failed_step;
  emit(std::move(e));
}

Status PlanEngine::commit(const std::function<void(JournalState&)>& change) {
  std::lock_guard lock(mu_);
  change(state_);
  return journal_.save(state_);
}

PlanJournal::Loaded PlanEngine::load_journal() {
  auto loaded = journal_.load();
  // Damaged step records were skipped: said once here (and to the
  // coordinator); the next save writes the journal whole again.
  for (const auto& r : loaded.repairs) {
    spdlog::warn("plan: journal {}", r);
    emit({{"kind", "log"}, {"level", "warning"}, {"message", "plan journal " + r}});
  }
  return loaded;
}

void PlanEngine::report_corrupt(const std::string& plan_hash, const std::string& problem) {
  spdlog::warn(
      "plan: the journal {} is corrupt ({}): setting it aside as {} and starting the plan over",
      journal_.file().string(), problem, journal_.corrupt_file().filename().string());
  if (auto s = journal_.quarantine(); !s) spdlog::warn("plan: {}", s.error().message);
  emit({{"kind", "journal_reset"},
        {"plan_hash", plan_hash},
        {"reason", problem},
        {"message",
         "the plan journal was corrupt (" + problem +
             "): starting the plan over; steps already done are skipped by their checks"}});
}

// ---------------------------------------------------------------------------
// Plan level.

bool PlanEngine::start_new(const PlanSpec& spec) {
  JournalState st;
  st.plan_hash = spec.hash;
  st.tier = spec.tier;
  st.plan = spec.raw;
  st.state = PlanState::running;
  for (auto& s : spec.steps) {
    StepRecord r;
    r.id = s.id;
    r.kind = s.kind;
    st.steps.push_back(std::move(r));
  }
  Status saved = commit([&](JournalState& cur) { cur = std::move(st); });
  {
    std::lock_guard lock(mu_);
    have_state_ = true;
  }
  if (!saved) {
    // Without a journal a reboot or crash would lose our place: do not act.
    emit_plan(spec, "failed",
              "cannot write the plan journal: " + saved.error().message + " (free space under " +
                  journal_.dir().string() + "?)");
    return false;
  }
  return true;
}

PlanEngine::Outcome PlanEngine::report_finished(const PlanSpec& spec) {
  PlanState st;
  std::string failed_step, message;
  {
    std::lock_guard lock(mu_);
    st = state_.state;
    for (auto& r : state_.steps)
      if (r.state == StepState::failed) {
        failed_step = r.id;
        message = r.message;
        break;
      }
  }
  if (st == PlanState::succeeded) {
    emit_plan(spec, "succeeded", "plan already applied; nothing to do");
    return Outcome::succeeded;
  }
  emit_plan(spec, "failed", message, failed_step);
  return Outcome::failed;
}

PlanEngine::Outcome PlanEngine::run(const json& plan) {
  std::lock_guard run_lock(run_mu_);
  auto spec = parse_plan(plan);
  if (!spec) {
    spdlog::error("{}", spec.error().message);
    emit({{"kind", "plan"},
          {"plan_hash", catalog_hash_or_empty(plan)},
          {"tier", plan.is_object() && plan.contains("tier") ? plan["tier"] : json("")},
          {"state", "failed"},
          {"steps_total", 0},
          {"steps_done", 0},
          {"message", spec.error().message}});
    return Outcome::failed;
  }
  auto loaded = load_journal();
  using Kind = PlanJournal::Loaded::Kind;
  if (loaded.kind == Kind::corrupt) {
    report_corrupt(spec->hash, loaded.problem);
  } else if (loaded.kind == Kind::ok && loaded.state.plan_hash == spec->hash) {
    bool finished = loaded.state.state != PlanState::running;
    {
      std::lock_guard lock(mu_);
      state_ = std::move(loaded.state);
      have_state_ = true;
    }
    if (finished) return settle_tier_upgrade(*spec, report_finished(*spec), false);
    return settle_tier_upgrade(*spec, execute(*spec), true);
  } else if (loaded.kind == Kind::ok) {
    spdlog::info("plan: new plan {} for tier {} replaces {}", spec->hash, spec->tier,
                 loaded.state.plan_hash);
    if (auto s = journal_.archive(); !s) spdlog::warn("plan: {}", s.error().message);
  }
  if (!start_new(*spec)) return Outcome::failed;
  return execute(*spec);
}

Result<PlanSpec> PlanEngine::adopt_loaded(const PlanJournal::Loaded& loaded) {
  auto spec = parse_plan(loaded.state.plan);
  if (!spec) return spec.error();
  std::lock_guard lock(mu_);
  state_ = loaded.state;
  have_state_ = true;
  return spec;
}

PlanEngine::Outcome PlanEngine::resume() {
  std::lock_guard run_lock(run_mu_);
  auto loaded = load_journal();
  using Kind = PlanJournal::Loaded::Kind;
  if (loaded.kind == Kind::missing) return Outcome::idle;
  if (loaded.kind == Kind::corrupt) {
    // The stored plan is lost with it: wait for the coordinator to send it again.
    report_corrupt("", loaded.problem);
    std::lock_guard lock(mu_);
    state_ = {};
    have_state_ = false;
    return Outcome::idle;
  }
  auto spec = adopt_loaded(loaded);
  if (!spec) {  // parse() already checked the plan; this is belt and braces
    report_corrupt(loaded.state.plan_hash, spec.error().message);
    return Outcome::idle;
  }
  if (loaded.state.state != PlanState::running)
    return settle_tier_upgrade(*spec, report_finished(*spec), false);
  return settle_tier_upgrade(*spec, execute(*spec), true);
}

Result<PlanEngine::Outcome> PlanEngine::retry(const std::optional<std::string>& step_id) {
  std::unique_lock run_lock(run_mu_);
  auto loaded = load_journal();
  if (loaded.kind != PlanJournal::Loaded::Kind::ok)
    return Error(Errc::failed_precondition,
                 "no plan to retry: the agent has no readable plan journal (the coordinator sends "
                 "the plan again)");
  auto spec = adopt_loaded(loaded);
  if (!spec) return spec.error();
  size_t from = spec->steps.size();
  {
    std::lock_guard lock(mu_);
    if (step_id) {
      std::vector<std::string> ids;
      for (size_t i = 0; i < state_.steps.size(); ++i) {
        ids.push_back(state_.steps[i].id);
        if (state_.steps[i].id == *step_id) from = i;
      }
      if (from == spec->steps.size()) {
        std::string known;
        for (auto& id : ids) known += (known.empty() ? "" : ", ") + id;
        return Error(Errc::invalid_argument,
                     "no step '" + *step_id + "' in this plan (steps: " + known + ")");
      }
    } else {
      for (size_t i = 0; i < state_.steps.size(); ++i)
        if (state_.steps[i].state == StepState::failed) {
          from = i;
          break;
        }
      if (from == spec->steps.size())
        return Error(Errc::failed_precondition,
                     state_.state == PlanState::succeeded
                         ? "the plan succeeded: nothing to retry (name a step to run it again)"
                         : "the plan has no failed step: nothing to retry");
    }
  }
  spdlog::info("plan: retrying {} from step {}", spec->hash, spec->steps[from].id);
  Status saved = commit([&](JournalState& st) {
    for (size_t i = from; i < st.steps.size(); ++i) st.steps[i].reset();
    st.state = PlanState::running;
  });
  if (!saved) {
    emit_plan(*spec, "failed", "cannot write the plan journal: " + saved.error().message);
    return Outcome::failed;
  }
  return settle_tier_upgrade(*spec, execute(*spec), true);
}

PlanEngine::Outcome PlanEngine::execute(const PlanSpec& spec) {
  emit_plan(spec, "running");
  // A plan this agent cannot finish is refused before it changes anything.
  for (size_t i = 0; i < spec.steps.size(); ++i)
    if (record(i).state != StepState::succeeded && !steps_.has(spec.steps[i].kind)) {
      fail_step(
          spec, i,
          StepOutcome::failure("unknown step kind '" + spec.steps[i].kind +
                               "': this agent is older than the plan; update the agent binary"));
      return finish_plan(spec, PlanState::failed,
                         "step '" + spec.steps[i].id + "' failed: " + record(i).message);
    }
  for (size_t i = 0; i < spec.steps.size(); ++i) {
    StepState st = record(i).state;
    if (st == StepState::succeeded) continue;
    if (interrupted_) return Outcome::stopped;
    if (st == StepState::failed)  // the agent stopped between failing the step and the plan
      return finish_plan(spec, PlanState::failed,
                         "step '" + spec.steps[i].id + "' failed: " + record(i).message);
    switch (run_step(spec, i)) {
      case StepRun::done:
        break;
      case StepRun::rebooting:
        return Outcome::rebooting;
      case StepRun::interrupted:
        return Outcome::stopped;
      case StepRun::failed: {
        StepRecord r = record(i);
        return finish_plan(spec, PlanState::failed, "step '" + r.id + "' failed: " + r.message);
      }
    }
  }
  return finish_plan(spec, PlanState::succeeded);
}

PlanEngine::Outcome PlanEngine::finish_plan(const PlanSpec& spec, PlanState state,
                                            const std::string& message) {
  Status saved = commit([&](JournalState& st) { st.state = state; });
  if (!saved) spdlog::warn("plan: {}", saved.error().message);
  std::string failed_step;
  if (state == PlanState::failed) {
    std::lock_guard lock(mu_);
    for (auto& r : state_.steps)
      if (r.state == StepState::failed) failed_step = r.id;
  }
  emit_plan(spec, state == PlanState::succeeded ? "succeeded" : "failed", message, failed_step);
  return state == PlanState::succeeded ? Outcome::succeeded : Outcome::failed;
}

// ---------------------------------------------------------------------------
// Tier upgrades.

namespace {

const json* step_of(const json& plan, const std::string& id) {
  if (!plan.is_object() || !plan.contains("steps") || !plan["steps"].is_array()) return nullptr;
  for (const auto& s : plan["steps"])
    if (s.is_object() && s.value("id", "") == id) return &s;
  return nullptr;
}

bool listed(const json& ids, const std::string& id) {
  if (!ids.is_array()) return false;
  return std::any_of(ids.begin(), ids.end(), [&](const json& v) { return v == id; });
}

// The records of a new generation: the listed steps pending, the others
// carried over from `before` (done in the plan it replaces) or done.
std::vector<StepRecord> generation_records(const PlanSpec& spec, const json& run,
                                           const std::vector<StepRecord>& before,
                                           const std::string& carried) {
  std::vector<StepRecord> out;
  for (const auto& s : spec.steps) {
    StepRecord r;
    r.id = s.id;
    r.kind = s.kind;
    if (!listed(run, s.id)) {
      auto it = std::find_if(before.begin(), before.end(),
                             [&](const StepRecord& b) { return b.id == s.id; });
      if (it != before.end() && it->state == StepState::succeeded) {
        r = *it;
        r.kind = s.kind;
      } else {
        r.state = StepState::succeeded;
        r.skipped = true;
        r.message = carried;
      }
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace

bool PlanEngine::start_generation(JournalState st) {
  if (auto s = journal_.keep_previous(); !s) spdlog::warn("plan: {}", s.error().message);
  Status saved = commit([&](JournalState& cur) { cur = std::move(st); });
  {
    std::lock_guard lock(mu_);
    have_state_ = true;
  }
  if (!saved) spdlog::error("plan: cannot write the plan journal: {}", saved.error().message);
  return saved.ok();
}

namespace {

json tier_upgrade_event(const json& upgrade, const char* state, const std::string& step,
                        const std::string& message, const json& diagnosis) {
  json e = {{"kind", proto::kTierUpgradeEventKind},
            {"upgrade_id", upgrade.value("id", "")},
            {"state", state},
            {"from_hash", upgrade.value("from_hash", "")},
            {"to_hash", upgrade.value("to_hash", "")}};
  if (!step.empty()) e["step"] = step;
  if (!message.empty()) e["message"] = message;
  if (!diagnosis.is_null()) e["diagnosis"] = diagnosis;
  spdlog::info("plan: tier upgrade {}: {}{}", upgrade.value("id", ""), state,
               message.empty() ? "" : ": " + message);
  return e;
}

}  // namespace

void PlanEngine::report_tier_upgrade(const json& upgrade, const char* state, bool ran,
                                     const std::string& step, const std::string& message,
                                     const json& diagnosis) {
  if (!ran && upgrade.value("reported", "") == state) return;
  emit(tier_upgrade_event(upgrade, state, step, message, diagnosis));
  Status saved = commit([&](JournalState& cur) {
    if (cur.tier_upgrade.is_object()) cur.tier_upgrade["reported"] = state;
  });
  if (!saved) spdlog::warn("plan: {}", saved.error().message);
}

void PlanEngine::refuse_tier_upgrade(const json& order, const std::string& why) {
  spdlog::warn("plan: tier upgrade refused: {}", why);
  json e = {{"kind", proto::kTierUpgradeEventKind}, {"state", "refused"}, {"message", why}};
  for (const char* k : {"upgrade_id", "from_hash", "to_hash"})
    if (order.is_object() && order.contains(k) && order[k].is_string()) e[k] = order[k];
  emit(std::move(e));
}

PlanEngine::Outcome PlanEngine::tier_upgrade(const json& body) {
  std::lock_guard run_lock(run_mu_);
  auto order = proto::decode_tier_upgrade_order(body);
  if (!order) {
    refuse_tier_upgrade(body, order.error().message);
    return Outcome::failed;
  }
  auto spec = parse_plan(order->plan);
  if (!spec) {
    refuse_tier_upgrade(body, spec.error().message);
    return Outcome::failed;
  }
  auto loaded = load_journal();
  if (loaded.kind != PlanJournal::Loaded::Kind::ok) {
    refuse_tier_upgrade(body,
                        "the agent has no readable plan journal" +
                            (loaded.problem.empty() ? std::string() : " (" + loaded.problem + ")") +
                            ": it cannot tell which plan it runs");
    return Outcome::failed;
  }
  const json& taken = loaded.state.tier_upgrade;
  if (taken.is_object() && taken.value("id", "") == order->upgrade_id) {
    // Sent again after a reconnection: carry on where the journal is.
    auto cur = adopt_loaded(loaded);
    if (!cur) {
      refuse_tier_upgrade(body, cur.error().message);
      return Outcome::failed;
    }
    if (loaded.state.state == PlanState::running)
      return settle_tier_upgrade(*cur, execute(*cur), true);
    return settle_tier_upgrade(*cur, report_finished(*cur), false);
  }
  if (loaded.state.plan_hash != order->from_hash) {
    refuse_tier_upgrade(body, "the agent runs plan " + loaded.state.plan_hash.substr(0, 12) +
                                  ", not " + order->from_hash.substr(0, 12) +
                                  ", which the upgrade is from: nothing was changed");
    return Outcome::failed;
  }
  if (loaded.state.state != PlanState::succeeded) {
    refuse_tier_upgrade(
        body, std::string("the plan is ") + agent::to_string(loaded.state.state) +
                  ", not finished: an upgrade starts from a finished plan (tenant retry first)");
    return Outcome::failed;
  }

  JournalState st;
  st.plan_hash = spec->hash;
  st.tier = spec->tier;
  st.plan = spec->raw;
  st.state = PlanState::running;
  json run = order->steps;
  st.steps = generation_records(*spec, run, loaded.state.steps, "unchanged by the tier upgrade");
  st.tier_upgrade = {
      {"id", order->upgrade_id},   {"role", "upgrade"}, {"from_hash", order->from_hash},
      {"to_hash", order->to_hash}, {"steps", run},      {"previous_plan", loaded.state.plan},
      {"reported", "started"}};
  // Announced before it acts.
  emit(tier_upgrade_event(st.tier_upgrade, "started", "",
                          "running " + std::to_string(order->steps.size()) + " step(s) of plan " +
                              spec->hash.substr(0, 12),
                          nullptr));
  if (!start_generation(std::move(st))) {
    emit_plan(*spec, "failed", "cannot write the plan journal for the tier upgrade");
    return Outcome::failed;
  }
  return settle_tier_upgrade(*spec, execute(*spec), true);
}

PlanEngine::Outcome PlanEngine::settle_tier_upgrade(const PlanSpec& spec, Outcome outcome,
                                                    bool ran) {
  (void)spec;
  if (outcome != Outcome::succeeded && outcome != Outcome::failed) return outcome;
  json upgrade;
  PlanState ps;
  std::vector<StepRecord> records;
  {
    std::lock_guard lock(mu_);
    upgrade = state_.tier_upgrade;
    ps = state_.state;
    records = state_.steps;
  }
  if (!upgrade.is_object()) return outcome;
  StepRecord failed;
  for (const auto& r : records)
    if (r.state == StepState::failed) {
      failed = r;
      break;
    }
  const bool rollback = upgrade.value("role", "upgrade") == "rollback";
  if (ps == PlanState::succeeded) {
    if (rollback)
      report_tier_upgrade(upgrade, "rolled_back", ran, upgrade.value("failed_step", ""),
                          "back on the previous pins: " + upgrade.value("reason", ""),
                          upgrade.value("diagnosis", json()));
    else
      report_tier_upgrade(upgrade, "succeeded", ran, "",
                          "plan " + upgrade.value("to_hash", "").substr(0, 12) + " applied");
    return outcome;
  }
  if (ps != PlanState::failed) return outcome;
  if (rollback) {
    report_tier_upgrade(upgrade, "failed", ran, failed.id,
                        "going back to the previous pins failed at step '" + failed.id +
                            "': " + failed.message +
                            " (the upgrade had failed: " + upgrade.value("reason", "") + ")",
                        failed.diagnosis);
    return outcome;
  }
  // Which of the upgrade's steps ran, and whether each can go back.
  const json& previous = upgrade.value("previous_plan", json());
  std::vector<std::string> back;
  std::string stuck;
  for (const auto& r : records) {
    if (!listed(upgrade.value("steps", json::array()), r.id)) continue;
    if (r.state == StepState::pending) continue;
    back.push_back(r.id);
    const json* old = step_of(previous, r.id);
    if (!old || old->value("kind", "") != r.kind || !catalog::step_kind_can_go_back(r.kind))
      if (stuck.empty()) stuck = r.id;
  }
  if (!stuck.empty() || back.empty()) {
    std::string why = stuck.empty() ? "" : " (step '" + stuck + "' cannot go back)";
    report_tier_upgrade(upgrade, "failed", ran, failed.id,
                        "step '" + failed.id + "' failed: " + failed.message + why,
                        failed.diagnosis);
    return outcome;
  }
  return go_back(upgrade, back, failed);
}

PlanEngine::Outcome PlanEngine::go_back(const json& upgrade, const std::vector<std::string>& steps,
                                        const StepRecord& failed) {
  auto prev = parse_plan(upgrade.value("previous_plan", json()));
  if (!prev) {
    report_tier_upgrade(
        upgrade, "failed", true, failed.id,
        "cannot go back: the journal's previous plan is unreadable (" + prev.error().message + ")",
        failed.diagnosis);
    return Outcome::failed;
  }
  std::vector<StepRecord> now;
  {
    std::lock_guard lock(mu_);
    now = state_.steps;
  }
  JournalState st;
  st.plan_hash = prev->hash;
  st.tier = prev->tier;
  st.plan = prev->raw;
  st.state = PlanState::running;
  json run = steps;
  st.steps = generation_records(*prev, run, now, "kept through the tier upgrade");
  std::string reason = "step '" + failed.id + "' failed: " + failed.message;
  st.tier_upgrade = {{"id", upgrade.value("id", "")},
                     {"role", "rollback"},
                     {"from_hash", upgrade.value("from_hash", "")},
                     {"to_hash", upgrade.value("to_hash", "")},
                     {"steps", run},
                     {"failed_step", failed.id},
                     {"reason", reason},
                     {"diagnosis", failed.diagnosis},
                     {"reported", "rolling_back"}};
  // Announced before the previous packages go back.
  emit(tier_upgrade_event(st.tier_upgrade, "rolling_back", failed.id,
                          reason + "; going back to the previous pins", failed.diagnosis));
  if (!start_generation(std::move(st))) {
    emit_plan(*prev, "failed", "cannot write the plan journal to go back");
    return Outcome::failed;
  }
  return settle_tier_upgrade(*prev, execute(*prev), true);
}

// ---------------------------------------------------------------------------
// Step level.

PlanEngine::StepRun PlanEngine::succeed_step(const PlanSpec& spec, size_t i, bool skipped,
                                             const std::string& message) {
  Status saved = commit([&](JournalState& st) {
    auto& r = st.steps[i];
    r.state = StepState::succeeded;
    r.skipped = skipped;
    r.phase.clear();
    r.entries = 0;
    r.message = message.empty() ? (skipped ? "already done" : "done") : message;
    r.output_tail.clear();
    r.diagnosis = nullptr;
    r.finished_at = now_text();
  });
  if (!saved) {
    // The work is done but we could not record it: stop rather than run on
    // with a journal that no longer says where we are.
    return fail_step(
        spec, i, StepOutcome::failure("cannot write the plan journal: " + saved.error().message));
  }
  emit_step(spec, i, skipped ? "skipped" : "succeeded", record(i).message);
  return StepRun::done;
}

PlanEngine::StepRun PlanEngine::fail_step(const PlanSpec& spec, size_t i, const StepOutcome& out) {
  json diag = out.diagnosis ? out.diagnosis->to_json() : json(nullptr);
  Status saved = commit([&](JournalState& st) {
    auto& r = st.steps[i];
    r.state = StepState::failed;
    r.phase.clear();
    r.entries = 0;
    r.message = out.message;
    r.output_tail = out.output_tail;
    r.diagnosis = diag;
    r.finished_at = now_text();
  });
  if (!saved) spdlog::warn("plan: {}", saved.error().message);
  spdlog::error("plan: step {} failed: {}", spec.steps[i].id, out.message);
  // The attempt that failed last (a step failed before any attempt counts as 1).
  emit_step(spec, i, "failed", out.message, out.output_tail, diag, std::max(1, record(i).failures));
  return StepRun::failed;
}

PlanEngine::StepRun PlanEngine::request_reboot(const PlanSpec& spec, size_t i,
                                               const std::string& message) {
  StepRecord r = record(i);
  if (r.reboot_requests >= opts_.max_reboot_requests)
    return fail_step(
        spec, i,
        StepOutcome::failure("the step asked for a reboot " + plural(r.reboot_requests, "time") +
                             " and is still not done after it: see its last message; fix the "
                             "cause, then retry the plan"));
  std::string boot = boot_id(env_);
  std::string msg = message.empty() ? "rebooting the guest" : message;
  // Journaled before the reboot, with the boot we are in: on the next start a
  // different boot id proves the reboot happened.
  Status saved = commit([&](JournalState& st) {
    auto& rec = st.steps[i];
    rec.state = StepState::reboot_requested;
    rec.phase.clear();
    rec.entries = 0;  // a planned exit, not a crash
    rec.reboot_requests++;
    rec.boot_id = boot;
    rec.message = msg;
  });
  if (!saved)
    return fail_step(spec, i,
                     StepOutcome::failure("cannot write the plan journal before rebooting: " +
                                          saved.error().message));
  spdlog::info("plan: step {} requests a reboot (boot {}): {}", spec.steps[i].id, boot, msg);
  emit_step(spec, i, "reboot_requested", msg);
  Status rebooted =
      reboot_ ? reboot_() : Status(Error(Errc::failed_precondition, "no reboot hook"));
  // The agent is being stopped under the reboot command (the reboot under
  // way stops it): the journal says reboot_requested with this boot, and the
  // next start finds out whether it happened.
  if (!rebooted && interrupted_) return StepRun::rebooting;
  if (!rebooted)
    return fail_step(
        spec, i,
        StepOutcome::failure("could not reboot the guest: " + rebooted.error().message +
                             "; reboot the VM, the plan continues after boot"));
  return StepRun::rebooting;
}

PlanEngine::StepRun PlanEngine::leave_interrupted(const PlanSpec& spec, size_t i) {
  // Still "running", in the phase it was in: the next start enters it again
  // and its check() decides. A planned stop is not one of the crashes that
  // max_entries counts.
  Status saved = commit([&](JournalState& st) {
    auto& r = st.steps[i];
    r.entries = std::max(0, r.entries - 1);
  });
  if (!saved) spdlog::warn("plan: {}", saved.error().message);
  spdlog::info(
      "plan: the agent is stopping: step {} stopped in phase {}; it resumes at the next "
      "start",
      spec.steps[i].id, record(i).phase);
  emit_step(spec, i, "progress",
            "the agent is stopping: the step was stopped and resumes when the agent starts again");
  return StepRun::interrupted;
}

PlanEngine::StepRun PlanEngine::run_step(const PlanSpec& spec, size_t i) {
  const StepSpec& sspec = spec.steps[i];
  auto created = steps_.create(sspec);
  if (!created) return fail_step(spec, i, StepOutcome::failure(created.error().message));
  Step& step = **created;

  StepRecord rec = record(i);
  bool verify_first = false;
  if (rec.state == StepState::reboot_requested) {
    std::string boot = boot_id(env_);
    if (!boot.empty() && boot == rec.boot_id) {
      // Same boot: the agent was stopped before the reboot happened, or the
      // reboot command did nothing. Ask again, a bounded number of times.
      if (rec.reboot_requests >= opts_.max_reboot_requests)
        return fail_step(spec, i,
                         StepOutcome::failure(
                             "asked the guest to reboot " + plural(rec.reboot_requests, "time") +
                             " but it is still in the same boot (boot id " + boot +
                             "): restart the VM from the host, then retry the plan"));
      emit_step(spec, i, "progress",
                "the reboot requested for this step has not happened yet: requesting it again");
      return request_reboot(spec, i, rec.message);
    }
    // A different boot (or one we cannot tell: then verify() is the judge).
    verify_first = true;
  }

  if (rec.entries >= opts_.max_entries)
    return fail_step(
        spec, i,
        StepOutcome::failure(
            "the agent stopped " + plural(rec.entries, "time") +
            " while running this step (crash or kill) without finishing it: marked failed "
            "instead of trying forever; see the agent's log (journalctl -u factory-agent), "
            "fix the cause, then retry the plan"));

  Status saved = commit([&](JournalState& st) {
    auto& r = st.steps[i];
    r.state = StepState::running;
    r.entries++;
    r.phase = verify_first ? "verify_after_reboot" : "check";
    if (r.started_at.empty()) r.started_at = now_text();
  });
  if (!saved)
    return fail_step(
        spec, i, StepOutcome::failure("cannot write the plan journal: " + saved.error().message));
  emit_step(spec, i, "started", verify_first ? "the guest rebooted: verifying" : "");

  int attempt_no = 0;
  auto progress = [this, &spec, i, &attempt_no](json fields) {
    json e = {{"kind", "progress"},
              {"plan_hash", spec.hash},
              {"step", spec.steps[i].id},
              {"state", "progress"},
              {"attempt", attempt_no}};
    if (fields.is_object())
      for (auto& [k, v] : fields.items())
        if (k != "kind" && k != "plan_hash" && k != "step") e[k] = v;
    emit(std::move(e));
  };
  StepContext ctx{env_, sspec, progress, Clock_::now() + sspec.timeout};
  auto set_phase = [&](const char* phase, bool count_attempt) {
    return commit([&](JournalState& st) {
      st.steps[i].phase = phase;
      if (count_attempt) st.steps[i].attempts++;
    });
  };

  bool first = true;
  while (true) {
    attempt_no = record(i).failures + 1;
    ctx.deadline = Clock_::now() + sspec.timeout;
    StepOutcome out;
    if (verify_first) {
      verify_first = false;
      out = guarded("verify", [&] { return step.verify(ctx); });
    } else {
      // (The entry above already journaled the first check.)
      if (!first)
        if (auto s = set_phase("check", false); !s)
          return fail_step(
              spec, i, StepOutcome::failure("cannot write the plan journal: " + s.error().message));
      Result<bool> done = Error(Errc::internal, "");
      try {
        done = step.check(ctx);
      } catch (const std::exception& e) {
        done = Error(Errc::internal, std::string("threw: ") + e.what() + " (a bug in the agent)");
      }
      if (done && *done) return succeed_step(spec, i, true, "already done");
      // A check the stop cut short proves nothing either way.
      if (interrupted_) return leave_interrupted(spec, i);
      if (!done) {
        out = StepOutcome::failure("check failed: " + done.error().message);
      } else {
        if (auto s = set_phase("apply", true); !s)
          return fail_step(
              spec, i, StepOutcome::failure("cannot write the plan journal: " + s.error().message));
        out = guarded("apply", [&] { return step.apply(ctx); });
        if (out.ok()) {
          if (auto s = set_phase("verify", false); !s)
            return fail_step(
                spec, i,
                StepOutcome::failure("cannot write the plan journal: " + s.error().message));
          out = guarded("verify", [&] { return step.verify(ctx); });
        }
      }
    }
    first = false;
    // What the stop cut short says nothing about the step; a step that got
    // done all the same is recorded as done.
    if (interrupted_ && !out.ok()) return leave_interrupted(spec, i);
    if (out.kind == StepOutcome::Kind::reboot_required) return request_reboot(spec, i, out.message);
    if (out.ok()) return succeed_step(spec, i, false, out.message);

    // A failed attempt.
    if (Clock_::now() > ctx.deadline)
      out.message = "timed out after " + format_duration(sspec.timeout) + ": " + out.message;
    int failures = 0;
    Status s = commit([&](JournalState& st) {
      auto& r = st.steps[i];
      failures = ++r.failures;
      r.message = out.message;
      r.output_tail = out.output_tail;
      r.diagnosis = out.diagnosis ? out.diagnosis->to_json() : json(nullptr);
    });
    if (!s) return fail_step(spec, i, out);
    if (failures > sspec.retries) return fail_step(spec, i, out);
    auto delay = opts_.retry_delay * failures;
    emit_step(spec, i, "progress",
              "attempt " + std::to_string(failures) + " of " + std::to_string(sspec.retries + 1) +
                  " failed: " + out.message + "; retrying in " +
                  format_duration(std::chrono::duration_cast<std::chrono::seconds>(delay)),
              out.output_tail, out.diagnosis ? out.diagnosis->to_json() : json(nullptr), failures);
    opts_.sleep(delay);
    if (interrupted_) return leave_interrupted(spec, i);
  }
}

// ---------------------------------------------------------------------------

json PlanEngine::status_json() const {
  std::lock_guard lock(mu_);
  if (!have_state_)
    return {{"state", "none"}, {"steps_total", 0}, {"steps_done", 0}, {"steps", json::array()}};
  json steps = json::array();
  for (auto& r : state_.steps)
    steps.push_back({{"id", r.id},
                     {"kind", r.kind},
                     {"state", agent::to_string(r.state)},
                     {"skipped", r.skipped},
                     {"attempts", r.attempts},
                     {"failures", r.failures},
                     {"entries", r.entries},
                     {"reboot_requests", r.reboot_requests},
                     {"message", r.message},
                     {"output_tail", r.output_tail},
                     {"diagnosis", r.diagnosis},
                     {"started_at", r.started_at},
                     {"finished_at", r.finished_at}});
  json out = {{"plan_hash", state_.plan_hash},
              {"tier", state_.tier},
              {"state", agent::to_string(state_.state)},
              {"steps_total", state_.steps.size()},
              {"steps_done", state_.steps_done()},
              {"updated_at", state_.updated_at},
              {"steps", steps}};
  if (state_.tier_upgrade.is_object()) {
    json tu = state_.tier_upgrade;
    tu.erase("previous_plan");
    out["tier_upgrade"] = tu;
  }
  return out;
}

}  // namespace factory::agent
