// Agent self-update (agent_rollout.hpp), as members of the tenants service,
// which owns the records, the agents' seam and the maintenance thread.
#include "coordinator/tenants/agent_rollout.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>

#include "common/display.hpp"
#include "common/durations.hpp"
#include "coordinator/enroll/tenant_name.hpp"
#include "coordinator/tenants/record_facts.hpp"
#include "coordinator/tenants/service.hpp"

namespace factory::tenants {

using nlohmann::json;

std::string upgrade_state_words(const std::string& s) {
  if (s == "rolled_back") return "rolled back";
  return s;
}

Result<UpgradeRequest> UpgradeRequest::from_json(const json& body) {
  const char* want =
      "want {\"tenants\": [NAME, ...] | \"all\": true, \"max_unavailable\": N, "
      "\"confirm_within_s\": N, \"dry_run\": bool}";
  if (!body.is_object()) return Error(Errc::invalid_argument, want);
  UpgradeRequest r;
  for (const auto& [k, v] : body.items()) {
    if (k == "tenants" && v.is_array()) {
      for (const auto& n : v) {
        if (!n.is_string()) return Error(Errc::invalid_argument, "tenants: want names");
        const auto& name = n.get_ref<const std::string&>();
        if (auto st = enroll::validate_tenant_name(name); !st.ok()) return st.error();
        if (std::find(r.tenants.begin(), r.tenants.end(), name) == r.tenants.end())
          r.tenants.push_back(name);
      }
    } else if (k == "all" && v.is_boolean()) {
      r.all = v.get<bool>();
    } else if (k == "max_unavailable" && v.is_number_integer()) {
      auto n = v.get<long long>();
      if (n < 1 || n > kMaxUnavailableLimit)
        return Error(Errc::invalid_argument, "max_unavailable: want 1 to " +
                                                 std::to_string(kMaxUnavailableLimit) + ", got " +
                                                 std::to_string(n));
      r.max_unavailable = static_cast<int>(n);
    } else if (k == "confirm_within_s" && v.is_number_integer()) {
      auto n = v.get<long long>();
      namespace lim = proto::agent_upgrade_limits;
      if (n < lim::kMinConfirmSeconds || n > lim::kMaxConfirmSeconds)
        return Error(Errc::invalid_argument, "confirm_within_s: want " +
                                                 std::to_string(lim::kMinConfirmSeconds) + " to " +
                                                 std::to_string(lim::kMaxConfirmSeconds) +
                                                 " seconds, got " + std::to_string(n));
      r.confirm_within_s = static_cast<int>(n);
    } else if (k == "dry_run" && v.is_boolean()) {
      r.dry_run = v.get<bool>();
    } else {
      return Error(Errc::invalid_argument,
                   std::string(want) + "; not " + display::sanitize(k.substr(0, 40)));
    }
  }
  if (r.all == !r.tenants.empty())
    return Error(Errc::invalid_argument,
                 r.all ? "name tenants or ask for all of them, not both"
                       : "name the tenants to upgrade, or ask for all of them (\"all\": true)");
  return r;
}

json UpgradeEntry::to_json() const {
  json j = {{"tenant", tenant}, {"version", version}, {"connected", connected}};
  if (!action.empty()) j["action"] = action;
  if (!why.empty()) j["why"] = why;
  if (!state.empty()) j["state"] = state;
  if (!upgrade_id.empty()) j["upgrade_id"] = upgrade_id;
  if (order >= 0) j["order"] = order;
  if (!reason.empty()) j["reason"] = reason;
  if (!sent_at.empty()) j["sent_at"] = sent_at;
  if (!done_at.empty()) j["done_at"] = done_at;
  return j;
}

json AgentRolloutView::to_json() const {
  json list = json::array();
  for (const auto& t : tenants) list.push_back(t.to_json());
  json j = {{"dry_run", dry_run},
            {"version", version},
            {"sha256", sha256},
            {"binary", binary_path},
            {"size", size},
            {"max_unavailable", max_unavailable},
            {"confirm_within_s", confirm_within_s},
            {"tenants", list},
            {"done", done}};
  if (!rollout_id.empty()) j["rollout_id"] = rollout_id;
  if (!cannot_upgrade.empty()) j["cannot_upgrade"] = cannot_upgrade;
  return j;
}

namespace {

std::string journal_state(const store::TenantRecord& t) {
  return t.status.agent_upgrade ? t.status.agent_upgrade->state.value_or("") : "";
}

// "up-<unix ms>": rollouts sort by when they began; each tenant's upgrade
// id is the rollout's and its place in it, within the contract's 64.
std::string new_rollout_id(Clock::time_point now) {
  return "up-" +
         std::to_string(
             std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count());
}

UpgradeEntry journal_entry(const store::TenantRecord& t) {
  UpgradeEntry e;
  e.tenant = t.name;
  const auto& j = *t.status.agent_upgrade;
  e.state = j.state.value_or("");
  e.upgrade_id = j.upgrade_id.value_or("");
  e.order = j.order.value_or(-1);
  e.reason = j.reason.value_or("");
  e.sent_at = j.sent_at.value_or("");
  e.done_at = j.done_at.value_or("");
  return e;
}

}  // namespace

std::string TenantService::agent_version_of(const store::TenantRecord& t) const {
  auto p = deps_.view.presence(t.name);
  if (p && !p->version.empty()) return p->version;
  return t.agent.version.value_or("");
}

std::string TenantService::agent_binary_sha256() const {
  if (!deps_.agent_binary) return opts_.agent_binary_sha256;
  auto s = deps_.agent_binary->current();
  return s && s->readable() ? s->sha256 : "";
}

// The order as the contract types it, from the journal alone: the same
// order at every connection and after a restart.
std::optional<json> TenantService::upgrade_command(const store::TenantRecord& t) const {
  if (!t.status.agent_upgrade) return std::nullopt;
  const auto& j = *t.status.agent_upgrade;
  if (!upgrade_in_flight(j.state.value_or(""))) return std::nullopt;
  // An agent that runs the version ordered has done it; its report follows.
  auto p = deps_.view.presence(t.name);
  if (p && p->version == j.to_version.value_or("")) return std::nullopt;
  proto::AgentUpgradeOrder o;
  o.upgrade_id = j.upgrade_id.value_or("");
  o.version = j.to_version.value_or("");
  o.sha256 = j.to_sha256.value_or("");
  o.url = j.url.value_or("");
  o.size = j.size.value_or(0);
  o.confirm_within_s = j.confirm_within_s.value_or(proto::kDefaultConfirmSeconds);
  json body = o.to_json();
  // Only what the agent's own decoder takes is sent: a journal damaged by
  // hand sends nothing.
  if (!proto::decode_agent_upgrade_order(body)) return std::nullopt;
  return body;
}

void TenantService::announce_upgrade(const std::string& tenant,
                                     const store::AgentUpgradeJournal& j) {
  if (!deps_.announce) return;
  const std::string state = j.state.value_or("");
  json a = {{"action", "agent_upgrade"},
            {"state", state},
            {"event", "upgrade_" + state},
            {"upgrade_id", j.upgrade_id.value_or("")},
            {"rollout_id", j.rollout_id.value_or("")},
            {"from_version", j.from_version.value_or("")},
            {"to_version", j.to_version.value_or("")}};
  if (j.reason) a["reason"] = *j.reason;
  deps_.announce(tenant, a);
}

bool TenantService::move_upgrade(const std::string& tenant, const std::string& from,
                                 const std::string& to, const std::string& reason) {
  std::optional<store::AgentUpgradeJournal> after;
  auto r = deps_.store.update_tenant(tenant, [&](store::TenantRecord& t) {
    if (journal_state(t) != from) return Status{};
    auto& j = *t.status.agent_upgrade;
    j.state = to;
    const std::string now = now_str();
    if (to == "sent")
      j.sent_at = now;
    else
      j.done_at = now;
    if (!reason.empty()) j.reason = reason;
    j.announced = to;
    after = j;
    return Status{};
  });
  if (!r) {
    spdlog::warn("tenants: agent upgrade of {}: not journaled {}: {}", tenant, to,
                 r.error().message);
    return false;
  }
  if (!after) return false;
  announce_upgrade(tenant, *after);
  if (upgrade_went_wrong(to) || to == "upgraded")
    if (deps_.count_upgrade) deps_.count_upgrade(to);
  return true;
}

Result<AgentRolloutView> TenantService::upgrade_agents(const UpgradeRequest& req) {
  if (!deps_.agent_binary)
    return Error(Errc::failed_precondition, "this coordinator serves no agent binary");
  // Read again for every request: the rollout installs the file as it is now.
  auto bin = deps_.agent_binary->refresh();
  std::lock_guard changes(changes_mu_);
  AgentRolloutView out;
  out.dry_run = req.dry_run;
  out.binary_path = bin->path;
  out.version = bin->version;
  out.sha256 = bin->sha256;
  out.size = bin->size;
  out.cannot_upgrade = bin->cannot_upgrade();
  out.max_unavailable = req.max_unavailable;
  out.confirm_within_s = req.confirm_within_s;

  auto records = deps_.store.list_tenants();
  std::sort(records.begin(), records.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  std::map<std::string, const store::TenantRecord*> by_name;
  for (const auto& t : records) by_name[t.name] = &t;
  std::vector<const store::TenantRecord*> chosen;
  if (req.all) {
    for (const auto& t : records) chosen.push_back(&t);
  } else {
    for (const auto& n : req.tenants) {
      auto it = by_name.find(n);
      if (it == by_name.end()) return Error(Errc::not_found, "no tenant named " + n);
      chosen.push_back(it->second);
    }
  }
  // A rollout under way is anyone's with a tenant pending, sent or installing.
  const store::TenantRecord* busy = nullptr;
  for (const auto& t : records)
    if (upgrade_under_way(journal_state(t))) {
      busy = &t;
      break;
    }
  for (const auto* t : chosen) {
    UpgradeEntry e;
    e.tenant = t->name;
    e.version = agent_version_of(*t);
    auto p = deps_.view.presence(t->name);
    e.connected = p && p->connected;
    const std::string js = journal_state(*t);
    if (t->phase == "deleting") {
      e.why = "being deleted";
    } else if (!t->agent.enrolled_at && !t->agent.agent_id) {
      e.why = "never enrolled";
    } else if (t->agent.revoked_at) {
      e.why = "its agent was revoked";
    } else if (upgrade_under_way(js)) {
      e.why = "an upgrade under way (" + t->status.agent_upgrade->upgrade_id.value_or("?") + ", " +
              js + ")";
    } else if (!bin->version.empty() && e.version == bin->version) {
      e.action = "current";
    } else if (!e.connected) {
      e.why = "not connected";
    } else {
      e.action = "upgrade";
    }
    if (!e.why.empty()) e.action = "skip";
    if (t->status.agent_upgrade) {
      e.state = js;
      e.upgrade_id = t->status.agent_upgrade->upgrade_id.value_or("");
    }
    out.tenants.push_back(std::move(e));
  }
  if (req.dry_run) {
    out.done = true;
    return out;
  }
  if (!out.cannot_upgrade.empty()) return Error(Errc::failed_precondition, out.cannot_upgrade);
  if (busy) {
    const auto& j = *busy->status.agent_upgrade;
    return Error(Errc::conflict, "a rollout is under way: " + j.rollout_id.value_or("?") + " (" +
                                     busy->name + " is " + j.state.value_or("?") + ", to " +
                                     j.to_version.value_or("?") +
                                     "); follow it with `factory agents upgrade status`");
  }
  const auto now = Clock::now();
  out.rollout_id = new_rollout_id(now);
  // Downloadable by its hash until the next rollout, whatever the file does.
  deps_.agent_binary->keep_for_orders(bin);
  // 2. Every tenant journaled first, then every one announced: no order
  // goes before the whole rollout is on record.
  int order = 0;
  std::vector<std::string> journaled;
  for (auto& e : out.tenants) {
    if (e.action != "upgrade") continue;
    store::AgentUpgradeJournal j;
    j.state = "pending";
    j.rollout_id = out.rollout_id;
    j.order = order;
    j.upgrade_id = out.rollout_id + "-" + std::to_string(order);
    ++order;
    j.max_unavailable = req.max_unavailable;
    j.from_version = e.version;
    j.to_version = bin->version;
    j.to_sha256 = bin->sha256;
    j.size = bin->size;
    j.url = opts_.agent_binary_url + "?sha256=" + bin->sha256;
    j.confirm_within_s = req.confirm_within_s;
    j.requested_at = format_rfc3339(now);
    j.announced = "pending";
    auto r = deps_.store.update_tenant(e.tenant, [&](store::TenantRecord& t) {
      t.status.agent_upgrade = j;
      return Status{};
    });
    if (!r) {
      e.why = "not journaled: " + r.error().message;
      e.action = "skip";
      continue;
    }
    e.state = "pending";
    e.upgrade_id = *j.upgrade_id;
    e.order = *j.order;
    journaled.push_back(e.tenant);
  }
  for (const auto& name : journaled)
    if (auto t = deps_.store.get_tenant(name); t && t->status.agent_upgrade)
      announce_upgrade(name, *t->status.agent_upgrade);
  spdlog::info("tenants: agent rollout {}: {} tenant(s) to {} (sha256 {}), {} at a time",
               out.rollout_id, journaled.size(), bin->version, bin->sha256, req.max_unavailable);
  out.done = journaled.empty();
  upgrade_rescan_ = true;
  wake_maintenance();
  return out;
}

Result<AgentRolloutView> TenantService::agent_rollout() {
  AgentRolloutView out;
  std::vector<store::TenantRecord> in;
  for (auto& t : deps_.store.list_tenants()) {
    if (!t.status.agent_upgrade) continue;
    const std::string id = t.status.agent_upgrade->rollout_id.value_or("");
    if (id > out.rollout_id) {
      out.rollout_id = id;
      in.clear();
    }
    if (id == out.rollout_id) in.push_back(std::move(t));
  }
  if (deps_.agent_binary) {
    auto bin = deps_.agent_binary->current();
    out.binary_path = bin->path;
    out.cannot_upgrade = bin->cannot_upgrade();
  }
  out.done = true;
  for (const auto& t : in) {
    const auto& j = *t.status.agent_upgrade;
    out.version = j.to_version.value_or("");
    out.sha256 = j.to_sha256.value_or("");
    out.size = j.size.value_or(0);
    out.max_unavailable = j.max_unavailable.value_or(1);
    out.confirm_within_s = j.confirm_within_s.value_or(proto::kDefaultConfirmSeconds);
    UpgradeEntry e = journal_entry(t);
    e.version = agent_version_of(t);
    auto p = deps_.view.presence(t.name);
    e.connected = p && p->connected;
    e.action = "upgrade";
    if (upgrade_under_way(e.state)) out.done = false;
    out.tenants.push_back(std::move(e));
  }
  std::sort(out.tenants.begin(), out.tenants.end(),
            [](const auto& a, const auto& b) { return a.order < b.order; });
  return out;
}

void TenantService::rollout_pass() {
  std::lock_guard changes(changes_mu_);
  const auto now = Clock::now();
  // Every record every kMaintenanceScanEvery (a rollout another replica
  // took is found then) or when woken; between, the tenants left to watch.
  std::vector<store::TenantRecord> records;
  auto watched = [](const store::TenantRecord& t) {
    if (!t.status.agent_upgrade) return false;
    const auto& j = *t.status.agent_upgrade;
    return upgrade_under_way(j.state.value_or("")) || j.announced != j.state;
  };
  if (upgrade_rescan_.exchange(false) || now - upgrade_last_scan_ >= kMaintenanceScanEvery) {
    upgrade_last_scan_ = now;
    upgrade_tenants_.clear();
    records = deps_.store.tenants_where(watched);
    for (const auto& t : records) upgrade_tenants_.insert(t.name);
  } else {
    for (auto it = upgrade_tenants_.begin(); it != upgrade_tenants_.end();) {
      auto t = deps_.store.get_tenant(*it);
      if (!t || !watched(*t)) {
        it = upgrade_tenants_.erase(it);
        continue;
      }
      records.push_back(std::move(*t));
      ++it;
    }
  }
  if (records.empty()) return;
  // Held tenants of a rollout are not watched, so the rollout's whole
  // story is read from every record once something of it is.
  std::map<std::string, std::vector<store::TenantRecord>> rollouts;
  std::set<std::string> live;
  for (const auto& t : records) live.insert(t.status.agent_upgrade->rollout_id.value_or(""));
  for (auto& t : deps_.store.tenants_where([&live](const store::TenantRecord& r) {
         return r.status.agent_upgrade &&
                live.count(r.status.agent_upgrade->rollout_id.value_or(""));
       }))
    rollouts[t.status.agent_upgrade->rollout_id.value_or("")].push_back(std::move(t));

  for (auto& [id, tenants] : rollouts) {
    std::sort(tenants.begin(), tenants.end(), [](const auto& a, const auto& b) {
      return a.status.agent_upgrade->order.value_or(0) < b.status.agent_upgrade->order.value_or(0);
    });
    // 4. What the agents said (projected by the agents module), announced
    // and counted once; the late ones judged.
    for (auto& t : tenants) {
      auto& j = *t.status.agent_upgrade;
      const std::string s = j.state.value_or("");
      if (j.announced != j.state && !upgrade_under_way(s) && s != "held" && s != "cancelled") {
        auto r = deps_.store.update_tenant(t.name, [&](store::TenantRecord& rec) {
          if (rec.status.agent_upgrade && rec.status.agent_upgrade->state == j.state)
            rec.status.agent_upgrade->announced = j.state;
          return Status{};
        });
        if (r) {
          spdlog::info("tenants: agent upgrade of {}: {}{}", t.name, upgrade_state_words(s),
                       j.reason ? ": " + *j.reason : "");
          announce_upgrade(t.name, j);
          if (deps_.count_upgrade) deps_.count_upgrade(s);
          j.announced = j.state;
        }
      } else if (s == "installing" && j.announced != j.state) {
        auto r = deps_.store.update_tenant(t.name, [&](store::TenantRecord& rec) {
          if (journal_state(rec) == "installing")
            rec.status.agent_upgrade->announced = "installing";
          return Status{};
        });
        if (r) announce_upgrade(t.name, j);
        j.announced = j.state;
      }
      if (!upgrade_in_flight(s)) continue;
      auto sent = parse_rfc3339(j.sent_at.value_or(""));
      const auto deadline =
          (sent ? *sent : now) +
          std::chrono::seconds(j.confirm_within_s.value_or(proto::kDefaultConfirmSeconds)) +
          opts_.upgrade_grace;
      if (now < deadline) continue;
      auto p = deps_.view.presence(t.name);
      const bool connected = p && p->connected;
      const std::string version = agent_version_of(t);
      if (connected && version == j.to_version.value_or("")) {
        if (move_upgrade(t.name, s, "upgraded",
                         "the agent runs " + version + "; its own report never came"))
          j.state = "upgraded";
      } else if (move_upgrade(t.name, s, "failed",
                              "no outcome within " +
                                  format_duration(std::chrono::duration_cast<std::chrono::seconds>(
                                      now - (sent ? *sent : now))) +
                                  " of the order; its agent is " +
                                  (connected ? "connected" : "not connected") + ", running " +
                                  (version.empty() ? "an unknown version" : version))) {
        j.state = "failed";
      }
    }
    // What the judgements above wrote, read back.
    for (auto& t : tenants)
      if (auto fresh = deps_.store.get_tenant(t.name); fresh && fresh->status.agent_upgrade)
        t = std::move(*fresh);
    // 5. The first that went wrong holds the rest.
    const store::TenantRecord* wrong = nullptr;
    for (const auto& t : tenants)
      if (upgrade_went_wrong(t.status.agent_upgrade->state.value_or("")) &&
          (!wrong || t.status.agent_upgrade->done_at < wrong->status.agent_upgrade->done_at))
        wrong = &t;
    if (wrong) {
      const auto& w = *wrong->status.agent_upgrade;
      const std::string why = "held: " + wrong->name + " " +
                              upgrade_state_words(w.state.value_or("")) +
                              (w.reason && !w.reason->empty() ? ": " + *w.reason : "");
      for (auto& t : tenants)
        if (t.status.agent_upgrade->state == "pending" &&
            move_upgrade(t.name, "pending", "held", why))
          t.status.agent_upgrade->state = "held";
      continue;
    }
    // 3. The next orders, within max_unavailable, in the rollout's order.
    int in_flight = 0, max_unavailable = 1;
    for (const auto& t : tenants) {
      const auto& j = *t.status.agent_upgrade;
      if (upgrade_in_flight(j.state.value_or(""))) ++in_flight;
      max_unavailable = std::max(max_unavailable, j.max_unavailable.value_or(1));
    }
    for (auto& t : tenants) {
      if (in_flight >= max_unavailable) break;
      auto& j = *t.status.agent_upgrade;
      if (j.state != "pending") continue;
      // The binary the rollout ordered must still be served by its hash.
      if (deps_.agent_binary && !deps_.agent_binary->by_sha256(j.to_sha256.value_or(""))) {
        auto cur = deps_.agent_binary->current();
        move_upgrade(t.name, "pending", "failed",
                     "the agent binary changed since the rollout began (" + cur->path + " is now " +
                         (cur->version.empty() ? "unversioned" : cur->version) + ", sha256 " +
                         (cur->sha256.empty() ? "none" : cur->sha256) + "): start a new rollout");
        break;  // the next pass holds the rest
      }
      if (!move_upgrade(t.name, "pending", "sent", "")) continue;
      ++in_flight;
      auto rec = deps_.store.get_tenant(t.name);
      auto order = rec ? upgrade_command(*rec) : std::nullopt;
      const bool delivered =
          order && agent_connected(t.name) && deps_.agents.send_command(t.name, *order);
      spdlog::info("tenants: agent upgrade {} of {} to {}: ordered{}", j.upgrade_id.value_or(""),
                   t.name, j.to_version.value_or(""),
                   delivered ? "" : " (its agent gets it when it connects)");
    }
  }
}

}  // namespace factory::tenants
