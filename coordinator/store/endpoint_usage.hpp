#pragma once
// What a model endpoint's keys used (issue 28): requests, errors, prompt and
// completion tokens per key, as the tenant's agent reported them in its
// `endpoint_usage` events (contract/endpoint_usage.hpp) and the event's
// projection folded them in, once per event (the store's exactly-once).
//
// Kept by the coordinator's receive time, bounded whatever the agent sends:
// hourly buckets for the last kHourlyDays days, older hours folded into
// daily buckets, at most kMaxDaily of those (the oldest dropped), and at
// most kMaxKeys key names (a report for one more is refused by add()).
// `totals_since_creation` is never folded: it is what /metrics counts.
#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/error.hpp"

namespace factory::store {

struct UsageCounts {
  std::uint64_t requests = 0, errors = 0, prompt_tokens = 0, completion_tokens = 0;
  UsageCounts& operator+=(const UsageCounts& o);
  bool empty() const {
    return requests == 0 && errors == 0 && prompt_tokens == 0 && completion_tokens == 0;
  }
  bool operator==(const UsageCounts&) const = default;
};

struct KeyTotals {
  std::string key;
  std::uint64_t requests = 0, errors = 0, prompt_tokens = 0, completion_tokens = 0;
  bool operator==(const KeyTotals&) const = default;
};

class EndpointUsage {
 public:
  static constexpr int kHourlyDays = 31;
  static constexpr std::size_t kMaxDaily = 400;
  static constexpr std::size_t kMaxKeys = 64;

  // One bucket: its start (unix seconds, on the hour or the day, UTC) and
  // the counts of each key within it.
  struct Bucket {
    std::int64_t start = 0;
    std::map<std::string, UsageCounts> keys;
    bool operator==(const Bucket&) const = default;
  };

  // Adds one report of `key`, received at `at`; folds what has aged. An
  // error (and nothing changed) when it would be one key too many.
  Status add(const std::string& key, const UsageCounts& c,
             std::chrono::system_clock::time_point at);

  // Per key, the buckets whose start is in [since, until), sorted by key.
  std::vector<KeyTotals> totals(std::chrono::system_clock::time_point since,
                                std::chrono::system_clock::time_point until) const;
  // Per key, since the endpoint's first report (what /metrics counts).
  const std::map<std::string, UsageCounts>& totals_since_creation() const { return total_; }
  const std::vector<Bucket>& hourly() const { return hourly_; }
  const std::vector<Bucket>& daily() const { return daily_; }

  // {"total": {key: [requests, errors, prompt, completion]},
  //  "hourly": [{"start": unix, "keys": {key: [...]}}], "daily": [...]}
  nlohmann::json to_json() const;
  static Result<EndpointUsage> from_json(const nlohmann::json& j);
  bool operator==(const EndpointUsage&) const = default;

 private:
  void fold(std::int64_t now);

  std::map<std::string, UsageCounts> total_;
  std::vector<Bucket> hourly_;  // by start, oldest first
  std::vector<Bucket> daily_;   // by start, oldest first
};

}  // namespace factory::store
