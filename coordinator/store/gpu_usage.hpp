#pragma once
// A tenant's GPU time (docs/usage.md): the intervals its VM ran with its
// cards, as the VM provider saw them, and the busy GPU-seconds its health
// samples showed. Kept in the record (status.gpu_usage), and archived with
// the record when the tenant is deleted (Store::archived_usage), so a
// window that a deleted tenant ran in is still reported.
//
// What is trusted: an interval's start and stop are the provider's own
// observations (KubeVirt's VMI phase transition times, the QEMU process's
// start time from the kernel), never the agent's, whose clock and word are
// the tenant's. Busy seconds are the guest's utilization figures: shown
// beside the GPU-seconds, never instead of them.
//
// Restarts: an interval is keyed by the instance (the VMI's uid, "pid:N"),
// so the coordinator observing the same instance after its own restart goes
// on with the same interval rather than opening a second one. An instance
// gone while nobody looked is closed at the stop time the provider gives,
// else at the last time it was seen running (`end_source` says which).
//
// Bounded: at most kMaxClosedIntervals closed intervals are kept; older
// ones are folded into per-day totals (UTC days), as are busy seconds older
// than kBusyHourlyKeep hours. A window that cuts a folded day counts the
// day's share pro rata.
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "coordinator/store/endpoint_usage.hpp"

namespace factory::store {

struct GpuInterval {
  std::string instance;   // the VMI's uid, "pid:N"
  std::string gpu_model;  // the card's resource name: "nvidia.com/GH100_H200"
  int gpus = 0;
  std::int64_t start = 0;  // unix seconds, the provider's
  // Closed: when it stopped. Open: when it was last seen running.
  std::int64_t end = 0;
  // How `end` is known, once closed: "provider" (the provider's stop time),
  // "observed" (seen stopped or replaced, at that observation), "last_seen"
  // (gone while nobody looked: the last time it was seen running), "deleted"
  // (the tenant's delete ended it).
  std::string end_source;
  std::int64_t gpu_seconds() const { return end > start ? (end - start) * gpus : 0; }
  bool operator==(const GpuInterval&) const = default;
};

// What the provider said of the tenant's VM at one look, reduced to what
// usage needs.
struct UsageObservation {
  std::int64_t now = 0;  // when it was looked at (the coordinator's clock)
  bool running = false;  // the VM runs with its cards now
  std::string instance;  // what runs now ("" none), or the instance that stopped
  std::string gpu_model;
  int gpus = 0;
  std::optional<std::int64_t> running_since;  // the provider's start of `instance`
  std::optional<std::int64_t> stopped_at;     // the provider's stop of `instance`, if it stopped
};

class GpuUsage {
 public:
  static constexpr std::size_t kMaxClosedIntervals = 64;
  static constexpr std::int64_t kBusyHourlyKeep = 24 * 8;

  // How an observation changed the usage: nothing; only the open interval's
  // last-seen time moved (worth writing now and then, not at every look);
  // an interval opened or closed (write it now).
  enum class Change { none, extended, changed };
  Change observe(const UsageObservation& o);
  // The tenant's delete: the open interval closed at `now` when it was seen
  // running within `fresh` seconds of it, else at its last-seen time.
  void close_for_delete(std::int64_t now, std::int64_t fresh);
  // Busy GPU-seconds (sum over the cards of utilization x time) credited at `at`.
  void add_busy(std::int64_t at, double busy_gpu_seconds);

  // Over [since, until): GPU-seconds per card model, and busy GPU-seconds.
  std::map<std::string, double> gpu_seconds(std::int64_t since, std::int64_t until) const;
  double busy_seconds(std::int64_t since, std::int64_t until) const;
  // Since the beginning: the counters of /metrics.
  std::map<std::string, double> gpu_seconds_total() const;
  double busy_seconds_total() const;

  const std::vector<GpuInterval>& closed() const { return closed_; }
  const std::optional<GpuInterval>& open() const { return open_; }
  // The card model of the latest interval ("" none yet).
  std::string gpu_model() const;

  // RFC 3339 times in its JSON; unknown keys kept.
  nlohmann::json to_json() const;
  static Result<GpuUsage> from_json(const nlohmann::json& j);
  bool operator==(const GpuUsage&) const = default;

  nlohmann::json extra = nlohmann::json::object();

 private:
  void close_open(std::int64_t end, const char* source);
  void fold_old();

  std::vector<GpuInterval> closed_;  // oldest first
  std::optional<GpuInterval> open_;
  // Folded: UTC day start (unix s) -> card model -> GPU-seconds.
  std::map<std::int64_t, std::map<std::string, double>> daily_;
  // Busy: hour start -> busy GPU-seconds; older hours folded into days.
  std::map<std::int64_t, double> busy_hourly_, busy_daily_;
};

// A deleted tenant's usage as the store archived it with its delete: its
// GPU time and, for a model endpoint, its keys' counts.
struct ArchivedUsage {
  std::string tenant, tier, project, created_at, deleted_at;
  GpuUsage usage;
  std::optional<EndpointUsage> endpoint_usage;
};

}  // namespace factory::store
