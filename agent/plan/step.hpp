#pragma once
// A plan step as the agent runs it. Every step kind implements check / apply /
// verify and must be re-entrant: the agent can be killed at any instruction,
// the guest rebooted at any time, and the step run again from the top.
//
//   check()  -> already done? (cheap, no side effects). true: skip apply.
//   apply()  -> make it so. May ask for a guest reboot.
//   verify() -> is it really done? Run after apply, and after the reboot.
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/diagnose/diagnosis.hpp"
#include "agent/guest/env.hpp"
#include "common/error.hpp"
#include "contract/step_params.hpp"

namespace factory::agent {

// One step of a plan, as the coordinator sends it (see contract/catalog.hpp).
struct StepSpec {
  std::string id;    // unique in the plan, e.g. "nvidia-driver"
  std::string kind;  // e.g. "nvidia_driver", "ollama_model", "script"
  nlohmann::json params = nlohmann::json::object();
  std::chrono::seconds timeout{std::chrono::minutes(30)};
  int retries = 0;  // extra attempts after a failed apply/verify
};

struct StepOutcome {
  enum class Kind { ok, failed, reboot_required };
  Kind kind = Kind::ok;
  std::string message;                 // one line for humans
  std::string output_tail;             // last lines of the command that failed
  std::optional<Diagnosis> diagnosis;  // a named failure with its fix

  static StepOutcome success(std::string msg = {}) { return {Kind::ok, std::move(msg), {}, {}}; }
  static StepOutcome failure(std::string msg, std::string tail = {},
                             std::optional<Diagnosis> d = std::nullopt) {
    return {Kind::failed, std::move(msg), std::move(tail), std::move(d)};
  }
  static StepOutcome reboot(std::string msg) {
    return {Kind::reboot_required, std::move(msg), {}, {}};
  }
  bool ok() const { return kind == Kind::ok; }
};

// What a step can do besides its work: report progress (streamed to the
// coordinator through the durable spool) and know its deadline.
struct StepContext {
  const GuestEnv& env;
  const StepSpec& spec;
  // Emits {"kind":"progress","step":id, ...fields}; e.g. {"state":"progress","percent":42,
  // "message":"pulling llama3.2:1b"}. Rate-limit high-frequency progress yourself.
  std::function<void(nlohmann::json fields)> progress;
  std::chrono::steady_clock::time_point deadline;

  std::chrono::milliseconds remaining() const {
    return std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                 std::chrono::steady_clock::now());
  }
};

class Step {
 public:
  virtual ~Step() = default;
  // Err only when the check itself could not run; false means "not done yet".
  virtual Result<bool> check(StepContext& ctx) = 0;
  virtual StepOutcome apply(StepContext& ctx) = 0;
  virtual StepOutcome verify(StepContext& ctx) = 0;
};

using StepFactory = std::function<Result<std::unique_ptr<Step>>(const StepSpec&)>;

// What a built-in kind's factory builds its step from: the spec's params
// checked against `kind`'s schema, with every default filled in
// (contract/step_params.hpp; the catalog checks the same). Errors read
// "step '<id>': params.<key>: <what>".
inline Result<nlohmann::json> normalized_params(std::string_view kind, const StepSpec& spec) {
  return catalog::normalize_step_params(kind, spec.params, "step '" + spec.id + "'");
}

// Maps a step kind to its implementation. The agent's cli hands the plan
// engine one holding the built-in kinds (register_builtin_steps(), agent/steps).
class StepRegistry {
 public:
  void add(const std::string& kind, StepFactory f) { factories_[kind] = std::move(f); }
  bool has(const std::string& kind) const { return factories_.count(kind) != 0; }
  std::vector<std::string> kinds() const {
    std::vector<std::string> out;
    for (const auto& [kind, _] : factories_) out.push_back(kind);
    return out;
  }
  Result<std::unique_ptr<Step>> create(const StepSpec& spec) const {
    auto it = factories_.find(spec.kind);
    if (it == factories_.end())
      return Error(Errc::invalid_argument, "step '" + spec.id + "': unknown step kind '" +
                                               spec.kind + "' (agent too old for this plan?)");
    return it->second(spec);
  }

 private:
  std::map<std::string, StepFactory> factories_;
};

}  // namespace factory::agent
