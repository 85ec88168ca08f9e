#pragma once
// Step kind `apt_packages`: Debian/Ubuntu packages installed with apt-get.
//
// Params (as catalog/catalog.yaml writes them; their types, defaults and
// ranges are contract/step_params.cpp's, which the catalog checks too):
//   packages: [jq, "foo=1.2-3"]   a "name=version" entry pins the version
//   update:   true                (default) apt-get update before installing
//
// check/verify: dpkg -s says every package is installed (at the pinned
// version where one is given). apply: installs only the missing ones, so a
// re-run after a crash installs nothing twice.
// Diagnoses: apt_failed, dkms_build_failed (a package whose postinst runs DKMS).
#include <memory>

#include "agent/plan/step.hpp"

namespace factory::agent::steps {

Result<std::unique_ptr<Step>> make_apt_packages(const StepSpec& spec);

}  // namespace factory::agent::steps
