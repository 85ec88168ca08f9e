#pragma once
// A model endpoint's usage per key (issue 28), as the agent reports it: a
// durable event (its spool, so the coordinator stores each once), at most
// every 60 s and at stop, one per key with anything counted since the
// previous report:
//   {"kind": "endpoint_usage", "key", "requests", "errors",
//    "prompt_tokens", "completion_tokens"}
// The guest is the customer's: the coordinator reads it with
// read_endpoint_usage (contract/guest_input.hpp's FieldReader: the key by
// its grammar, each count bounded) and counts it only under a key of the
// sender's own tenant (coordinator/agents/projection.cpp).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "contract/guest_input.hpp"

namespace factory::proto {

inline constexpr std::string_view kEndpointUsageEventKind = "endpoint_usage";

namespace endpoint_usage_limits {
// A minute of a busy endpoint is far below these; a report above one is
// not a count.
inline constexpr std::uint64_t kMaxRequests = 10'000'000;
inline constexpr std::uint64_t kMaxTokens = 100'000'000'000ull;
}  // namespace endpoint_usage_limits

// [a-z0-9][a-z0-9-]{0,62}: a key's name (coordinator/tenants/endpoint_keys.hpp).
bool is_endpoint_key_name(std::string_view s);

struct EndpointUsageEvent {
  std::string key;
  std::uint64_t requests = 0, errors = 0, prompt_tokens = 0, completion_tokens = 0;
  nlohmann::json to_json() const;  // with its kind
  bool operator==(const EndpointUsageEvent&) const = default;
};

// The event's fields (kind, id and time are the caller's): nullopt when the
// key or a count is missing or out of bounds, each reason in f's rejections.
std::optional<EndpointUsageEvent> read_endpoint_usage(FieldReader& f);

}  // namespace factory::proto
