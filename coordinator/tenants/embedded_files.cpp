// The texts themselves are generated at build time by cmake/embed_text.cmake
// (see coordinator/CMakeLists.txt), so they can never drift from the files.
#include "coordinator/tenants/embedded_files.hpp"

namespace factory::tenants {

extern const char kUserDataTemplateText[];
extern const char kAgentUnitText[];

std::string_view user_data_template() { return kUserDataTemplateText; }
std::string_view agent_unit_file() { return kAgentUnitText; }

}  // namespace factory::tenants
