#include "agent/plan/engine.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <thread>

#include "agent/guest/facts.hpp"
#include "common/durations.hpp"
#include "common/subprocess.hpp"
#include "contract/catalog.hpp"

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
    if (finished) return report_finished(*spec);
    return execute(*spec);
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
  if (loaded.state.state != PlanState::running) return report_finished(*spec);
  return execute(*spec);
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
  return execute(*spec);
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
  return {{"plan_hash", state_.plan_hash},
          {"tier", state_.tier},
          {"state", agent::to_string(state_.state)},
          {"steps_total", state_.steps.size()},
          {"steps_done", state_.steps_done()},
          {"updated_at", state_.updated_at},
          {"steps", steps}};
}

}  // namespace factory::agent
