// A factory-agent build that exits at start: the rollback case of the
// real-guest test (tests/e2e/vm_e2e.cpp). It carries a version mark
// (contract/agent_upgrade.hpp) in its bytes as a real build does, so the
// coordinator serves and orders it like any other version; run by systemd in
// the guest, it fails at once, every time, as a build with a fatal start-up
// bug would. The guest must then put the previous binary back by itself.
#include <cstdio>
#include <string_view>

#include "contract/agent_upgrade.hpp"

// Not const and with external linkage, as the agent's own: the bytes stay in
// the file where the coordinator looks for them.
extern "C" {
char factory_agent_version_mark[factory::proto::kAgentVersionMark.size() +
                                factory::proto::kAgentVersionField] =
    "\x01"
    "factory-agent-version:0.1.0-e2e.broken";
}

int main() {
  const std::string_view mark(factory_agent_version_mark);
  static_assert(factory::proto::kAgentVersionMark ==
                "\x01"
                "factory-agent-version:");
  std::fprintf(stderr,
               "factory-agent %s (a broken build for the rollback test): exiting at start\n",
               mark.substr(factory::proto::kAgentVersionMark.size()).data());
  return 1;
}
