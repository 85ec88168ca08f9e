#pragma once
// What `factory tenant create --wait` prints while a tenant comes up: one
// line per change between two successive GET /v1/tenants/{name} answers (the
// VM as KubeVirt reports it, the agent, each plan step, each diagnosis), so
// the output reads the same in a terminal, a CI log or a pipe. Pure
// functions of the two documents, kept apart from the polling for tests.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace factory::tenants {

// Lines for what changed from `before` (null on the first poll) to `now`.
std::vector<std::string> progress_lines(const nlohmann::json& before, const nlohmann::json& now);

// Why a tenant in phase "failed" failed: the step, its message, the
// diagnosis and fix, the tail of its output (indented); or the create error.
std::vector<std::string> failure_report(const nlohmann::json& tenant);

// "step nvidia-driver failed: ..." as one line, for the exit message.
std::string failure_summary(const nlohmann::json& tenant);

}  // namespace factory::tenants
