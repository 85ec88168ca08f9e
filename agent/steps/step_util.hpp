#pragma once
// Small things every step kind needs: running a command within the step's
// deadline, an install script, rate-limited progress, and a little per-step
// state kept in the agent's state directory (not under the guest root: it is
// the agent's own memory, e.g. the boot id at install time). The params come
// checked and with their defaults from normalized_params() (agent/plan/step.hpp).
#include <chrono>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "agent/plan/step.hpp"
#include "common/subprocess.hpp"

namespace factory::agent::steps {

// The time a command may take: what is left of the step's deadline, at most cap.
std::chrono::milliseconds time_left(const StepContext& ctx, std::chrono::milliseconds cap);

// Runs argv through PATH within the step's deadline (at most cap). Errors only
// when the command could not start; a non-zero exit is in the result.
Result<CommandResult> run_in_step(const StepContext& ctx, std::vector<std::string> argv,
                                  std::chrono::milliseconds cap = std::chrono::minutes(30),
                                  std::map<std::string, std::string> env = {});

// "apt-get install -y a b" for messages.
std::string command_line(const std::vector<std::string>& argv);

// Single-quotes a value for sh.
std::string sh_quote(const std::string& s);

// Downloads an install script with curl and runs it with `interpreter`
// (the runbooks pipe `curl ... | sh`, which runs an empty script, and
// "succeeds", when the download fails; downloading first fails the step
// instead), within the step's deadline (at most cap). A download failure
// carries the download_failed diagnosis.
StepOutcome run_install_script(const StepContext& ctx, const std::string& what,
                               const std::string& url, const std::string& interpreter,
                               std::map<std::string, std::string> env,
                               std::chrono::milliseconds cap);

// At most one progress event per interval (the coordinator and the spool
// need no more than a couple a second), but always the final one.
class ProgressLimiter {
 public:
  explicit ProgressLimiter(std::chrono::milliseconds interval) : interval_(interval) {}
  bool due(bool final = false);

 private:
  std::chrono::milliseconds interval_;
  std::chrono::steady_clock::time_point last_{};
  bool sent_any_ = false;
};

void emit_progress(const StepContext& ctx, nlohmann::json fields);

// Per-step state: <state_dir>/steps/<step id>.json, written atomically.
nlohmann::json load_step_state(const StepContext& ctx);
Status save_step_state(const StepContext& ctx, const nlohmann::json& state);

}  // namespace factory::agent::steps
