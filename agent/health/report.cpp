#include "agent/health/report.hpp"

#include "agent/health/gpu_health.hpp"
#include "agent/health/k8s_health.hpp"

namespace factory::agent {

nlohmann::json collect_health(const GuestEnv& env, const HealthCollectors& collectors) {
  nlohmann::json h = {{"gpu", collect_gpu_health(env)}};
  if (collectors.ollama) h["ollama"] = collect_ollama_health(env);
  if (collectors.k8s) h["k8s"] = collect_k8s_health(env);
  return h;
}

}  // namespace factory::agent
