#pragma once
// Following long work the coordinator does and journals (a host drain, an
// agent rollout): ask it every --poll until the work says it is done, print
// each change of a tenant's state with the time since the start, and ride
// out a coordinator restart (it carries on from its journals). One loop for
// every such command, so each says only what its document means.
#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "coordinator/cli/context.hpp"

namespace factory::cli {

struct FollowSpec {
  std::string path;  // GET this admin API path every poll
  std::chrono::seconds timeout{0}, poll{0};
  // One entry of the document's "tenants": its tenant's name, and the line
  // that says where it stands (printed when it changes).
  std::function<std::string(const nlohmann::json&)> tenant_of;
  std::function<std::string(const nlohmann::json&)> state_line;
  // Asked of every document after its tenants are printed, with the elapsed
  // time as printed ("[1m5s]"): an exit status ends the follow.
  std::function<std::optional<int>(const nlohmann::json& doc, const std::string& elapsed)> judge;
  // The timeout's message: what goes on, and how to follow it.
  std::string on_timeout;
};

// The exit status the judge gave; 1 with one line on stderr for an error the
// coordinator answered (unavailable excepted: it is retried) or the timeout.
int follow(const GlobalOptions& g, const FollowSpec& spec);

}  // namespace factory::cli
