#pragma once
// The version this agent binary reports (hello, enrollment, User-Agent,
// --version), read at run time from the version mark its bytes carry
// (contract/agent_upgrade.hpp: kAgentVersionMark, then the version
// NUL-padded to kAgentVersionField bytes). Read from the bytes rather than
// compiled in as a constant, so that a build stamped with another version in
// place (as a release or a test of self-update does) reports that version:
// the coordinator judges an upgrade by what the new binary says in its hello.
#include <string_view>

namespace factory::agent {

std::string_view agent_version();

}  // namespace factory::agent
