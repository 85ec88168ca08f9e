#pragma once
// QEMU's machine protocol (QMP) over the VM's Unix socket: one short
// connection per command (greeting, qmp_capabilities, the command), with a
// deadline on every read and write. Blocking: the provider calls it on the
// coordinator's worker threads and its own monitor thread, never an io thread.
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "common/error.hpp"

namespace factory::qemu {

// The command's "return" value; an error reply becomes an Error with QEMU's
// description. unavailable when nothing listens on the socket.
Result<nlohmann::json> qmp_execute(const std::string& socket, const std::string& command,
                                   const nlohmann::json& arguments = nlohmann::json::object(),
                                   std::chrono::milliseconds timeout = std::chrono::seconds(2));

}  // namespace factory::qemu
