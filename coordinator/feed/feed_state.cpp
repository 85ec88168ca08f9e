#include "coordinator/feed/feed_state.hpp"

#include <algorithm>

#include "common/durations.hpp"
#include "common/json_writer.hpp"
#include "coordinator/feed/tenant_view.hpp"

namespace factory::feed {

namespace {

// A field of another replica's event or note, as text; `fallback` when it
// is absent or not text (a row of the log is read, never trusted to throw).
std::string text_of(const nlohmann::json& j, const char* key, const std::string& fallback = "") {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : fallback;
}

bool says_connected(const nlohmann::json& j) {
  auto it = j.find("connected");
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

// An agent's connection as another replica said it (its `agent` event, or
// an entry of its note): who the agent is and where from, connected, held by
// `origin`. last_seen is the caller's: the two say it under different keys.
void take_remote_connection(AgentPresence& p, const nlohmann::json& d, const std::string& origin) {
  p.agent_id = text_of(d, "agent_id", "");
  p.version = text_of(d, "version", "");
  p.hostname = text_of(d, "hostname", "");
  p.remote = text_of(d, "remote_address", "");
  p.connected_since = text_of(d, "connected_since", "");
  p.connected = true;
  p.disconnect.clear();
  p.disconnect_detail.clear();
  p.replica = origin;
}

}  // namespace

void FeedState::agent_connected(const std::string& tenant, AgentPresence presence) {
  presence.connected = true;
  presence.disconnect.clear();
  presence.disconnect_detail.clear();
  presence.replica.clear();
  // Published under the lock (the bus never calls back into FeedState
  // while it holds its own): a presence note (send_note) is then either
  // before this event in the log and without this agent, or after it.
  std::lock_guard lk(mu_);
  auto& p = presence_[tenant];
  // The spool counters carry over: the agent reports them again soon.
  presence.dropped_events = p.dropped_events;
  presence.pending_events = p.pending_events;
  p = presence;
  local_connect_id_[tenant] = 0;
  bus_.publish("agent", tenant,
               {{"connected", true},
                {"state", "connected"},
                {"agent_id", presence.agent_id},
                {"version", presence.version},
                {"hostname", presence.hostname},
                {"remote_address", presence.remote},
                {"connected_since", presence.connected_since}});
}

void FeedState::agent_seen(const std::string& tenant, const std::string& at) {
  std::lock_guard lk(mu_);
  if (auto it = presence_.find(tenant); it != presence_.end()) it->second.last_seen = at;
}

void FeedState::agent_spool(const std::string& tenant, std::uint64_t pending,
                            std::uint64_t dropped) {
  std::lock_guard lk(mu_);
  if (auto it = presence_.find(tenant); it != presence_.end()) {
    it->second.pending_events = pending;
    it->second.dropped_events = dropped;
  }
}

void FeedState::agent_disconnected(const std::string& tenant, const std::string& at,
                                   const std::string& how, const std::string& detail) {
  std::lock_guard lk(mu_);
  // Only an agent that is on show: after forget() (the tenant was deleted
  // while its connection was closing) nothing comes back.
  auto it = presence_.find(tenant);
  if (it == presence_.end()) return;
  auto& p = it->second;
  // An agent that connected to another replica since: that connection is
  // the one on show, and this (older) one's end changes nothing.
  if (p.replica.empty()) {
    p.connected = false;
    p.last_seen = at;
    p.disconnect = how;
    p.disconnect_detail = detail;
  }
  bus_.publish("agent", tenant,
               {{"connected", false}, {"state", how}, {"detail", detail}, {"last_seen", at}});
}

EventBusOptions FeedState::hooked(EventBusOptions o) {
  if (!o.log) return o;
  o.on_logged = [this, theirs = std::move(o.on_logged)](const FeedEvent& e, bool own, bool live) {
    from_log(e, own, live);
    if (theirs) theirs(e, own, live);
  };
  o.on_heartbeat = [this, theirs = std::move(o.on_heartbeat)] {
    {
      std::lock_guard lk(mu_);
      send_note();
    }
    if (theirs) theirs();
  };
  return o;
}

void FeedState::send_note() {
  nlohmann::json agents = nlohmann::json::object();
  for (const auto& [tenant, p] : presence_)
    if (p.connected && p.replica.empty())
      agents[tenant] = {{"agent_id", p.agent_id},
                        {"version", p.version},
                        {"hostname", p.hostname},
                        {"remote_address", p.remote},
                        {"connected_since", p.connected_since},
                        {"last_seen", p.last_seen}};
  bus_.publish_note({{"agents", std::move(agents)}});
}

void FeedState::from_log(const FeedEvent& e, bool own, bool live) {
  // What was in the log before this replica started says nothing of now:
  // the replicas' next notes do.
  if (!live || e.origin.empty()) return;
  std::lock_guard lk(mu_);
  if (own) {
    // This replica's own connection: where it stands in the log's order.
    if (e.type != "agent") return;
    auto it = presence_.find(e.tenant);
    auto c = local_connect_id_.find(e.tenant);
    if (it == presence_.end() || !it->second.replica.empty() || c == local_connect_id_.end())
      return;
    auto d = nlohmann::json::parse(e.data, nullptr, false);
    if (d.is_object() && says_connected(d)) c->second = e.id;
    return;
  }
  heard_[e.origin] = std::chrono::steady_clock::now();
  if (e.type == EventBus::kNoteType) return apply_note_locked(e);
  if (e.type != "agent") return;
  auto d = nlohmann::json::parse(e.data, nullptr, false);
  if (!d.is_object()) return;
  auto it = presence_.find(e.tenant);
  if (says_connected(d)) {
    if (it != presence_.end() && it->second.connected && it->second.replica.empty()) {
      // Connected here too: the newer of the two connections stays.
      auto c = local_connect_id_.find(e.tenant);
      const std::uint64_t here = c == local_connect_id_.end() ? 0 : c->second;
      if (here == 0 || e.id < here) return;
    }
    auto& p = presence_[e.tenant];
    take_remote_connection(p, d, e.origin);
    p.last_seen = text_of(d, "time", p.connected_since);
    local_connect_id_.erase(e.tenant);
    return;
  }
  // Only the replica holding the connection ends it.
  if (it == presence_.end() || it->second.replica != e.origin) return;
  auto& p = it->second;
  p.connected = false;
  p.last_seen = text_of(d, "last_seen", p.last_seen);
  p.disconnect = text_of(d, "state", "lost");
  p.disconnect_detail = text_of(d, "detail", "");
}

void FeedState::apply_note_locked(const FeedEvent& e) {
  auto d = nlohmann::json::parse(e.data, nullptr, false);
  if (!d.is_object() || !d.contains("agents") || !d["agents"].is_object()) return;
  const auto& agents = d["agents"];
  for (const auto& [tenant, a] : agents.items()) {
    if (!a.is_object()) continue;
    auto it = presence_.find(tenant);
    // A note fills in what this replica did not hear of (it started after
    // the agent connected); it never takes an agent from a connection that
    // is on show elsewhere (here, or another replica).
    if (it != presence_.end() && it->second.connected && it->second.replica != e.origin) continue;
    auto& p = presence_[tenant];
    const std::string last_seen = p.last_seen;
    take_remote_connection(p, a, e.origin);
    p.last_seen = text_of(a, "last_seen", last_seen);
  }
  // What the replica no longer lists, it no longer holds (its
  // `disconnected`, which says how, follows or came before).
  for (auto& [tenant, p] : presence_)
    if (p.connected && p.replica == e.origin && !agents.contains(tenant)) {
      p.connected = false;
      p.disconnect = "lost";
      p.disconnect_detail = "no longer connected to coordinator replica " + e.origin;
    }
}

AgentPresence FeedState::shown_locked(AgentPresence p,
                                      std::chrono::steady_clock::time_point now) const {
  if (!p.connected || p.replica.empty()) return p;
  auto h = heard_.find(p.replica);
  if (h != heard_.end() && now - h->second <= replica_ttl_) return p;
  p.connected = false;
  p.disconnect = "lost";
  p.disconnect_detail =
      "coordinator replica " + p.replica + " holding the connection has not " +
      "been heard from for " +
      std::to_string(std::chrono::duration_cast<std::chrono::seconds>(replica_ttl_).count()) + " s";
  return p;
}

void FeedState::health_changed(const std::string& tenant, const store::LatestHealth& sample) {
  // The feed is an edge: the sample leaves as JSON here, written straight
  // to bytes (every agent's every sample comes this way). The value is
  // publish()'s of {"health": sample.to_json(), "diagnoses":
  // active_diagnoses(no plan, health)}: FeedStateEvents in
  // tests/coordinator/event_bus_test.cpp holds it to that.
  JsonText w(2560);
  w.begin_object();
  w.key("diagnoses");
  w.begin_array();
  for (const proto::DiagnosisSample* d : sample.sample.all_diagnoses()) {
    // active_diagnoses()'s form, from the health.
    w.begin_object();
    w.key("code");
    w.value(d->code);
    w.key("summary");
    w.value(d->summary);
    w.key("fix");
    w.value(d->fix);
    w.key("details");
    w.value(d->details);
    w.key("source");
    w.value("health");
    w.end_object();
  }
  w.end_array();
  w.key("health");
  w.raw(sample.to_text());
  w.key("tenant");
  w.value(tenant);
  w.key("time");
  w.value(format_rfc3339(Clock::now()));
  w.end_object();
  bus_.publish_text("health", tenant, w.take());
}

void FeedState::phase_now(const std::string& tenant, const std::string& phase) {
  if (phase.empty()) return;
  {
    std::lock_guard lk(mu_);
    auto& last = phases_[tenant];
    if (last == phase) return;
    last = phase;
  }
  bus_.publish("phase", tenant, {{"phase", phase}});
}

void FeedState::event_stored(const std::string& tenant, nlohmann::json event,
                             const store::TenantRecord* after) {
  const std::string kind = event.value("kind", "");
  nlohmann::json plan;
  if (after && after->status.plan) {
    // Where the plan is (state, steps_done, steps_total) without every
    // step's record, which the progress event itself updates: never the
    // steps (a copy of them per event was most of a flood's allocations).
    plan = after->status.plan->to_json(/*with_steps=*/false);
  }
  if (kind == "progress" || kind == "plan") {
    nlohmann::json d = std::move(event);
    d.erase("kind");
    d.erase("id");
    if (!plan.is_null()) d["plan"] = plan;
    bus_.publish(kind, tenant, std::move(d));
  } else if (kind == "diagnosis") {
    nlohmann::json d = std::move(event);
    d.erase("kind");
    d.erase("id");
    bus_.publish("diagnosis", tenant, std::move(d));
  } else if (kind == "tier_upgrade") {
    // The agent's turn of a tier upgrade, with the journal it made of it.
    nlohmann::json d = std::move(event);
    d.erase("kind");
    d.erase("id");
    if (after && after->status.tier_upgrade) {
      d["tier_upgrade"] = after->status.tier_upgrade->to_json();
      d["tier_upgrade"].erase("to_plan");
    }
    bus_.publish("tier_upgrade", tenant, std::move(d));
  }
  if (after) phase_now(tenant, after->phase);
}

void FeedState::forget(const std::string& tenant) {
  std::lock_guard lk(mu_);
  presence_.erase(tenant);
  local_connect_id_.erase(tenant);
  for (auto* counts : {&rejected_, &over_quota_})
    for (auto it = counts->lower_bound({tenant, ""});
         it != counts->end() && it->first.first == tenant;)
      it = counts->erase(it);
  health_samples_.erase(tenant);
  phases_.erase(tenant);
}

void FeedState::count_rejected(const std::string& tenant, const std::string& reason,
                               std::uint64_t n) {
  std::lock_guard lk(mu_);
  rejected_[{tenant, reason}] += n;
}

void FeedState::count_over_quota(const std::string& tenant, const std::string& quota) {
  std::lock_guard lk(mu_);
  over_quota_[{tenant, quota}] += 1;
}

FeedState::TenantCounts FeedState::rejected() const {
  std::lock_guard lk(mu_);
  return rejected_;
}

FeedState::TenantCounts FeedState::over_quota() const {
  std::lock_guard lk(mu_);
  return over_quota_;
}

void FeedState::count_health_sample(const std::string& tenant) {
  std::lock_guard lk(mu_);
  ++health_samples_[tenant];
}

std::map<std::string, std::uint64_t> FeedState::health_samples() const {
  std::lock_guard lk(mu_);
  return health_samples_;
}

void FeedState::count_event(const std::string& kind) {
  // The kinds the agent sends; a label per made-up kind would let an agent
  // grow the metrics without bound.
  static const char* const known[] = {"progress",      "plan",      "diagnosis",   "health",
                                      "journal_reset", "synthetic", "tier_upgrade"};
  std::string k = "other";
  for (const char* x : known)
    if (kind == x) k = x;
  std::lock_guard lk(mu_);
  ++events_by_kind_[k];
}

std::map<std::string, std::uint64_t> FeedState::events_by_kind() const {
  std::lock_guard lk(mu_);
  return events_by_kind_;
}

void FeedState::observe_step(const std::string& tier, const std::string& kind,
                             const std::string& result, double seconds) {
  std::lock_guard lk(mu_);
  auto& s = steps_.series[{tier, kind, result}];
  for (size_t i = 0; i < StepDurations::kBuckets.size(); ++i)
    if (seconds <= StepDurations::kBuckets[i]) ++s.buckets[i];
  ++s.count;
  s.sum += seconds;
}

StepDurations FeedState::step_durations() const {
  std::lock_guard lk(mu_);
  return steps_;
}

std::optional<AgentPresence> FeedState::presence(const std::string& tenant) const {
  std::lock_guard lk(mu_);
  auto it = presence_.find(tenant);
  if (it == presence_.end()) return std::nullopt;
  return shown_locked(it->second, std::chrono::steady_clock::now());
}

std::map<std::string, AgentPresence> FeedState::all() const {
  std::lock_guard lk(mu_);
  const auto now = std::chrono::steady_clock::now();
  std::map<std::string, AgentPresence> out;
  for (const auto& [tenant, p] : presence_) out.emplace(tenant, shown_locked(p, now));
  return out;
}

std::size_t FeedState::connected_count() const {
  std::lock_guard lk(mu_);
  const auto now = std::chrono::steady_clock::now();
  return static_cast<std::size_t>(
      std::count_if(presence_.begin(), presence_.end(),
                    [&](const auto& p) { return shown_locked(p.second, now).connected; }));
}

void FeedState::set_leadership(const std::string& replica, bool leading) {
  std::lock_guard lk(mu_);
  leadership_ = Leadership{replica, leading};
}

std::optional<FeedState::Leadership> FeedState::leadership() const {
  std::lock_guard lk(mu_);
  return leadership_;
}

void FeedState::set_agent_binary(nlohmann::json info) {
  std::lock_guard lk(mu_);
  agent_binary_ = std::move(info);
}

nlohmann::json FeedState::agent_binary() const {
  std::lock_guard lk(mu_);
  return agent_binary_;
}

void FeedState::count_agent_upgrade(const std::string& result) {
  std::lock_guard lk(mu_);
  ++agent_upgrades_[result];
}

std::map<std::string, std::uint64_t> FeedState::agent_upgrades() const {
  std::lock_guard lk(mu_);
  return agent_upgrades_;
}

}  // namespace factory::feed
