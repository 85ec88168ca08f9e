#pragma once
// One health report: the GPU always, Ollama and the guest cluster when the
// guest runs them (which ones is the caller's to say: the guest's plan, or
// what is installed for `factory-agent health`).
//
//   {"gpu": collect_gpu_health(), "ollama": collect_ollama_health()?,
//    "k8s": collect_k8s_health()?}
#include <nlohmann/json.hpp>

#include "agent/guest/env.hpp"

namespace factory::agent {

struct HealthCollectors {
  bool ollama = false;  // the guest serves models
  bool k8s = false;     // the guest runs its own cluster
};

nlohmann::json collect_health(const GuestEnv& env, const HealthCollectors& collectors);

}  // namespace factory::agent
