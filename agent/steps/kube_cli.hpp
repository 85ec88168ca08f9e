#pragma once
// kubectl and helm as the gpu-k8s steps and the health probe run them in
// the guest: RKE2's own kubectl (<root>/var/lib/rancher/rke2/bin, not on
// PATH: the runbook exports it), else one from PATH, always with the guest
// cluster's kubeconfig under the guest root; helm from PATH with KUBECONFIG
// set as well. Errors say which of "not installed", "no kubeconfig" and "the
// API does not answer" it was, so a step can tell "not done yet" from broken.
#include <chrono>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "agent/diagnose/k8s.hpp"
#include "agent/plan/step.hpp"
#include "common/subprocess.hpp"

namespace factory::agent::steps {

inline constexpr const char* kRke2Kubeconfig = "/etc/rancher/rke2/rke2.yaml";
inline constexpr const char* kRke2BinDir = "/var/lib/rancher/rke2/bin";

// True when `helm version --short` runs: helm is installed.
bool helm_installed(const StepContext& ctx);

class Kubectl {
 public:
  // kubeconfig and bin_dir are guest paths (root-prefixed here). Errors:
  // not_found when no kubectl exists (the cluster is not installed yet).
  static Result<Kubectl> find(const GuestEnv& env, const std::string& kubeconfig = kRke2Kubeconfig,
                              const std::string& bin_dir = kRke2BinDir);

  // `kubectl --kubeconfig K args...`. Errors when it could not start, or
  // not_found when the kubeconfig does not exist (nothing is run then).
  Result<CommandResult> run(std::vector<std::string> args, std::chrono::milliseconds timeout) const;

  // Runs args with `-o json` and parses the output. Errors: not_found (no
  // kubeconfig file), unavailable (the API refused or timed out),
  // failed_precondition (kubectl failed otherwise), protocol (not JSON).
  Result<nlohmann::json> get_json(std::vector<std::string> args,
                                  std::chrono::milliseconds timeout) const;

  Result<std::vector<KubeNode>> nodes(std::chrono::milliseconds timeout) const;
  // Every namespace when ns is empty.
  Result<std::vector<KubePod>> pods(std::chrono::milliseconds timeout,
                                    const std::string& ns = "") const;

  const std::string& binary() const { return binary_; }
  const std::filesystem::path& kubeconfig() const { return kubeconfig_; }

 private:
  std::string binary_;
  std::filesystem::path kubeconfig_;
};

// Turns a failed kubectl/helm run into an Error with the right code (see
// get_json) and its last line.
Error classify_kube_failure(const std::string& tool, const CommandResult& r);

// The environment helm runs with: KUBECONFIG=<root-prefixed kubeconfig>.
std::map<std::string, std::string> helm_env(const GuestEnv& env, const std::string& kubeconfig);

// Single-quotes a value for sh.
std::string sh_quote(const std::string& s);

// Downloads an install script with curl and runs it with `interpreter`
// (the runbooks pipe `curl ... | sh`; downloading first means a failed
// download fails the step instead of running an empty script). A download
// failure carries the download_failed diagnosis.
StepOutcome run_install_script(const StepContext& ctx, const std::string& what,
                               const std::string& url, const std::string& interpreter,
                               std::map<std::string, std::string> env,
                               std::chrono::milliseconds cap);

}  // namespace factory::agent::steps
