#pragma once
// A plan as the agent receives it from the coordinator (contract/catalog.hpp's
// Tier::plan()): {"tier": "gpu-vm", "steps": [{id, kind, params,
// timeout_seconds, retries}, ...]}, content-addressed by catalog::plan_hash.
// The agent recomputes the hash itself rather than trusting a field beside it.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "agent/plan/step.hpp"
#include "common/error.hpp"

namespace factory::agent {

struct PlanSpec {
  std::string tier;
  std::string hash;    // catalog::plan_hash(raw)
  nlohmann::json raw;  // the plan as received, kept in the journal to resume after a reboot
  std::vector<StepSpec> steps;
};

// Unknown keys are ignored (a newer coordinator may add some); missing or
// mistyped required ones are an error naming the step and the key.
Result<PlanSpec> parse_plan(const nlohmann::json& plan);

}  // namespace factory::agent
