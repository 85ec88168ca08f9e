#include "contract/tier_upgrade.hpp"

#include <algorithm>
#include <cctype>
#include <set>

#include "common/display.hpp"
#include "common/pki.hpp"
#include "common/validation.hpp"
#include "contract/catalog.hpp"
#include "contract/protocol.hpp"

namespace factory::proto {

using nlohmann::json;

namespace {

constexpr const char* kWhat = "tier upgrade";

Error bad(const std::string& field, const std::string& why) {
  return validation::bad(std::string(kWhat) + ": " + field, why);
}

bool is_upgrade_id(std::string_view s) {
  if (s.empty() || s.size() > tier_upgrade_limits::kUpgradeId) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

constexpr std::pair<TierUpgradeState, const char*> kStates[] = {
    {TierUpgradeState::started, "started"},     {TierUpgradeState::rolling_back, "rolling_back"},
    {TierUpgradeState::succeeded, "succeeded"}, {TierUpgradeState::rolled_back, "rolled_back"},
    {TierUpgradeState::failed, "failed"},       {TierUpgradeState::refused, "refused"},
};

}  // namespace

const char* state_name(TierUpgradeState s) {
  for (auto& [v, n] : kStates)
    if (v == s) return n;
  return "unknown";
}

std::optional<TierUpgradeState> tier_upgrade_state_from(std::string_view s) {
  for (auto& [v, n] : kStates)
    if (s == n) return v;
  return std::nullopt;
}

bool is_final(TierUpgradeState s) {
  return s != TierUpgradeState::started && s != TierUpgradeState::rolling_back;
}

json TierUpgradeOrder::to_json() const {
  return {{"action", action::kTierUpgrade},
          {"upgrade_id", upgrade_id},
          {"from_hash", from_hash},
          {"to_hash", to_hash},
          {"plan", plan},
          {"steps", steps}};
}

Result<TierUpgradeOrder> decode_tier_upgrade_order(const json& body) {
  if (!body.is_object())
    return Error(Errc::invalid_argument,
                 std::string(kWhat) + ": want an object, got " + validation::type_name(body));
  if (auto it = body.find("action");
      it != body.end() && !(it->is_string() && *it == action::kTierUpgrade))
    return bad("action", std::string("want '") + std::string(action::kTierUpgrade) + "'");
  TierUpgradeOrder o;
  auto id = validation::string_field(body, "upgrade_id", kWhat);
  if (!id) return id.error();
  if (!is_upgrade_id(*id))
    return bad("upgrade_id",
               "want 1 to 64 characters of A-Z a-z 0-9 . _ -, got " + validation::quoted(*id));
  o.upgrade_id = std::move(*id);
  for (auto [key, out] : {std::pair{"from_hash", &o.from_hash}, std::pair{"to_hash", &o.to_hash}}) {
    auto h = validation::string_field(body, key, kWhat);
    if (!h) return h.error();
    if (!pki::is_sha256_hex(*h))
      return bad(key, "want 64 lower-case hex digits, got " + validation::quoted(*h));
    *out = std::move(*h);
  }
  auto plan = body.find("plan");
  if (plan == body.end() || !plan->is_object())
    return bad("plan", plan == body.end() ? "missing" : "want an object");
  const std::string got = catalog::plan_hash(*plan);
  if (got != o.to_hash) return bad("plan", "hashes to " + got + ", not to_hash " + o.to_hash);
  o.plan = *plan;
  std::set<std::string> ids;
  if (plan->contains("steps") && (*plan)["steps"].is_array())
    for (const auto& s : (*plan)["steps"])
      if (s.is_object() && s.contains("id") && s["id"].is_string())
        ids.insert(s["id"].get<std::string>());
  auto steps = body.find("steps");
  if (steps == body.end() || !steps->is_array())
    return bad("steps", steps == body.end() ? "missing" : "want a list of step ids");
  if (steps->size() > tier_upgrade_limits::kSteps)
    return bad("steps", std::to_string(steps->size()) + " ids, more than the plan can have");
  for (const auto& s : *steps) {
    if (!s.is_string()) return bad("steps", "want step ids, got " + validation::type_name(s));
    if (!ids.contains(s.get<std::string>()))
      return bad("steps", "the plan has no step " + validation::quoted(s.get<std::string>()));
    o.steps.push_back(s.get<std::string>());
  }
  return o;
}

}  // namespace factory::proto

namespace factory::catalog {

using nlohmann::json;

namespace {

const char* change_name(StepChange::Kind k) {
  switch (k) {
    case StepChange::Kind::changed:
      return "changed";
    case StepChange::Kind::added:
      return "added";
    case StepChange::Kind::removed:
      return "removed";
  }
  return "changed";
}

json steps_of(const json& plan) {
  if (plan.is_object() && plan.contains("steps") && plan["steps"].is_array()) return plan["steps"];
  return json::array();
}

const json* find_step(const json& steps, const std::string& id) {
  for (const auto& s : steps)
    if (s.is_object() && s.value("id", "") == id) return &s;
  return nullptr;
}

// The keys of two params objects that differ, as "params.<key>" (one level:
// a chart's values differ as "params.values").
void params_fields(const json& a, const json& b, std::vector<std::string>& out) {
  std::set<std::string> keys;
  for (const auto* o : {&a, &b})
    if (o->is_object())
      for (auto& [k, v] : o->items()) keys.insert(k);
  for (const auto& k : keys) {
    const json va = a.is_object() && a.contains(k) ? a[k] : json();
    const json vb = b.is_object() && b.contains(k) ? b[k] : json();
    if (va != vb) out.push_back("params." + k);
  }
}

}  // namespace

json StepChange::to_json() const {
  return {{"id", id},
          {"kind", kind},
          {"change", change_name(change)},
          {"fields", fields},
          {"can_go_back", can_go_back}};
}

json PinChange::to_json() const {
  return {{"what", what},
          {"from", from.empty() ? json(nullptr) : json(from)},
          {"to", to.empty() ? json(nullptr) : json(to)}};
}

std::vector<std::string> PlanDiff::to_run() const {
  std::vector<std::string> out;
  for (const auto& s : steps)
    if (s.change != StepChange::Kind::removed) out.push_back(s.id);
  return out;
}

json PlanDiff::to_json() const {
  json s = json::array(), p = json::array();
  for (const auto& c : steps) s.push_back(c.to_json());
  for (const auto& c : pins) p.push_back(c.to_json());
  return {{"steps", s}, {"pins", p}, {"sections", sections}, {"runs", to_run()}};
}

bool step_kind_can_go_back(std::string_view kind) {
  // The driver's previous packages are still in its repository (the local
  // repository package of each version stays installed), so the step run
  // with the previous params puts them back; the others' installers cannot
  // say the same of what they replaced.
  return kind == "nvidia_driver";
}

PlanDiff diff_plans(const json& from, const json& to) {
  PlanDiff d;
  const json a = steps_of(from), b = steps_of(to);
  for (const auto& s : b) {
    if (!s.is_object()) continue;
    const std::string id = s.value("id", "");
    StepChange c;
    c.id = id;
    c.kind = s.value("kind", "");
    const json* old = find_step(a, id);
    if (!old) {
      c.change = StepChange::Kind::added;
      d.steps.push_back(std::move(c));
      continue;
    }
    if (old->value("kind", "") != c.kind) c.fields.push_back("kind");
    params_fields(old->value("params", json::object()), s.value("params", json::object()),
                  c.fields);
    for (const char* k : {"timeout_seconds", "retries"})
      if (old->value(k, json()) != s.value(k, json())) c.fields.push_back(k);
    if (c.fields.empty()) continue;
    c.can_go_back = old->value("kind", "") == c.kind && step_kind_can_go_back(c.kind);
    d.steps.push_back(std::move(c));
  }
  for (const auto& s : a) {
    if (!s.is_object()) continue;
    const std::string id = s.value("id", "");
    if (find_step(b, id)) continue;
    StepChange c;
    c.id = id;
    c.kind = s.value("kind", "");
    c.change = StepChange::Kind::removed;
    d.steps.push_back(std::move(c));
  }
  // Pins by what they pin: a version that moved, appeared or went.
  const auto pa = plan_pins(from), pb = plan_pins(to);
  auto version_of = [](const std::vector<Pin>& ps, const std::string& what) -> const Pin* {
    for (const auto& p : ps)
      if (p.what == what) return &p;
    return nullptr;
  };
  for (const auto& p : pb) {
    const Pin* o = version_of(pa, p.what);
    if (!o || o->version != p.version) d.pins.push_back({p.what, o ? o->version : "", p.version});
  }
  for (const auto& p : pa)
    if (!version_of(pb, p.what)) d.pins.push_back({p.what, p.version, ""});
  // What else the plan carries (the health collectors, the endpoint).
  std::set<std::string> keys;
  for (const auto* o : {&from, &to})
    if (o->is_object())
      for (auto& [k, v] : o->items()) keys.insert(k);
  for (const auto& k : keys) {
    if (k == "steps" || k == "tier") continue;
    const json va = from.is_object() && from.contains(k) ? from[k] : json();
    const json vb = to.is_object() && to.contains(k) ? to[k] : json();
    if (va != vb) d.sections.push_back(k);
  }
  return d;
}

}  // namespace factory::catalog
