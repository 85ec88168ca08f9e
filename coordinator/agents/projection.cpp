#include "coordinator/agents/projection.hpp"

#include <spdlog/spdlog.h>

#include <map>
#include <set>

#include "common/display.hpp"
#include "common/durations.hpp"

namespace factory::coordinator {

namespace {

template <class T>
T& made(std::optional<T>& v) {
  if (!v) v.emplace();
  return *v;
}

// Each field the event has, over what was there.
template <class T>
void over(std::optional<T>& field, const std::optional<T>& from) {
  if (from) field = from;
}

store::DiagnosisRecord diagnosis_record(const AgentDiagnosis& d) {
  store::DiagnosisRecord r;
  r.code = d.code;
  r.summary = d.summary;
  r.fix = d.fix;
  if (!d.details.empty()) r.details = d.details;
  return r;
}

// Open: journaled and not yet over (failed is open: `tenant retry` goes on).
bool tier_upgrade_open(const store::TenantRecord& t) {
  if (!t.status.tier_upgrade) return false;
  const std::string s = t.status.tier_upgrade->state.value_or("");
  return s == "requested" || s == "running" || s == "rolling_back" || s == "failed";
}

// The agent's report of the tier upgrade its record journals (the
// coordinator's clock for the times). Another upgrade's id, or a turn the
// journal is already past, changes nothing.
bool project_tier_upgrade(store::TenantRecord& t, const TierUpgradeEvent& u) {
  if (!t.status.tier_upgrade || t.status.tier_upgrade->id != u.upgrade_id) return false;
  auto& j = *t.status.tier_upgrade;
  const std::string was = j.state.value_or("");
  const std::string to = u.state == "started" ? "running" : u.state;
  static const std::map<std::string, std::set<std::string>> kNext = {
      {"requested", {"running", "rolling_back", "succeeded", "rolled_back", "failed", "refused"}},
      {"running", {"rolling_back", "succeeded", "rolled_back", "failed"}},
      {"rolling_back", {"rolled_back", "failed"}},
      // `tenant retry` of what could not go back.
      {"failed", {"running", "succeeded", "rolled_back", "failed"}},
  };
  auto next = kNext.find(was);
  if (next == kNext.end() || !next->second.contains(to)) return false;
  const std::string now = format_rfc3339(Clock::now());
  j.state = to;
  if (to == "running" && !j.started_at) j.started_at = now;
  if (u.message) j.message = u.message;
  if (u.step) j.failed_step = u.step;
  if (u.diagnosis) j.diagnosis = diagnosis_record(*u.diagnosis);
  if (to == "running" || to == "rolling_back") {
    t.phase = "upgrading";
  } else if (to == "succeeded") {
    // The tenant's pins are the new plan's from now on.
    auto& pinned = made(t.status.tier_plan);
    pinned.hash = j.to_hash;
    pinned.plan = j.to_plan;
    pinned.pinned_at = now;
    j.failed_step.reset();
    j.diagnosis.reset();
    j.finished_at = now;
    t.phase = "ready";
  } else if (to == "rolled_back") {
    j.finished_at = now;
    t.phase = "ready";
  } else if (to == "failed") {
    t.phase = "degraded";
  } else if (to == "refused") {
    j.finished_at = now;
    if (t.phase == "upgrading") t.phase = "ready";
  }
  return true;
}

}  // namespace

// The agent's word on the order its tenant's journal holds, and on no
// other: an upgrade id the journal does not hold (an old order's, another
// tenant's, one made up) changes nothing, nor does a word on an order that
// has its outcome already (the coordinator's clock; the reason as text that
// is safe to show, which the decoder made sure of and sanitize keeps so).
bool project_upgrade(store::TenantRecord& t, const proto::AgentUpgradeEvent& e) {
  auto* j = t.status.agent_upgrade ? &*t.status.agent_upgrade : nullptr;
  const std::string state = j ? j->state.value_or("") : "";
  if (!j || j->upgrade_id.value_or("") != e.upgrade_id ||
      (state != "sent" && state != "installing")) {
    spdlog::info("agents: tenant {}: agent_upgrade {} for upgrade {} ignored: its journal holds {}",
                 t.name, proto::state_name(e.state), e.upgrade_id,
                 j ? j->upgrade_id.value_or("?") + " (" + (state.empty() ? "?" : state) + ")"
                   : std::string("no upgrade"));
    return false;
  }
  const std::string now = format_rfc3339(Clock::now());
  if (e.state == proto::AgentUpgradeState::installing) {
    if (state == "installing") return false;
    j->state = "installing";
    j->installing_at = now;
    return true;
  }
  j->state = proto::state_name(e.state);
  j->done_at = now;
  if (!e.reason.empty()) j->reason = display::sanitize(e.reason);
  // Upgraded to something else than was ordered is no success: the rollout holds.
  if (e.state == proto::AgentUpgradeState::upgraded && !e.to_version.empty() &&
      e.to_version != j->to_version.value_or("")) {
    j->state = "failed";
    j->reason = "the agent says it upgraded to " + e.to_version + ", not to the " +
                j->to_version.value_or("?") + " ordered";
  }
  return true;
}

std::string last_bytes(std::string_view tail, std::size_t max) {
  if (tail.size() <= max) return std::string(tail);
  tail.remove_prefix(tail.size() - max);
  while (!tail.empty() && (static_cast<unsigned char>(tail.front()) & 0xC0) == 0x80)
    tail.remove_prefix(1);
  return std::string(tail);
}

// The status keeps what the decoded event holds (AgentEvent::to_json, less
// its id, its kind and what names the step or plan), field by field.
bool project_event(store::TenantRecord& t, const AgentEvent& ev) {
  if (const auto* p = std::get_if<ProgressEvent>(&ev.body)) {
    auto& plan = made(t.status.plan);
    auto& steps = made(plan.steps);
    if (!steps.contains(p->step) && steps.size() >= kMaxProjectedSteps) return false;
    if (p->plan_hash) plan.hash = *p->plan_hash;
    auto& s = steps[p->step];
    // When the step began, on the agent's clock: a step that rebooted the
    // guest began before the reboot, not when it is verified after it.
    if (p->state == "started" && s.state.value_or("") != "reboot_requested" && ev.time)
      s.started_at = *ev.time;
    over(s.time, ev.time);
    if (ev.truncated) s.truncated = true;
    over(s.state, p->state);
    over(s.attempt, p->attempt);
    over(s.message, p->message);
    if (p->output_tail) s.output_tail = last_bytes(*p->output_tail);
    if (p->diagnosis) s.diagnosis = diagnosis_record(*p->diagnosis);
    over(s.percent, p->percent);
    over(s.completed, p->completed);
    over(s.total, p->total);
    over(s.allocatable, p->allocatable);
    over(s.expected, p->expected);
    if (p->ranges) s.ranges = p->ranges->to_json();
    if (t.phase == "pending" || t.phase == "enrolled") t.phase = "provisioning";
    return true;
  }
  if (const auto* p = std::get_if<PlanEvent>(&ev.body)) {
    auto& plan = made(t.status.plan);
    over(plan.time, ev.time);
    if (ev.truncated) plan.truncated = true;
    over(plan.hash, p->plan_hash);
    over(plan.tier, p->tier);
    over(plan.state, p->state);
    over(plan.steps_total, p->steps_total);
    over(plan.steps_done, p->steps_done);
    over(plan.message, p->message);
    over(plan.failed_step, p->failed_step);
    const std::string state = p->state.value_or("");
    if (tier_upgrade_open(t)) {
      // A tier upgrade's plans: its own reports say where the tenant is
      // (a failed step may yet go back, a success pins the new plan).
      if (state == "running")
        t.phase = "upgrading";
      else if (state == "failed" && t.status.tier_upgrade->state == "failed")
        t.phase = "degraded";
      return true;
    }
    if (state == "running")
      t.phase = "provisioning";
    else if (state == "succeeded")
      t.phase = "ready";
    else if (state == "failed")
      t.phase = "failed";
    return true;
  }
  if (const auto* u = std::get_if<TierUpgradeEvent>(&ev.body)) return project_tier_upgrade(t, *u);
  // Health is the latest sample (store::Store::put_health), not the record.
  if (const auto* d = std::get_if<DiagnosisEvent>(&ev.body)) {
    auto& all = made(t.status.diagnoses);
    if (!all.contains(d->diagnosis.code) && all.size() >= kMaxProjectedDiagnoses) return false;
    store::DiagnosisRecord r = diagnosis_record(d->diagnosis);
    r.kind = ev.kind;
    r.time = ev.time;
    if (ev.truncated) r.truncated = true;
    all[d->diagnosis.code] = std::move(r);
    return true;
  }
  // The guest got the notice of the drain its journal is on (the
  // coordinator's clock: the guest's is the tenant's). Another notice id
  // (an old drain's, or made up) changes nothing.
  if (const auto* m = std::get_if<MaintenanceEvent>(&ev.body)) {
    if (!t.status.maintenance || t.status.maintenance->notice_id != m->notice_id ||
        m->state != "received" || t.status.maintenance->guest_received_at)
      return false;
    t.status.maintenance->guest_received_at = format_rfc3339(Clock::now());
    return true;
  }
  if (const auto* u = std::get_if<AgentUpgradeReport>(&ev.body))
    return project_upgrade(t, u->report);
  if (const auto* u = std::get_if<EndpointUsageReport>(&ev.body))
    return project_endpoint_usage(t, u->usage, Clock::now());
  return false;
}

bool endpoint_key_known(const store::TenantRecord& t, const std::string& key) {
  if (!t.endpoint) return false;
  const auto& e = *t.endpoint;
  if (key == "default") return true;
  if (e.keys)
    for (const auto& k : *e.keys)
      if (k.name == key) return true;
  return e.usage && e.usage->totals_since_creation().contains(key);
}

bool project_endpoint_usage(store::TenantRecord& t, const proto::EndpointUsageEvent& u,
                            Clock::time_point received) {
  // Only the sender's own tenant's endpoint, and only under one of its
  // keys: "default", a named key it has, or one it had (a revoked key's
  // last counts come after its revocation, which leaves its name in usage).
  if (!t.endpoint) {
    spdlog::warn("agents: tenant {}: endpoint_usage from a tenant without an endpoint; ignored",
                 t.name);
    return false;
  }
  auto& e = *t.endpoint;
  if (!endpoint_key_known(t, u.key)) {
    spdlog::warn("agents: tenant {}: endpoint_usage for a key it does not have; ignored", t.name);
    return false;
  }
  if (!e.usage) e.usage.emplace();
  store::UsageCounts c{u.requests, u.errors, u.prompt_tokens, u.completion_tokens};
  if (auto st = e.usage->add(u.key, c, received); !st.ok()) {
    spdlog::warn("agents: tenant {}: endpoint_usage: {}", t.name, st.error().message);
    return false;
  }
  return true;
}

}  // namespace factory::coordinator
