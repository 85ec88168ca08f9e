// Host maintenance: drain and undrain (maintenance.hpp), as members of the
// tenants service, which owns the provider, the records and the agents' seam.
#include "coordinator/tenants/maintenance.hpp"

#include <spdlog/spdlog.h>

#include <set>

#include "common/display.hpp"
#include "common/durations.hpp"
#include "contract/maintenance.hpp"
#include "coordinator/tenants/k8s_names.hpp"
#include "coordinator/tenants/record_facts.hpp"
#include "coordinator/tenants/service.hpp"

namespace factory::tenants {

using nlohmann::json;

bool holds_node_cordoned(const std::string& state) {
  return state == "noticed" || state == "stopping" || state == "drained";
}

json MaintenanceEntry::to_json() const {
  json j = {{"tenant", tenant},
            {"tier", tier},
            {"phase", phase},
            {"state", state},
            {"agent_connected", agent_connected},
            {"can_move", can_move}};
  if (!can_move) j["why_not"] = why_not;
  if (!deadline.empty()) j["deadline"] = deadline;
  if (!note.empty()) j["note"] = note;
  if (!error.empty()) j["error"] = error;
  return j;
}

json HostMaintenance::to_json() const {
  json list = json::array();
  for (const auto& t : tenants) list.push_back(t.to_json());
  json j = {{"node", node}, {"dry_run", dry_run}, {"tenants", list}, {"done", done}};
  if (!notice_id.empty()) j["notice_id"] = notice_id;
  if (!deadline.empty()) j["deadline"] = deadline;
  if (!unknown.empty()) j["unknown"] = unknown;
  return j;
}

namespace {

Status validate_node(const std::string& node) {
  if (!is_dns1123_subdomain(node))
    return Error(Errc::invalid_argument,
                 "node name '" + display::sanitize(node.substr(0, 80)) + "'" +
                     " is not a Kubernetes node name (lower-case letters, digits, '-' and '.', "
                     "at most 253): `kubectl get nodes` lists them");
  return {};
}

// A notice id a guest can quote back: "drain-<node>-<unix seconds>", cut to
// the 64 characters the contract allows.
std::string new_notice_id(const std::string& node, Clock::time_point now) {
  std::string id =
      "drain-" + node + "-" +
      std::to_string(
          std::chrono::duration_cast<std::chrono::seconds>(now.time_since_epoch()).count());
  if (id.size() > proto::maintenance_limits::kNoticeId)
    id = id.substr(id.size() - proto::maintenance_limits::kNoticeId);
  if (!id.empty() && (id.front() == '-' || id.front() == '.')) id.front() = 'd';
  return id;
}

bool past(const std::string& rfc3339, Clock::time_point now) {
  auto t = parse_rfc3339(rfc3339);
  return t && *t <= now;
}

}  // namespace

// What the agent is sent: the notice as the contract types it.
std::optional<json> TenantService::notice_command(const store::TenantRecord& t,
                                                  bool cancelled) const {
  const store::MaintenanceJournal& m = *t.status.maintenance;
  proto::MaintenanceNotice n;
  n.notice_id = m.notice_id.value_or("");
  n.state = cancelled ? proto::MaintenanceState::cancelled : proto::MaintenanceState::scheduled;
  n.node = m.node.value_or("");
  auto deadline = parse_rfc3339(m.deadline.value_or(""));
  if (!deadline) return std::nullopt;
  n.deadline = *deadline;
  n.message = m.note.value_or("");
  return n.to_json();
}

std::vector<json> TenantService::pending_commands(const store::TenantRecord& t) const {
  std::vector<json> out;
  if (maintenance_state(t) == "noticed" && !t.status.maintenance->guest_received_at)
    if (auto cmd = notice_command(t, false)) out.push_back(std::move(*cmd));
  if (auto order = upgrade_command(t)) out.push_back(std::move(*order));
  return out;
}

bool TenantService::agent_connected(const std::string& tenant) const {
  auto p = deps_.view.presence(tenant);
  return p && p->connected;
}

void TenantService::announce_maintenance(const std::string& tenant, const char* action,
                                         const std::string& state, json extra) {
  if (!deps_.announce) return;
  extra["action"] = action;
  extra["state"] = state;
  deps_.announce(tenant, extra);
}

Result<HostMaintenance> TenantService::host_view(const std::string& node, bool with_mobility) {
  HostMaintenance out;
  out.node = node;
  for (const auto& t : deps_.store.list_tenants()) {
    if (!has_vm(t) || kube_state(t) != "created" || t.phase == "deleting") continue;
    MaintenanceEntry e;
    e.tenant = t.name;
    e.tier = t.tier;
    e.phase = t.phase;
    e.agent_connected = agent_connected(t.name);
    const std::string state = maintenance_state(t);
    const bool journaled_here = t.status.maintenance && t.status.maintenance->node == node &&
                                !state.empty() && state != "back" && state != "cancelled";
    VmSpec vm = stored_vm(t);
    if (!journaled_here) {
      // Where it runs now, as the provider sees it.
      auto obs = provider_->observe(t.name, vm.ns);
      if (!obs) {
        out.unknown.push_back(t.name + ": " + obs.error().message);
        continue;
      }
      if (!obs->exists || obs->node != node || obs->instance.empty()) continue;
    } else {
      e.state = state;
      const auto& m = *t.status.maintenance;
      e.deadline = m.deadline.value_or("");
      e.note = m.note.value_or("");
      e.error = m.error.value_or("");
      e.can_move = m.move.value_or(false);
    }
    if (with_mobility) {
      auto mob = provider_->mobility(vm);
      if (mob) {
        e.can_move = mob->can_move;
        e.why_not = mob->why_not;
      } else {
        e.why_not = "could not tell: " + mob.error().message;
      }
    }
    out.tenants.push_back(std::move(e));
  }
  return out;
}

Result<HostMaintenance> TenantService::maintenance(const std::string& node) {
  if (auto st = validate_node(node); !st.ok()) return st.error();
  std::lock_guard changes(changes_mu_);
  auto view = host_view(node, false);
  if (!view) return view.error();
  // The states a drain or undrain ends in, and `back` shown once more.
  for (const auto& t : deps_.store.list_tenants()) {
    if (!t.status.maintenance || t.status.maintenance->node != node) continue;
    const std::string s = maintenance_state(t);
    if (s != "back" && s != "cancelled") continue;
    bool listed = false;
    for (auto& e : view->tenants)
      if (e.tenant == t.name) {
        e.state = s;
        listed = true;
      }
    if (!listed) {
      MaintenanceEntry e;
      e.tenant = t.name;
      e.tier = t.tier;
      e.phase = t.phase;
      e.state = s;
      e.agent_connected = agent_connected(t.name);
      view->tenants.push_back(std::move(e));
    }
  }
  bool done = true;
  for (const auto& e : view->tenants)
    if (e.state != "drained" && e.state != "back" && e.state != "cancelled") done = false;
  view->done = done;
  return view;
}

Result<HostMaintenance> TenantService::drain(const DrainRequest& req) {
  if (auto st = validate_node(req.node); !st.ok()) return st.error();
  if (req.notice.count() < 0) return Error(Errc::invalid_argument, "the notice cannot be negative");
  if (req.message.size() > proto::maintenance_limits::kMessage)
    return Error(Errc::invalid_argument, "the message is longer than " +
                                             std::to_string(proto::maintenance_limits::kMessage) +
                                             " bytes");
  std::lock_guard changes(changes_mu_);
  auto impact = host_view(req.node, true);
  if (!impact) return impact.error();
  if (!impact->unknown.empty() && !req.dry_run)
    return Error(
        Errc::unavailable,
        "cannot tell where every tenant runs, so nothing was done: " + impact->unknown.front() +
            (impact->unknown.size() > 1
                 ? " (and " + std::to_string(impact->unknown.size() - 1) + " more)"
                 : ""));
  const auto now = Clock::now();
  impact->notice_id = new_notice_id(req.node, now);
  impact->deadline = format_rfc3339(now + req.notice);
  if (req.dry_run) {
    impact->dry_run = true;
    return impact;
  }
  // 2. Journaled first: from here a killed coordinator carries on.
  for (auto& e : impact->tenants) {
    if (!e.state.empty()) continue;  // a drain of this node under way already
    store::MaintenanceJournal m;
    m.state = "noticed";
    m.node = req.node;
    m.notice_id = impact->notice_id;
    m.noticed_at = format_rfc3339(now);
    m.deadline = impact->deadline;
    m.move = req.move && e.can_move;
    if (!req.message.empty()) m.note = req.message;
    auto r = deps_.store.update_tenant(e.tenant, [&](store::TenantRecord& rec) {
      rec.status.maintenance = m;
      return Status{};
    });
    if (!r) {
      e.error = "not journaled: " + r.error().message;
      continue;
    }
    e.state = "noticed";
    e.deadline = impact->deadline;
  }
  // 3. No new VM on the node.
  if (auto st = provider_->set_node_schedulable(req.node, false); !st.ok())
    return st.error().with_context(
        "cordoning " + req.node +
        " (the tenants are journaled; the maintenance thread cordons it again)");
  cordoned_.insert(req.node);
  spdlog::info("tenants: drain of {}: {} tenant(s), notice until {}", req.node,
               impact->tenants.size(), impact->deadline);
  // 4. The notice: on the feed, then to each agent connected now (again
  // when one connects later: maintenance_pass).
  for (const auto& e : impact->tenants)
    if (e.state == "noticed") send_notice(e.tenant);
  wake_maintenance();
  impact->done = impact->tenants.empty();
  return impact;
}

void TenantService::send_notice(const std::string& tenant) {
  auto rec = deps_.store.get_tenant(tenant);
  if (!rec || maintenance_state(*rec) != "noticed") return;
  const auto& m = *rec->status.maintenance;
  if (!m.notice_sent_at) {
    // Announced once, before anything can act on the VM.
    announce_maintenance(tenant, "drain", "notice",
                         {{"node", m.node.value_or("")},
                          {"notice_id", m.notice_id.value_or("")},
                          {"deadline", m.deadline.value_or("")},
                          {"move", m.move.value_or(false)}});
  }
  auto cmd = notice_command(*rec, false);
  const bool sent = cmd && agent_connected(tenant) && deps_.agents.send_command(tenant, *cmd);
  auto r = deps_.store.update_tenant(tenant, [&](store::TenantRecord& t) {
    if (maintenance_state(t) != "noticed") return Status{};
    auto& j = *t.status.maintenance;
    // The feed's announcement is the notice of record; the agent's copy
    // is when it reached the guest.
    if (!j.notice_sent_at) j.notice_sent_at = now_str();
    if (sent) j.extra["agent_notified_at"] = now_str();
    return Status{};
  });
  if (!r) spdlog::warn("tenants: drain: {}: {}", tenant, r.error().message);
}

Result<HostMaintenance> TenantService::undrain(const UndrainRequest& req) {
  if (auto st = validate_node(req.node); !st.ok()) return st.error();
  std::lock_guard changes(changes_mu_);
  HostMaintenance out;
  out.node = req.node;
  out.dry_run = req.dry_run;
  std::vector<std::string> withdrawn;
  for (const auto& t : deps_.store.list_tenants()) {
    if (!t.status.maintenance || t.status.maintenance->node != req.node) continue;
    const std::string s = maintenance_state(t);
    if (s.empty() || s == "back" || s == "cancelled") continue;
    MaintenanceEntry e;
    e.tenant = t.name;
    e.tier = t.tier;
    e.phase = t.phase;
    e.agent_connected = agent_connected(t.name);
    // A notice not acted on is withdrawn; a stopped VM is started.
    e.state = s == "noticed" ? "cancelled" : "starting";
    out.tenants.push_back(e);
  }
  if (req.dry_run) return out;
  for (auto& e : out.tenants) {
    const bool cancel = e.state == "cancelled";
    auto r = deps_.store.update_tenant(e.tenant, [&](store::TenantRecord& t) {
      if (!t.status.maintenance) return Status{};
      auto& m = *t.status.maintenance;
      const std::string s = m.state.value_or("");
      if (cancel && s == "noticed") {
        m.state = "cancelled";
        m.cancelled_at = now_str();
      } else if (s == "stopping" || s == "drained") {
        m.state = "starting";
        m.start_requested_at = now_str();
        m.move = false;  // an undrain brings it back here
      }
      return Status{};
    });
    if (!r) {
      e.error = "not journaled: " + r.error().message;
      continue;
    }
    if (cancel) {
      announce_maintenance(e.tenant, "drain", "cancelled", {{"node", req.node}});
      if (auto cmd = notice_command(*r, true); cmd && e.agent_connected)
        deps_.agents.send_command(e.tenant, *cmd);
    } else {
      announce_maintenance(e.tenant, "undrain", "starting", {{"node", req.node}});
    }
  }
  if (auto st = provider_->set_node_schedulable(req.node, true); !st.ok())
    return st.error().with_context(
        "uncordoning " + req.node +
        " (the tenants are journaled; the maintenance thread uncordons it again)");
  cordoned_.erase(req.node);
  uncordoned_.insert(req.node);
  spdlog::info("tenants: undrain of {}: {} tenant(s)", req.node, out.tenants.size());
  wake_maintenance();
  out.done = out.tenants.empty();
  return out;
}

void TenantService::maintenance_pass() {
  std::lock_guard changes(changes_mu_);
  // A new leader makes the cordons its journals call for again.
  if (maint_forget_cordons_.exchange(false)) {
    cordoned_.clear();
    uncordoned_.clear();
  }
  const auto now = Clock::now();
  // Every record is read only every kMaintenanceScanEvery (a drain asked of
  // another replica is found then) or when woken by this one's drain or
  // undrain; between, only the tenants with a journal under way.
  std::vector<store::TenantRecord> records;
  if (maint_rescan_.exchange(false) || now - maint_last_scan_ >= kMaintenanceScanEvery) {
    // Only the tenants with a journal: nothing below acts on the others.
    records = deps_.store.tenants_where(
        [](const store::TenantRecord& t) { return t.status.maintenance.has_value(); });
    maint_last_scan_ = now;
    maint_tenants_.clear();
    for (const auto& t : records)
      if (const std::string s = maintenance_state(t); !s.empty() && s != "back" && s != "cancelled")
        maint_tenants_.insert(t.name);
  } else {
    for (auto it = maint_tenants_.begin(); it != maint_tenants_.end();) {
      auto t = deps_.store.get_tenant(*it);
      const std::string s = t ? maintenance_state(*t) : "";
      if (s.empty() || s == "back" || s == "cancelled") {
        it = maint_tenants_.erase(it);
        continue;
      }
      records.push_back(std::move(*t));
      ++it;
    }
  }
  // The cordons the journals call for, made again once per start of this
  // process (a coordinator killed between journal and cordon).
  std::set<std::string> hold, release;
  for (const auto& t : records) {
    if (!t.status.maintenance || !t.status.maintenance->node) continue;
    const std::string s = maintenance_state(t);
    if (holds_node_cordoned(s) || (s == "starting" && t.status.maintenance->move.value_or(false)))
      hold.insert(*t.status.maintenance->node);
    else if (s == "starting")
      release.insert(*t.status.maintenance->node);
  }
  // The node as the journals want it, made so once (tried again later on
  // failure).
  auto ensure = [&](const std::string& n, bool schedulable, std::set<std::string>& done) {
    const std::string key = (schedulable ? "uncordon " : "cordon ") + n;
    if (done.count(n) || !retry_due(key, now)) return;
    if (auto st = provider_->set_node_schedulable(n, schedulable); st.ok()) {
      done.insert(n);
      retry_clear(key);
    } else {
      spdlog::warn("tenants: maintenance: {}: {} (again in {} s)", key, st.error().message,
                   kRetryAfter.count());
      retry_later(key, now);
    }
  };
  for (const auto& n : hold) ensure(n, false, cordoned_);
  for (const auto& n : release)
    if (!hold.count(n)) ensure(n, true, uncordoned_);

  for (const auto& t : records) {
    if (!t.status.maintenance) continue;
    const store::MaintenanceJournal& m = *t.status.maintenance;
    const std::string s = m.state.value_or("");
    if (s == "noticed") {
      // The notice again to an agent connected since it was last sent, until
      // the guest says it has it (it keeps what it was told by the notice
      // id, so a second copy changes nothing).
      auto p = deps_.view.presence(t.name);
      const std::string sent = m.extra.value("agent_notified_at", std::string());
      const bool again =
          !m.guest_received_at && p && p->connected && (sent.empty() || p->connected_since > sent);
      if (!m.notice_sent_at || again) send_notice(t.name);
      if (!past(m.deadline.value_or(""), now)) continue;
      stop_for_maintenance(t);
    } else if (s == "stopping") {
      if (retry_due("stop " + t.name, now)) stop_for_maintenance(t);
    } else if (s == "starting") {
      if (retry_due("start " + t.name, now)) start_after_maintenance(t);
    }
  }
}

void TenantService::stop_for_maintenance(const store::TenantRecord& t) {
  const store::MaintenanceJournal& m = *t.status.maintenance;
  const std::string node = m.node.value_or("");
  VmSpec vm = stored_vm(t);
  if (maintenance_state(t) == "noticed") {
    // Journaled and announced before the provider is asked.
    auto obs = provider_->observe(t.name, vm.ns);
    auto r = deps_.store.update_tenant(t.name, [&](store::TenantRecord& rec) {
      if (maintenance_state(rec) != "noticed") return Status{};
      auto& j = *rec.status.maintenance;
      j.state = "stopping";
      j.stop_requested_at = now_str();
      if (obs) j.instance_before = obs->instance;
      return Status{};
    });
    if (!r) {
      spdlog::warn("tenants: drain: journaling the stop of {}: {}", t.name, r.error().message);
      return;
    }
    announce_maintenance(t.name, "drain", "stopping",
                         {{"node", node}, {"notice_id", m.notice_id.value_or("")}});
    vm.halted = true;
  }
  auto stopped = provider_->stop(vm);
  if (!stopped) {
    spdlog::warn("tenants: drain: stopping the VM of {}: {} (again in {} s)", t.name,
                 stopped.error().message, kRetryAfter.count());
    retry_later("stop " + t.name, Clock::now());
    record_error(t.name, stopped.error().message);
    return;
  }
  retry_clear("stop " + t.name);
  auto obs = provider_->observe(t.name, vm.ns);
  if (!obs || !obs->instance.empty()) return;  // shutting down: the next pass looks again
  const bool move = m.move.value_or(false);
  auto r = deps_.store.update_tenant(t.name, [&](store::TenantRecord& rec) {
    if (maintenance_state(rec) != "stopping") return Status{};
    auto& j = *rec.status.maintenance;
    j.state = move ? "starting" : "drained";
    j.stopped_at = now_str();
    j.error.reset();
    if (!stopped->note.empty()) j.extra["stop_note"] = stopped->note;
    if (move) j.start_requested_at = now_str();
    return Status{};
  });
  if (!r) return;
  spdlog::info("tenants: drain of {}: {} is off ({})", node, t.name, stopped->note);
  announce_maintenance(t.name, "drain", "drained", {{"node", node}, {"note", stopped->note}});
  if (move) announce_maintenance(t.name, "drain", "moving", {{"from_node", node}});
}

void TenantService::start_after_maintenance(const store::TenantRecord& t) {
  const store::MaintenanceJournal& m = *t.status.maintenance;
  VmSpec vm = stored_vm(t);  // halted false: the journal says starting
  if (auto st = provider_->start(vm); !st.ok()) {
    spdlog::warn("tenants: undrain: starting the VM of {}: {} (again in {} s)", t.name,
                 st.error().message, kRetryAfter.count());
    retry_later("start " + t.name, Clock::now());
    record_error(t.name, st.error().message);
    return;
  }
  retry_clear("start " + t.name);
  // Back once its agent is connected again since the start, with its plan
  // where it was (ready): the same identity, no new enrollment.
  auto p = deps_.view.presence(t.name);
  const std::string since = m.start_requested_at.value_or("");
  if (!p || !p->connected || p->connected_since < since || t.phase != "ready") return;
  auto obs = provider_->observe(t.name, vm.ns);
  const std::string node_after = obs ? obs->node : "";
  auto r = deps_.store.update_tenant(t.name, [&](store::TenantRecord& rec) {
    if (maintenance_state(rec) != "starting") return Status{};
    auto& j = *rec.status.maintenance;
    j.state = "back";
    j.back_at = now_str();
    j.node_after = node_after;
    j.error.reset();
    return Status{};
  });
  if (!r) return;
  spdlog::info("tenants: {} is back on {}", t.name, node_after.empty() ? "?" : node_after);
  announce_maintenance(t.name, m.move.value_or(false) ? "drain" : "undrain", "back",
                       {{"node", node_after}});
}

bool TenantService::retry_due(const std::string& key, Clock::time_point now) const {
  auto it = retry_at_.find(key);
  return it == retry_at_.end() || now >= it->second;
}
void TenantService::retry_later(const std::string& key, Clock::time_point now) {
  retry_at_[key] = now + kRetryAfter;
}
void TenantService::retry_clear(const std::string& key) {
  retry_at_.erase(key);
}

void TenantService::record_error(const std::string& tenant, const std::string& error) {
  auto r = deps_.store.update_tenant(tenant, [&](store::TenantRecord& rec) {
    if (rec.status.maintenance && rec.status.maintenance->error != error)
      rec.status.maintenance->error = error;
    return Status{};
  });
  if (!r) spdlog::warn("tenants: maintenance of {}: {}", tenant, r.error().message);
}

void TenantService::start_maintenance(std::chrono::milliseconds every) {
  std::lock_guard lk(maint_mu_);
  if (maint_thread_.joinable()) return;
  maint_every_ = every;
  maint_thread_ = std::thread([this] {
    std::unique_lock lk(maint_mu_);
    while (!maint_stop_) {
      maint_cv_.wait_for(lk, maint_every_, [this] { return maint_stop_ || maint_wake_; });
      maint_wake_ = false;
      if (maint_stop_) break;
      if (!maint_active_) continue;
      lk.unlock();
      try {
        maintenance_pass();
      } catch (const std::exception& e) {
        spdlog::error("tenants: maintenance pass: {}", e.what());
      }
      // Agent upgrades ride the same thread, leader and wake-ups.
      try {
        rollout_pass();
      } catch (const std::exception& e) {
        spdlog::error("tenants: agent rollout pass: {}", e.what());
      }
      // And GPU usage: one look at each VM, the leader's only.
      try {
        usage_pass();
      } catch (const std::exception& e) {
        spdlog::error("tenants: usage pass: {}", e.what());
      }
      lk.lock();
    }
  });
}

void TenantService::set_maintenance_active(bool active) {
  std::lock_guard lk(maint_mu_);
  if (active && !maint_active_) {
    maint_forget_cordons_ = true;
    maint_rescan_ = true;
    upgrade_rescan_ = true;
  }
  maint_active_ = active;
  maint_wake_ = true;
  maint_cv_.notify_all();
}

void TenantService::wake_maintenance() {
  maint_rescan_ = true;
  std::lock_guard lk(maint_mu_);
  maint_wake_ = true;
  maint_cv_.notify_all();
}

void TenantService::stop_maintenance() {
  {
    std::lock_guard lk(maint_mu_);
    maint_stop_ = true;
    maint_cv_.notify_all();
  }
  if (maint_thread_.joinable()) maint_thread_.join();
}

}  // namespace factory::tenants
