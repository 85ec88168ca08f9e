#include "agent/health/change.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace factory::agent {

using nlohmann::json;

namespace {

// The sample with its figures taken out: what must be equal for two
// samples to say the same thing.
json discrete(const proto::HealthSample& h) {
  json j = h.to_json();
  j.erase("time");
  for (auto& g : j["gpu"]["gpus"]) {
    for (const char* k :
         {"memory_used_mib", "memory_free_mib", "memory_reserved_mib", "utilization_percent",
          "memory_utilization_percent", "temperature_c", "memory_temperature_c", "power_draw_w",
          "sm_clock_mhz", "memory_clock_mhz", "energy_mj"})
      g.erase(k);
    // Which clocks are held back changes with the load (idle, the power
    // cap at full load): only a slowdown for heat or by hardware is news.
    if (g["clocks_event_reasons"].is_number_unsigned()) {
      namespace ce = proto::clocks_event;
      g["clocks_event_reasons"] = g["clocks_event_reasons"].get<std::uint64_t>() &
                                  (ce::kSwThermalSlowdown | ce::kHwThermalSlowdown |
                                   ce::kHwSlowdown | ce::kHwPowerBrakeSlowdown);
    }
    for (auto& p : g["processes"]) p.erase("used_memory_mib");
  }
  // An endpoint's counters move with every request: they ride along with
  // the next sample sent, they do not make one. A new probe result does.
  if (j.contains("endpoint"))
    for (const char* k : {"requests", "served", "unauthorized", "refused_paths", "busy",
                          "upstream_errors", "in_flight"})
      j["endpoint"].erase(k);
  return j;
}

template <class T>
bool moved(const std::optional<T>& a, const std::optional<T>& b, double threshold) {
  if (a.has_value() != b.has_value()) return true;
  if (!a) return false;
  return std::fabs(static_cast<double>(*a) - static_cast<double>(*b)) >= threshold;
}

bool figures_moved(const proto::GpuSample& a, const proto::GpuSample& b,
                   const ChangeThresholds& t) {
  double total = static_cast<double>(b.memory_total_mib.value_or(0));
  double mem = std::max(64.0, total * t.memory_fraction);
  double limit = b.power_limit_w.value_or(a.power_limit_w.value_or(0));
  double power = std::max(10.0, limit * t.power_fraction);
  auto clock = [&](const std::optional<int>& x) {
    return std::max(1.0, static_cast<double>(x.value_or(0)) * t.clock_fraction);
  };
  return moved(a.memory_used_mib, b.memory_used_mib, mem) ||
         moved(a.memory_free_mib, b.memory_free_mib, mem) ||
         moved(a.memory_reserved_mib, b.memory_reserved_mib, mem) ||
         moved(a.utilization_percent, b.utilization_percent, t.utilization_points) ||
         moved(a.memory_utilization_percent, b.memory_utilization_percent, t.utilization_points) ||
         moved(a.temperature_c, b.temperature_c, t.temperature_c) ||
         moved(a.memory_temperature_c, b.memory_temperature_c, t.temperature_c) ||
         moved(a.power_draw_w, b.power_draw_w, power) ||
         moved(a.sm_clock_mhz, b.sm_clock_mhz, clock(a.sm_clock_mhz)) ||
         moved(a.memory_clock_mhz, b.memory_clock_mhz, clock(a.memory_clock_mhz));
}

}  // namespace

bool health_changed(const proto::HealthSample& before, const proto::HealthSample& now,
                    const ChangeThresholds& t) {
  if (discrete(before) != discrete(now)) return true;
  // Same GPUs in the same order (the discrete view says so): compare each.
  for (size_t i = 0; i < now.gpu.gpus.size() && i < before.gpu.gpus.size(); ++i)
    if (figures_moved(before.gpu.gpus[i], now.gpu.gpus[i], t)) return true;
  return false;
}

}  // namespace factory::agent
