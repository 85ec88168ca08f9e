#pragma once
// The catalog: the products ("tiers") Factory offers, as data. The coordinator
// reads it to size a tenant's VM and to compute the plan the guest agent runs;
// the plan is content-addressed by its hash so an agent never reapplies one it
// finished. The schema is documented in catalog/README.md.
//
// A catalog is validated completely when it is loaded: an admin's typo is
// reported as one line naming the tier, the step and the key, never found
// later by a guest halfway through its first boot.
#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"
#include "contract/step_params.hpp"

namespace factory::catalog {

// What the tenant's VM looks like. Quantities are Kubernetes quantities.
struct VmShape {
  std::string cpu;     // "8"
  std::string memory;  // "16Gi"
  std::string disk;    // "100Gi"
  std::string image;   // cloud image URL (CDI imports it)
  int gpus = 1;
  std::string gpu_resource;  // "" = any GPU resource allowlisted on the host
  nlohmann::json to_json() const;
};

// One step of a tier after ${...} references and for_each are resolved:
// exactly what the agent receives.
struct StepDef {
  std::string id;
  std::string kind;
  nlohmann::json params = nlohmann::json::object();
  std::chrono::seconds timeout{std::chrono::minutes(30)};
  int retries = 0;
  nlohmann::json to_plan_json() const;  // {id, kind, params, timeout_seconds, retries}
};

// What the guest agent reports about a tier's guest besides its GPU (which
// it always reports): the catalog says, so the agent never guesses from the
// plan's steps. Carried in the plan as "health".
struct HealthSpec {
  bool ollama = false;  // Ollama's /api/version and /api/ps
  bool k8s = false;     // the guest cluster: nodes' capacity and allocatable, HAMi's pods
  std::string k8s_resource = "nvidia.com/gpu";
  std::string k8s_kubeconfig = "/etc/rancher/rke2/rke2.yaml";
  // A small prompt sent to Ollama every probe_every, timing its first token
  // (0: never, the default; a model endpoint turns it on).
  std::chrono::seconds probe_every{0};
  std::string probe_model;
  std::string probe_prompt = "Say OK.";
  // {"ollama": bool, "k8s": {"resource", "kubeconfig"} | null,
  //  "probe"?: {"every_seconds", "model", "prompt"} (only when probe_every > 0)}
  nlohmann::json to_plan_json() const;
};

// Who may log in to the guest. A tier without login (a model endpoint) gets
// no password and no SSH Service; an admin's --ssh-key still adds key-only
// login for the admin.
struct AccessSpec {
  bool login = true;
};

// A tier that serves its models as a keyed HTTPS endpoint: the agent's
// proxy listens on `port` in the guest (agent/endpoint/proxy.hpp), exposed
// by a NodePort Service. Carried in the plan as "endpoint": {"port"}.
struct EndpointSpec {
  int port = 8443;
};

struct Tier {
  std::string name;
  std::string description;
  std::string cost;  // what it costs to run, in words
  VmShape vm;
  nlohmann::json versions = nlohmann::json::object();  // what it pins, for people
  nlohmann::json settings = nlohmann::json::object();  // other knobs its steps refer to
  std::vector<StepDef> steps;
  std::optional<HealthSpec> health;  // absent: the GPU only
  AccessSpec access;
  std::optional<EndpointSpec> endpoint;

  // The plan for this tier: {"tier": name, "steps": [StepDef::to_plan_json()...],
  // "health": HealthSpec::to_plan_json() (when the tier has a health section),
  // "endpoint": {"port"} (when it serves one)}.
  nlohmann::json plan() const;
  // The whole tier for `factory catalog show` (steps resolved, plan hash included).
  nlohmann::json to_json() const;
};

struct Catalog {
  std::string source;       // "built-in" or the file it came from
  std::vector<Tier> tiers;  // in file order

  const Tier* find(std::string_view name) const;
  // The tier, or "unknown tier 'x' (known: gpu-vm, gpu-k8s)".
  Result<const Tier*> tier(std::string_view name) const;
  std::vector<std::string> names() const;
};

// The step kinds a catalog may use, and their params: step_params.hpp.

// Parses and validates a catalog document. `source` names it in errors.
Result<Catalog> parse(const std::string& yaml_text, const std::string& source);
Result<Catalog> from_json(const nlohmann::json& doc, const std::string& source);
// catalog/catalog.yaml as compiled into the binary.
std::string_view builtin_yaml();
Result<Catalog> builtin();
Result<Catalog> load_file(const std::string& path);
// An admin's catalog file when `path` is set, else the built-in one.
Result<Catalog> load(const std::string& path);

// The plan for a tier, or the unknown-tier error.
Result<nlohmann::json> plan_for(const Catalog& catalog, std::string_view tier);
inline nlohmann::json plan_for(const Tier& tier) {
  return tier.plan();
}

// A plan's content address: SHA-256 (lower-case hex) of its canonical JSON
// (keys sorted, no whitespace), so the same plan always has the same hash
// whichever process computes it.
std::string plan_hash(const nlohmann::json& plan);
std::string canonical_json(const nlohmann::json& j);
std::string sha256_hex(std::string_view data);

}  // namespace factory::catalog
