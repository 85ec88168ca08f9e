#pragma once
// One health sample: the GPU always, Ollama and the guest cluster when the
// tier says the guest runs them. Which collectors run is the catalog's to
// say: each tier's `health` section, carried in its plan
// ({"ollama": true, "k8s": {"resource", "kubeconfig"}}), never guessed from
// the plan's steps.
//
// Each collector runs on a thread of its own with its deadline
// (collector.hpp): all at once, so a sample takes at most the longest
// deadline, and one that hangs (a wedged nvidia-smi) makes its section
// unknown with the diagnosis health_collector_hung instead of holding up
// the sample or the next one.
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "agent/guest/cluster.hpp"
#include "agent/guest/env.hpp"
#include "agent/health/collector.hpp"
#include "contract/health_sample.hpp"

namespace factory::agent {

struct HealthCollectors {
  bool ollama = false;  // the guest serves models
  bool k8s = false;     // the guest runs its own cluster
  std::string k8s_resource = "nvidia.com/gpu";
  std::string k8s_kubeconfig = kRke2Kubeconfig;

  // From a plan's "health" section (catalog::HealthSpec::to_plan_json()).
  // Absent or unreadable: the GPU only.
  static HealthCollectors from_plan(const nlohmann::json& plan);
  nlohmann::json to_json() const;  // the plan section's form
  bool operator==(const HealthCollectors&) const = default;
};

struct HealthDeadlines {
  std::chrono::milliseconds gpu{std::chrono::seconds(10)};
  std::chrono::milliseconds ollama{std::chrono::seconds(10)};
  std::chrono::milliseconds k8s{std::chrono::seconds(30)};
};

// Takes samples; keeps its collectors between samples so that one still
// stuck from an earlier sample is not started again.
class HealthProbe {
 public:
  explicit HealthProbe(GuestEnv env, HealthDeadlines deadlines = {});
  proto::HealthSample sample(const HealthCollectors& collectors, const std::string& plan_hash = "");

 private:
  GuestEnv env_;
  HealthDeadlines deadlines_;
  TimedCollector<proto::GpuSection> gpu_;
  TimedCollector<proto::OllamaSection> ollama_;
  TimedCollector<proto::K8sSection> k8s_;
};

// One sample with a probe of its own, as JSON (`factory-agent health`).
nlohmann::json collect_health(const GuestEnv& env, const HealthCollectors& collectors);

// The guest's host name: <root>/etc/hostname, else the kernel's.
std::string guest_hostname(const GuestEnv& env);

}  // namespace factory::agent
