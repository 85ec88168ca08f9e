// Tier upgrades for running tenants (issue 27, point 3; docs/tier-upgrades.md).
//
// A tenant runs the plan kept in its record (status.tier_plan), not the
// catalog's of the day: a coordinator started with a newer catalog changes
// nothing in the guest until the admin asks. `tier_upgrade` compares the two
// (catalog::diff_plans), journals the upgrade in the record
// (status.tier_upgrade, state requested), announces it on the feed, and
// only then sends the agent the order; the agent runs the changed steps
// from its own journal and reports each turn (the agents module projects
// those reports onto the record: projection.cpp). What the agent is owed
// after a reconnection, and which plan it is sent at hello, follow from the
// journal alone, so a coordinator killed anywhere carries on.
#include "contract/tier_upgrade.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/pki.hpp"
#include "contract/pins.hpp"
#include "contract/protocol.hpp"
#include "coordinator/tenants/record_facts.hpp"
#include "coordinator/tenants/service.hpp"

namespace factory::tenants {

using nlohmann::json;

namespace {

std::string tier_upgrade_state(const store::TenantRecord& t) {
  return t.status.tier_upgrade ? t.status.tier_upgrade->state.value_or("") : "";
}

// Between the journal and the agent's last word: the agent's plan journal,
// not the coordinator's, says which plan runs, so no plan is sent at hello.
bool tier_upgrade_open(const store::TenantRecord& t) {
  const std::string s = tier_upgrade_state(t);
  return s == "requested" || s == "running" || s == "rolling_back" || s == "failed";
}

std::vector<std::string> step_ids(const json& plan) {
  std::vector<std::string> ids;
  if (plan.is_object() && plan.contains("steps") && plan["steps"].is_array())
    for (const auto& s : plan["steps"])
      if (s.is_object() && s.contains("id") && s["id"].is_string())
        ids.push_back(s["id"].get<std::string>());
  return ids;
}

}  // namespace

std::optional<json> TenantService::running_plan(const store::TenantRecord& t) const {
  if (t.status.tier_plan && t.status.tier_plan->plan && t.status.tier_plan->hash)
    return json{{"hash", *t.status.tier_plan->hash}, {"plan", *t.status.tier_plan->plan}};
  // A record from before plans were kept: the catalog's, unless the agent
  // reported another plan (then which one it runs is the agent's to know).
  auto current = catalog_plan_for(t);
  if (!current) return std::nullopt;
  const std::string reported =
      t.status.plan ? t.status.plan->hash.value_or(std::string()) : std::string();
  if (!reported.empty() && reported != (*current)["hash"].get<std::string>()) return std::nullopt;
  return current;
}

std::optional<json> TenantService::plan_for(const store::TenantRecord& t) const {
  if (tier_upgrade_open(t)) return std::nullopt;
  auto plan = running_plan(t);
  if (!plan) {
    if (!t.tier.empty() && catalog_.find(t.tier))
      spdlog::warn(
          "tenants: tenant {} runs plan {}, which its record does not hold (recorded before "
          "tenants kept their plan): no plan sent; `factory tenant upgrade {}` moves it to the "
          "catalog's",
          t.name, t.status.plan ? t.status.plan->hash.value_or("?") : "?", t.name);
    return std::nullopt;
  }
  if (!t.status.tier_plan) {
    // Kept from now on: the plan this tenant was given is its pins. Queued
    // to the store's writer; nothing here waits (the io thread calls this).
    deps_.store.update_tenant_async(
        t.name,
        [hash = (*plan)["hash"].get<std::string>(),
         body = (*plan)["plan"]](store::TenantRecord& r) {
          if (r.status.tier_plan) return Status{};
          r.status.tier_plan.emplace();
          r.status.tier_plan->hash = hash;
          r.status.tier_plan->plan = body;
          r.status.tier_plan->pinned_at = now_str();
          return Status{};
        },
        nullptr);
  }
  return plan;
}

std::optional<std::vector<std::string>> TenantService::plan_step_ids(
    const store::TenantRecord& t) const {
  std::vector<std::string> ids;
  bool any = false;
  if (auto p = running_plan(t)) {
    ids = step_ids((*p)["plan"]);
    any = true;
  }
  if (t.status.tier_upgrade && t.status.tier_upgrade->to_plan) {
    for (auto& id : step_ids(*t.status.tier_upgrade->to_plan))
      if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
    any = true;
  }
  if (!any) {
    // The plan is the agent's own (a record from before plans were kept):
    // what it reported is what may be named.
    if (t.tier.empty()) return std::nullopt;
    if (auto c = catalog_plan_for(t)) ids = step_ids((*c)["plan"]);
    if (t.status.plan && t.status.plan->steps)
      for (const auto& [id, s] : *t.status.plan->steps)
        if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  return ids;
}

std::optional<json> TenantService::tier_upgrade_owed(const store::TenantRecord& t) const {
  if (tier_upgrade_state(t) != "requested") return std::nullopt;
  const auto& u = *t.status.tier_upgrade;
  if (!u.to_plan || !u.id || !u.from_hash || !u.to_hash) return std::nullopt;
  proto::TierUpgradeOrder o;
  o.upgrade_id = *u.id;
  o.from_hash = *u.from_hash;
  o.to_hash = *u.to_hash;
  o.plan = *u.to_plan;
  o.steps = u.steps.value_or(std::vector<std::string>{});
  return o.to_json();
}

json TenantService::tier_pins_view(const store::TenantRecord& t) const {
  json v = json::object();
  auto running = running_plan(t);
  auto catalog = catalog_plan_for(t);
  const std::string reported =
      t.status.plan ? t.status.plan->hash.value_or(std::string()) : std::string();
  v["plan_hash"] = running ? (*running)["hash"] : json(reported.empty() ? json() : json(reported));
  v["catalog_plan_hash"] = catalog ? (*catalog)["hash"] : json();
  v["pins"] = running ? catalog::pins_json(catalog::plan_pins((*running)["plan"])) : json::array();
  if (!running)
    v["note"] =
        "the record does not hold the plan this tenant runs (kept since tier upgrades): its pins "
        "are the agent's";
  if (catalog) {
    auto diff = catalog::diff_plans(running ? (*running)["plan"] : json(), (*catalog)["plan"]);
    v["differs"] = !running || (*running)["hash"] != (*catalog)["hash"];
    v["changes"] = diff.to_json();
  }
  return v;
}

Result<json> TenantService::tier_upgrade(const std::string& name, bool dry_run) {
  std::lock_guard changes(changes_mu_);
  auto rec = deps_.store.get_tenant(name);
  if (!rec) return Error(Errc::not_found, "no tenant named " + name);
  if (rec->tier.empty())
    return Error(
        Errc::failed_precondition,
        "tenant " + name + " has no tier (made by `factory token create`): nothing to upgrade");
  if (!catalog_.find(rec->tier))
    return Error(Errc::failed_precondition, "tenant " + name + "'s tier " + rec->tier +
                                                " is not in catalog " + catalog_.source +
                                                ": there is nothing to upgrade it to");
  auto to = catalog_plan_for(*rec);
  if (!to) return Error(Errc::internal, "no plan for tier " + rec->tier);
  auto from = running_plan(*rec);
  const std::string reported =
      rec->status.plan ? rec->status.plan->hash.value_or(std::string()) : std::string();
  const std::string from_hash = from ? (*from)["hash"].get<std::string>() : reported;
  const std::string to_hash = (*to)["hash"].get<std::string>();
  auto diff = catalog::diff_plans(from ? (*from)["plan"] : json(), (*to)["plan"]);

  json out = {{"tenant", name},
              {"tier", rec->tier},
              {"from_hash", from_hash},
              {"to_hash", to_hash},
              {"steps", diff.to_json()["steps"]},
              {"pins", diff.to_json()["pins"]},
              {"sections", diff.sections},
              {"runs", diff.to_run()},
              {"dry_run", dry_run},
              {"upgraded", false}};
  if (from_hash == to_hash) {
    out["note"] = "tenant " + name + " already runs its tier's plan in catalog " + catalog_.source +
                  ": nothing to upgrade";
    return out;
  }
  if (dry_run) {
    out["note"] = diff.to_run().empty()
                      ? "no step changes; the plan's other sections do"
                      : "would run " + std::to_string(diff.to_run().size()) +
                            " step(s) in the guest, journaled like the first boot";
    return out;
  }

  const std::string open = tier_upgrade_state(*rec);
  if (open == "requested" || open == "running" || open == "rolling_back")
    return Error(Errc::failed_precondition, "tenant " + name + " has a tier upgrade under way (" +
                                                rec->status.tier_upgrade->id.value_or("") + ", " +
                                                open + "): follow it with `factory tenant show " +
                                                name + "`");
  if (open == "failed")
    return Error(Errc::failed_precondition,
                 "tenant " + name + "'s last tier upgrade failed at step '" +
                     rec->status.tier_upgrade->failed_step.value_or("?") +
                     "' and could not go back: fix the cause, then `factory tenant retry " + name +
                     "` finishes it");
  if (rec->phase != "ready")
    return Error(Errc::failed_precondition,
                 "tenant " + name + " is " + rec->phase +
                     ", not ready: an upgrade starts from a finished plan");
  if (from_hash.empty())
    return Error(Errc::failed_precondition,
                 "tenant " + name +
                     "'s agent has not said which plan it runs yet: try again once "
                     "it has connected");
  auto features = deps_.agents.agent_features(name);
  if (!features)
    return Error(Errc::failed_precondition,
                 "the agent of tenant " + name +
                     " is not connected: an upgrade is sent to a connected agent; try again once "
                     "it is");
  if (std::find(features->begin(), features->end(), std::string(proto::kFeatureTierUpgrade)) ==
      features->end())
    return Error(Errc::failed_precondition,
                 "the agent of tenant " + name + " (version " +
                     rec->agent.version.value_or("unknown") +
                     ") does not know tier upgrades and would run the new plan as a fresh one: "
                     "update its agent (factory agents upgrade), then run this again");

  // Journaled before anything is announced or sent.
  store::TierUpgradeJournal j;
  j.id = "tier-" + pki::random_hex(6);
  j.state = "requested";
  j.requested_at = now_str();
  j.from_hash = from_hash;
  j.to_hash = to_hash;
  j.to_plan = (*to)["plan"];
  j.steps = diff.to_run();
  j.pins = out["pins"];
  auto journaled = deps_.store.update_tenant(name, [&](store::TenantRecord& r) {
    r.status.tier_upgrade = j;
    return Status{};
  });
  if (!journaled)
    return journaled.error().with_context("journaling the tier upgrade of tenant " + name);
  if (deps_.announce)
    deps_.announce(name, {{"action", "tier_upgrade"},
                          {"state", "requested"},
                          {"upgrade_id", *j.id},
                          {"from_hash", from_hash},
                          {"to_hash", to_hash},
                          {"steps", *j.steps},
                          {"pins", *j.pins}});
  const bool sent = [&] {
    auto order = tier_upgrade_owed(*journaled);
    return order && deps_.agents.send_command(name, *order);
  }();
  spdlog::info("tenants: tier upgrade {} of {}: {} -> {}, steps {}{}", *j.id, name,
               from_hash.substr(0, 12), to_hash.substr(0, 12), json(*j.steps).dump(),
               sent ? "" : " (owed to the agent at its next connection)");
  out["upgrade_id"] = *j.id;
  out["upgraded"] = true;
  out["sent"] = sent;
  return out;
}

}  // namespace factory::tenants
