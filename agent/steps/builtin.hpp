#pragma once
// The step kinds built into the agent. The catalog (catalog/catalog.yaml)
// names them; each kind's header documents its params.
//
//   gpu_present     agent/steps/gpu_present.hpp
//   apt_packages    agent/steps/apt_packages.hpp
//   nvidia_driver   agent/steps/nvidia_driver.hpp
//   ollama_install  agent/steps/ollama_install.hpp
//   ollama_model    agent/steps/ollama_model.hpp
//   rke2            agent/steps/rke2.hpp
//   helm_release    agent/steps/helm_release.hpp
//   node_label      agent/steps/node_label.hpp
//   wait_allocatable agent/steps/wait_allocatable.hpp
//   script          agent/plan/script_step.hpp (the plan engine's; registered here too)
#include "agent/plan/step.hpp"

namespace factory::agent {

void register_builtin_steps(StepRegistry& registry);

}  // namespace factory::agent
