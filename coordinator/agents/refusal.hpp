#pragma once
// How the parts of the agents module say no to an agent: the error frame
// the session sends (code, message), and whether the connection ends after it.
#include <nlohmann/json.hpp>
#include <string>
#include <variant>

namespace factory::coordinator {

struct Refusal {
  std::string code;          // "enrollment_refused", "bad_event", "over_quota", ...
  std::string message;       // one line the agent logs
  std::string close_reason;  // empty: the connection stays
  // More fields of the error frame's body ({"quota", "retry_after_s"}).
  nlohmann::json extra = nlohmann::json::object();
};

// A reply frame's body, or why there is none.
template <class Body>
using Answer = std::variant<Body, Refusal>;

}  // namespace factory::coordinator
