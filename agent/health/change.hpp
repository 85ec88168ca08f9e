#pragma once
// When a health sample is worth sending: health is state, so the agent sends
// a sample when it differs from the last one sent by more than noise, and at
// least every few intervals otherwise (scheduler.hpp), so a quiet guest costs
// the coordinator one small frame a minute rather than one every 10 seconds.
#include "contract/health_sample.hpp"

namespace factory::agent {

struct ChangeThresholds {
  int utilization_points = 10;    // GPU and memory-controller utilization, percentage points
  double memory_fraction = 0.01;  // of the card's total (at least 64 MiB)
  int temperature_c = 3;
  double power_fraction = 0.05;  // of the power limit (at least 10 W)
  double clock_fraction = 0.10;  // of the previous clock
};

// True when `now` differs from `before` in anything discrete (a GPU, a
// state, a model, a node, a pod, a process, an error, a diagnosis, a
// version) or in a figure by more than its threshold. The sample's time
// never counts.
bool health_changed(const proto::HealthSample& before, const proto::HealthSample& now,
                    const ChangeThresholds& t = {});

}  // namespace factory::agent
