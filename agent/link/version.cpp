#include "agent/link/version.hpp"

#include <cstring>

#include "contract/agent_upgrade.hpp"

namespace {
constexpr std::size_t kMarkBytes =
    factory::proto::kAgentVersionMark.size() + factory::proto::kAgentVersionField;
// Checked on literals that are never emitted (sizeof is not evaluated; the
// mark alone ends in NUL, which the contract's search skips): a second copy
// of the mark followed by the version would be what a restamp patches.
static_assert(factory::proto::kAgentVersionMark ==
              "\x01"
              "factory-agent-version:");
static_assert(sizeof("\x01"
                     "factory-agent-version:" FACTORY_VERSION) <= kMarkBytes,
              "FACTORY_VERSION is longer than the version mark's field");
}  // namespace

// Not const, and with external linkage: the compiler may neither fold reads
// of it into a constant nor drop it, so the bytes stay in the file (.data)
// where agent_binary_version() and a restamp find them, and agent_version()
// reads whatever they say when it runs. The rest of the field is zeros.
extern "C" {
char factory_agent_version_mark[kMarkBytes] =
    "\x01"
    "factory-agent-version:" FACTORY_VERSION;
}

namespace factory::agent {

std::string_view agent_version() {
  const char* field = factory_agent_version_mark + proto::kAgentVersionMark.size();
  return {field, ::strnlen(field, proto::kAgentVersionField)};
}

}  // namespace factory::agent
