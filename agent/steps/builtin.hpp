#pragma once
// The step kinds built into the agent. The catalog (catalog/catalog.yaml)
// names them; each kind's header documents its params.
//
//   gpu_present     agent/steps/gpu_present.hpp
//   apt_packages    agent/steps/apt_packages.hpp
//   nvidia_driver   agent/steps/nvidia_driver.hpp
//   ollama_install  agent/steps/ollama_install.hpp
//   ollama_model    agent/steps/ollama_model.hpp
//   script          agent/plan/script_step.hpp (the plan engine's; registered here too)
//
// The gpu-k8s kinds (rke2, helm_release, node_label, wait_allocatable) are
// not built yet: StepRegistry::create refuses them with "unknown step kind".
#include "agent/plan/step.hpp"

namespace factory::agent {

void register_builtin_steps(StepRegistry& registry);

}  // namespace factory::agent
