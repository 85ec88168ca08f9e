#pragma once
// The GPUs' Xid and ECC events, waited for on a thread of its own: NVML's
// event set (nvmlDeviceRegisterEvents, nvmlEventSetWait_v2) blocks until an
// event comes, and a wedged driver may block it for good, so nothing else
// ever waits on this thread. Each Xid goes into the fault book (persisted,
// kept until acknowledged) and every event calls `on_fault`, which the
// health scheduler wires to report_now(): a card that breaks is reported at
// once, not at the next interval.
//
// NVML may not be there yet (the plan installs the driver later), or may
// lack the event calls: the watcher tries again every `retry`, and a sample
// still shows what the card reports; only the Xids need events.
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "agent/guest/env.hpp"
#include "agent/health/fault_book.hpp"
#include "agent/health/nvml.hpp"

namespace factory::agent {

struct FaultWatchOptions {
  // Each wait's timeout: how soon stop() is noticed while nothing happens.
  std::chrono::milliseconds wait_slice{std::chrono::seconds(1)};
  // After a failure (no NVML, no event calls, the set broke): the pause
  // before trying again.
  std::chrono::milliseconds retry{std::chrono::seconds(30)};
};

class FaultWatcher {
 public:
  using OnFault = std::function<void()>;

  FaultWatcher(GuestEnv env, FaultBook book, OnFault on_fault, FaultWatchOptions options = {});
  // Stops; waits for the thread as long as one wait slice and a little
  // more, and leaves it behind (never calling on_fault again) when NVML
  // holds it longer.
  ~FaultWatcher();
  FaultWatcher(const FaultWatcher&) = delete;
  FaultWatcher& operator=(const FaultWatcher&) = delete;

  void start();
  void stop();

  struct State {
    bool watching = false;  // an event set is registered and waited on
    std::vector<NvmlEventSet::Registration> registrations;
    std::string error;  // the last failure, when not watching
    std::uint64_t events = 0;
    std::uint64_t xids = 0;
  };
  State state() const;

  struct Shared;  // what the thread and this object share (fault_watcher.cpp)

 private:
  std::shared_ptr<Shared> shared_;
};

}  // namespace factory::agent
