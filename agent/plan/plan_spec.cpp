#include "agent/plan/plan_spec.hpp"

#include <set>

#include "contract/catalog.hpp"

namespace factory::agent {

namespace {
Error bad(const std::string& where, const std::string& what) {
  return Error(Errc::protocol, "plan: " + where + ": " + what);
}
}  // namespace

Result<PlanSpec> parse_plan(const nlohmann::json& plan) {
  if (!plan.is_object()) return bad("document", "must be an object with tier and steps");
  if (!plan.contains("tier") || !plan["tier"].is_string() ||
      plan["tier"].get<std::string>().empty())
    return bad("tier", "required (a string)");
  if (!plan.contains("steps") || !plan["steps"].is_array() || plan["steps"].empty())
    return bad("steps", "required (a non-empty list)");
  PlanSpec spec;
  spec.tier = plan["tier"].get<std::string>();
  spec.raw = plan;
  spec.hash = catalog::plan_hash(plan);
  std::set<std::string> ids;
  for (size_t i = 0; i < plan["steps"].size(); ++i) {
    const auto& s = plan["steps"][i];
    std::string where = "steps[" + std::to_string(i) + "]";
    if (!s.is_object()) return bad(where, "must be an object");
    if (!s.contains("id") || !s["id"].is_string() || s["id"].get<std::string>().empty())
      return bad(where + ".id", "required (a string)");
    StepSpec st;
    st.id = s["id"].get<std::string>();
    where = "step '" + st.id + "'";
    if (!ids.insert(st.id).second) return bad(where, "duplicate step id");
    if (!s.contains("kind") || !s["kind"].is_string() || s["kind"].get<std::string>().empty())
      return bad(where + ": kind", "required (a string)");
    st.kind = s["kind"].get<std::string>();
    if (s.contains("params")) {
      if (!s["params"].is_object()) return bad(where + ": params", "must be an object");
      st.params = s["params"];
    }
    if (s.contains("timeout_seconds")) {
      if (!s["timeout_seconds"].is_number_integer() || s["timeout_seconds"].get<int64_t>() <= 0)
        return bad(where + ": timeout_seconds", "must be a positive whole number");
      st.timeout = std::chrono::seconds(s["timeout_seconds"].get<int64_t>());
    }
    if (s.contains("retries")) {
      if (!s["retries"].is_number_integer() || s["retries"].get<int64_t>() < 0 ||
          s["retries"].get<int64_t>() > 100)
        return bad(where + ": retries", "must be a whole number from 0 to 100");
      st.retries = s["retries"].get<int>();
    }
    spec.steps.push_back(std::move(st));
  }
  return spec;
}

}  // namespace factory::agent
