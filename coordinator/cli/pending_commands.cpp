// Registration points for command groups not built yet. Each module's owner
// deletes its function here when it adds the real one in its own folder.
#include "coordinator/cli/commands.hpp"

namespace factory::cli {
}  // namespace factory::cli
