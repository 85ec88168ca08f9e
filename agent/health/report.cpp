#include "agent/health/report.hpp"

#include <unistd.h>

#include <fstream>

#include "agent/health/gpu_health.hpp"
#include "agent/health/k8s_health.hpp"
#include "common/durations.hpp"

namespace factory::agent {

using nlohmann::json;

HealthCollectors HealthCollectors::from_plan(const json& plan) {
  HealthCollectors c;
  if (!plan.is_object() || !plan.contains("health") || !plan["health"].is_object()) return c;
  const json& h = plan["health"];
  c.ollama = h.value("ollama", false);
  if (h.contains("k8s") && h["k8s"].is_object()) {
    c.k8s = true;
    c.k8s_resource = h["k8s"].value("resource", c.k8s_resource);
    c.k8s_kubeconfig = h["k8s"].value("kubeconfig", c.k8s_kubeconfig);
  }
  return c;
}

json HealthCollectors::to_json() const {
  json j = {{"ollama", ollama}, {"k8s", nullptr}};
  if (k8s) j["k8s"] = {{"resource", k8s_resource}, {"kubeconfig", k8s_kubeconfig}};
  return j;
}

std::string guest_hostname(const GuestEnv& env) {
  std::ifstream in(env.path("/etc/hostname"));
  std::string name;
  if (in && std::getline(in, name) && !name.empty()) return name;
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

HealthProbe::HealthProbe(GuestEnv env, HealthDeadlines deadlines)
    : env_(std::move(env)), deadlines_(deadlines) {}

namespace {

// A section left unknown because its collector did not answer, or threw.
template <class Section>
Section unanswered(const typename TimedCollector<Section>::Outcome& o, const std::string& collector,
                   const std::string& what, std::chrono::milliseconds deadline) {
  Section s;
  if (o.hung) {
    auto d = collector_hung(collector, what, deadline);
    s.error = d.summary;
    s.diagnoses.push_back(diagnosis_sample(d));
  } else {
    s.error = collector + " collector failed: " + o.error;
  }
  return s;
}

}  // namespace

proto::HealthSample HealthProbe::sample(const HealthCollectors& c, const std::string& plan_hash) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const GuestEnv env = env_;
  // The runs own copies of what they read: one that hangs may outlive us.
  // nvidia-smi gets a little less than the deadline, so that a plain hang
  // is killed by its own timeout and only a wedged one is left behind.
  auto smi_timeout = deadlines_.gpu - std::min(deadlines_.gpu / 5, std::chrono::milliseconds(1000));
  auto gpu = gpu_.start([env, smi_timeout] { return read_gpu_section(env, smi_timeout); });
  TimedCollector<proto::OllamaSection>::Run ollama;
  TimedCollector<proto::K8sSection>::Run k8s;
  auto ollama_timeout = deadlines_.ollama / 2;  // two calls
  auto k8s_timeout = deadlines_.k8s / 2;        // two calls
  if (c.ollama)
    ollama =
        ollama_.start([env, ollama_timeout] { return read_ollama_section(env, ollama_timeout); });
  if (c.k8s)
    k8s = k8s_.start([env, c, k8s_timeout] {
      return read_k8s_section(env, c.k8s_kubeconfig, c.k8s_resource, k8s_timeout);
    });

  proto::HealthSample h;
  h.time = format_rfc3339(factory::Clock::now());
  h.hostname = guest_hostname(env_);
  h.plan_hash = plan_hash;
  auto g = gpu_.await(gpu, start + deadlines_.gpu);
  h.gpu = g.value ? std::move(*g.value)
                  : unanswered<proto::GpuSection>(g, "gpu", "nvidia-smi / NVML", deadlines_.gpu);
  if (c.ollama) {
    auto o = ollama_.await(ollama, start + deadlines_.ollama);
    h.ollama =
        o.value ? std::move(*o.value)
                : unanswered<proto::OllamaSection>(o, "ollama", "Ollama's API", deadlines_.ollama);
  }
  if (c.k8s) {
    auto k = k8s_.await(k8s, start + deadlines_.k8s);
    if (k.value) {
      h.k8s = std::move(*k.value);
    } else {
      h.k8s = unanswered<proto::K8sSection>(k, "k8s", "the guest cluster's API", deadlines_.k8s);
      h.k8s->resource = c.k8s_resource;
    }
  }
  proto::make_sendable(h);
  return h;
}

json collect_health(const GuestEnv& env, const HealthCollectors& collectors) {
  HealthProbe probe(env);
  return probe.sample(collectors).to_json();
}

}  // namespace factory::agent
