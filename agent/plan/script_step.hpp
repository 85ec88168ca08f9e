#pragma once
// The `script` step kind: an admin's own item, written in the catalog as shell
// commands (catalog/README.md). params:
//   check:  optional; exit 0 means already done (apply is skipped)
//   run:    required; makes it so (exit 0 = success)
//   verify: optional; exit 0 means really done (without it, run's exit 0 is enough)
//   reboot: optional bool; ask for a guest reboot after run, verify after boot
//   env:    optional map of extra environment variables
// Each command runs under /bin/sh -c with FACTORY_ROOT (the guest root the
// agent works on) and FACTORY_STEP (the step id) set, and the step's deadline.
#include <memory>

#include "agent/plan/step.hpp"

namespace factory::agent {

Result<std::unique_ptr<Step>> make_script_step(const StepSpec& spec);
void register_script_step(StepRegistry& registry);

}  // namespace factory::agent
