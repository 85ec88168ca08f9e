#pragma once
// The parameters of every built-in step kind, written once: names, types,
// defaults, ranges and which are required (catalog/README.md has the same
// table for people). Two readers, one table:
//  - the catalog validates each step with it when it loads, so an admin's
//    typo is one line at load time, not a guest failing halfway through its
//    first boot (the plan it sends keeps the params as written: its hash
//    does not move when a default does);
//  - every step kind in the agent builds itself from normalize_step_params(),
//    the params checked and every default filled in, and has no defaults of
//    its own.
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"

namespace factory::catalog {

enum class ParamType { string, integer, boolean, object, string_list, string_map, any };

struct ParamSchema {
  std::string name;
  ParamType type;
  bool required = false;
  // Filled in when the param is absent; null: it stays absent (the step
  // reads its absence, e.g. a script without a check).
  nlohmann::json default_value = nullptr;
  // A map with a fixed set of keys (nvidia_driver's repo): its keys, typed,
  // required and defaulted like the params themselves. Empty: any keys.
  std::vector<ParamSchema> fields = {};
  // For a missing required key: "required: <hint>" instead of "required for
  // a <kind> step".
  std::string required_hint = {};
};

struct StepKindSchema {
  std::string kind;
  std::vector<ParamSchema> params;
  // Ranges and rules across params, on the params with their defaults;
  // `where` ends in "params".
  Status (*check)(const nlohmann::json& params, const std::string& where);
  // What the catalog refuses on top, before `check`: guesses about the host
  // that the agent instead checks against the real guest when the step runs
  // (rke2: ranges that overlap the host cluster's likely ones). May be null.
  Status (*catalog_check)(const nlohmann::json& params, const std::string& where) = nullptr;
};

// Every built-in kind, in the order the catalog's errors list them.
const std::vector<StepKindSchema>& step_kind_schemas();
// The kind's schema, or null when there is no such kind.
const StepKindSchema* find_step_kind(std::string_view kind);
// The kinds' names, in the same order.
const std::vector<std::string>& step_kinds();

// Checks a step's params against its kind's schema and returns them with
// every default filled in. `where` names the step ("step 'nvidia-driver'");
// errors read "<where>: params.<key>: <what>".
Result<nlohmann::json> normalize_step_params(std::string_view kind, const nlohmann::json& params,
                                             const std::string& where);

// The same with the catalog's own rules on top (StepKindSchema::catalog_check).
Result<nlohmann::json> validate_catalog_step_params(std::string_view kind,
                                                    const nlohmann::json& params,
                                                    const std::string& where);

// The rke2 step's rule for a cluster's own ranges: pods and services must
// parse and not overlap, and the DNS service's address must lie among the
// services. Errors read "<where>.service-cidr: ..." (where: e.g. "params.config").
Status check_cluster_ranges(const std::string& cluster_cidr, const std::string& service_cidr,
                            const std::string& cluster_dns, const std::string& where);

}  // namespace factory::catalog
