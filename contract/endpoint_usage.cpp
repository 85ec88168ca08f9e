#include "contract/endpoint_usage.hpp"

#include <algorithm>

namespace factory::proto {

bool is_endpoint_key_name(std::string_view s) {
  if (s.empty() || s.size() > 63 || s.front() == '-') return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
  });
}

nlohmann::json EndpointUsageEvent::to_json() const {
  return {{"kind", std::string(kEndpointUsageEventKind)},
          {"key", key},
          {"requests", requests},
          {"errors", errors},
          {"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens}};
}

std::optional<EndpointUsageEvent> read_endpoint_usage(FieldReader& f) {
  namespace L = endpoint_usage_limits;
  auto key = f.matching("key", 63, [](const std::string& s) { return is_endpoint_key_name(s); });
  if (!key && !f.has("key")) f.reject("key", RejectReason::missing);
  auto required = [&f](const char* k, std::uint64_t max) {
    if (!f.has(k)) f.reject(k, RejectReason::missing);
    return f.count(k, max);
  };
  auto requests = required("requests", L::kMaxRequests);
  auto errors = required("errors", L::kMaxRequests);
  auto prompt = required("prompt_tokens", L::kMaxTokens);
  auto completion = required("completion_tokens", L::kMaxTokens);
  f.finish();
  if (!key || !requests || !errors || !prompt || !completion) return std::nullopt;
  if (*errors > *requests) {
    f.reject("errors", RejectReason::out_of_range);
    return std::nullopt;
  }
  return EndpointUsageEvent{*key, *requests, *errors, *prompt, *completion};
}

}  // namespace factory::proto
