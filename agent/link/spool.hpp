#pragma once
// The agent's outbox: every event it emits is on disk (fdatasync'd) before
// emit() returns, and stays there until the coordinator acknowledges it, so a
// reboot, a crash or an outage loses nothing. Bounded: past max_events the
// oldest unacknowledged events are dropped (and counted), because a guest
// cut off for days must not fill its disk. Thread-safe: the plan runner
// emits from its thread while the link sends from the network thread.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/atomic_file.hpp"
#include "common/error.hpp"

namespace factory::agent {

struct SpooledEvent {
  uint64_t id = 0;
  nlohmann::json body;  // the event: {"id":..,"time":..,"kind":..,...}
};

class EventSpool {
 public:
  // Files: <dir>/spool.log (one JSON line per event), <dir>/spool.acked.
  static Result<std::unique_ptr<EventSpool>> open(const std::filesystem::path& dir,
                                                  size_t max_events);
  // Assigns the next id and the time, writes it durably, returns the id.
  Result<uint64_t> emit(nlohmann::json event);
  // Events with id > after, oldest first, at most max.
  std::vector<SpooledEvent> pending_after(uint64_t after, size_t max) const;
  // Cumulative: everything up to id is delivered.
  Status ack_through(uint64_t id);
  uint64_t acked() const;
  uint64_t last_id() const;
  size_t pending() const;
  uint64_t dropped() const;
  // Called (from the emitting thread) after each emit: the link's wake-up.
  void set_listener(std::function<void()> f);

 private:
  EventSpool() = default;
  Status compact_locked();

  mutable std::mutex mu_;
  std::filesystem::path dir_;
  size_t max_events_ = 10000;
  std::vector<SpooledEvent> pending_;  // unacked, ascending ids
  uint64_t acked_ = 0, last_id_ = 0, dropped_ = 0;
  size_t lines_in_log_ = 0;
  DurableAppender log_;
  std::function<void()> listener_;
};

}  // namespace factory::agent
