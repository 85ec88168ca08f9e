#pragma once
// Every version a tier depends on, and whether the catalog pins it: what
// `factory catalog show` and `factory tenant show` list, so a tier that
// leaves something to "whatever is newest" says so instead of hiding it.
// Read from the tier's resolved steps (the params the agent acts on), not
// from `versions`, which is for people and may name less than the steps use.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "contract/catalog.hpp"

namespace factory::catalog {

struct Pin {
  std::string what;     // "NVIDIA driver", "Helm", "chart gpu-operator", ...
  std::string version;  // empty: not pinned
  std::string where;    // "step 'nvidia-driver' params.version"
  std::string note;     // how it is held, or why it is not pinned
  bool pinned() const { return !version.empty(); }
};

std::vector<Pin> tier_pins(const Tier& tier);
// The pins of a plan as Tier::plan() makes it (its steps; a plan holds no
// VM image): what a tenant runs, which may be an older catalog's.
std::vector<Pin> plan_pins(const nlohmann::json& plan);

// [{what, version|null, pinned, where, note?}]
nlohmann::json pins_json(const std::vector<Pin>& pins);

}  // namespace factory::catalog
