#pragma once
// Files from the source tree that the coordinator renders into a tenant's
// user-data, compiled in (CMake generates their text with cmake/embed_text.cmake
// at build time) so the one `factory` binary needs nothing beside it when it
// runs in a pod.
#include <string_view>

namespace factory::tenants {

std::string_view user_data_template();  // cloud-init/user-data.yaml.tmpl
std::string_view agent_unit_file();     // deploy/factory-agent.service

}  // namespace factory::tenants
