#include "agent/steps/builtin.hpp"

#include "agent/plan/script_step.hpp"
#include "agent/steps/apt_packages.hpp"
#include "agent/steps/gpu_present.hpp"
#include "agent/steps/helm_release.hpp"
#include "agent/steps/mig.hpp"
#include "agent/steps/node_label.hpp"
#include "agent/steps/nvidia_driver.hpp"
#include "agent/steps/ollama_install.hpp"
#include "agent/steps/ollama_model.hpp"
#include "agent/steps/rke2.hpp"
#include "agent/steps/wait_allocatable.hpp"

namespace factory::agent {

void register_builtin_steps(StepRegistry& registry) {
  registry.add("gpu_present", steps::make_gpu_present);
  registry.add("apt_packages", steps::make_apt_packages);
  registry.add("nvidia_driver", steps::make_nvidia_driver);
  registry.add("ollama_install", steps::make_ollama_install);
  registry.add("ollama_model", steps::make_ollama_model);
  registry.add("rke2", steps::make_rke2);
  registry.add("helm_release", steps::make_helm_release);
  registry.add("node_label", steps::make_node_label);
  registry.add("wait_allocatable", steps::make_wait_allocatable);
  registry.add("mig", steps::make_mig);
  register_script_step(registry);
}

}  // namespace factory::agent
