// A tenant's GPU time (gpu_usage.hpp).
#include "coordinator/store/gpu_usage.hpp"

#include <algorithm>
#include <limits>
#include <set>

#include "common/durations.hpp"
#include "coordinator/store/time_buckets.hpp"

namespace factory::store {

using nlohmann::json;

namespace {

using buckets::floor_to;
using buckets::kDay;
using buckets::kHour;

std::string time_text(std::int64_t t) {
  return format_rfc3339(Clock::from_time_t(t));
}
std::string day_text(std::int64_t t) {
  return time_text(t).substr(0, 10);
}

// [a, b) ∩ [since, until), in seconds.
double overlap(std::int64_t a, std::int64_t b, std::int64_t since, std::int64_t until) {
  const std::int64_t lo = std::max(a, since), hi = std::min(b, until);
  return hi > lo ? static_cast<double>(hi - lo) : 0.0;
}

Error bad(const std::string& where, const char* want) {
  return Error(Errc::invalid_argument, "gpu_usage" + where + ": want " + want);
}

Result<std::int64_t> read_time(const json& v, const std::string& where) {
  if (!v.is_string()) return bad(where, "an RFC 3339 time");
  auto t = parse_rfc3339(v.get<std::string>());
  if (!t) return bad(where, "an RFC 3339 time");
  return unix_seconds(*t);
}

Result<std::int64_t> read_day(const std::string& day, const std::string& where) {
  return read_time(json(day + "T00:00:00Z"), where);
}

json interval_json(const GpuInterval& i, bool open) {
  json j = {{"instance", i.instance},
            {"gpu_model", i.gpu_model},
            {"gpus", i.gpus},
            {"start", time_text(i.start)}};
  j[open ? "last_seen" : "end"] = time_text(i.end);
  if (!open) j["end_source"] = i.end_source;
  return j;
}

Result<GpuInterval> read_interval(const json& j, const std::string& where, bool open) {
  if (!j.is_object()) return bad(where, "an object");
  GpuInterval i;
  if (!j.contains("instance") || !j["instance"].is_string())
    return bad(where + ".instance", "a string");
  i.instance = j["instance"].get<std::string>();
  if (!j.value("gpu_model", json()).is_string()) return bad(where + ".gpu_model", "a string");
  i.gpu_model = j["gpu_model"].get<std::string>();
  if (!j.value("gpus", json()).is_number_integer()) return bad(where + ".gpus", "an integer");
  i.gpus = j["gpus"].get<int>();
  auto s = read_time(j.value("start", json()), where + ".start");
  if (!s) return s.error();
  i.start = *s;
  const char* end_key = open ? "last_seen" : "end";
  auto e = read_time(j.value(end_key, json()), where + "." + end_key);
  if (!e) return e.error();
  i.end = *e;
  if (!open) {
    if (!j.value("end_source", json()).is_string()) return bad(where + ".end_source", "a string");
    i.end_source = j["end_source"].get<std::string>();
  }
  return i;
}

}  // namespace

GpuUsage::Change GpuUsage::observe(const UsageObservation& o) {
  Change ch = Change::none;
  if (open_ && !(o.running && o.instance == open_->instance)) {
    if (!o.running && o.instance == open_->instance && o.stopped_at)
      close_open(std::min(*o.stopped_at, std::max(o.now, open_->end)), "provider");
    else
      // Gone or replaced while not looked at: its stop lies between the
      // last look that saw it and this one. The last look is what is known.
      close_open(open_->end, "last_seen");
    ch = Change::changed;
  }
  if (!o.running || o.gpus <= 0) return ch;
  if (open_) {
    if (o.now > open_->end) {
      open_->end = o.now;
      if (ch == Change::none) ch = Change::extended;
    }
    return ch;
  }
  GpuInterval i;
  i.instance = o.instance;
  i.gpu_model = o.gpu_model;
  i.gpus = o.gpus;
  // The provider's start when it gives one, never after this look (a clock
  // ahead of ours) and never before what was counted already (an instance
  // seen stopped a moment, as a paused QEMU is, then running again).
  i.start = std::min(o.running_since.value_or(o.now), o.now);
  for (const auto& c : closed_) i.start = std::max(i.start, c.end);
  i.end = std::max(o.now, i.start);
  open_ = i;
  return Change::changed;
}

void GpuUsage::close_for_delete(std::int64_t now, std::int64_t fresh) {
  if (!open_) return;
  if (now - open_->end <= fresh)
    close_open(std::max(now, open_->end), "deleted");
  else
    close_open(open_->end, "last_seen");
}

void GpuUsage::close_open(std::int64_t end, const char* source) {
  GpuInterval i = *open_;
  open_.reset();
  i.end = std::max(end, i.start);
  i.end_source = source;
  closed_.push_back(std::move(i));
  fold_old();
}

void GpuUsage::fold_old() {
  while (closed_.size() > kMaxClosedIntervals) {
    const GpuInterval& i = closed_.front();
    for (std::int64_t t = i.start; t < i.end;) {
      const std::int64_t day = floor_to(t, kDay);
      const std::int64_t seg_end = std::min(i.end, day + kDay);
      daily_[day][i.gpu_model] += static_cast<double>((seg_end - t) * i.gpus);
      t = seg_end;
    }
    closed_.erase(closed_.begin());
  }
}

void GpuUsage::add_busy(std::int64_t at, double busy_gpu_seconds) {
  if (busy_gpu_seconds <= 0) return;
  busy_hourly_[floor_to(at, kHour)] += busy_gpu_seconds;
  const std::int64_t keep_from = floor_to(at, kHour) - kBusyHourlyKeep * kHour;
  while (!busy_hourly_.empty() && busy_hourly_.begin()->first < keep_from) {
    busy_daily_[floor_to(busy_hourly_.begin()->first, kDay)] += busy_hourly_.begin()->second;
    busy_hourly_.erase(busy_hourly_.begin());
  }
}

std::map<std::string, double> GpuUsage::gpu_seconds(std::int64_t since, std::int64_t until) const {
  std::map<std::string, double> out;
  auto add = [&](const GpuInterval& i) {
    if (double s = overlap(i.start, i.end, since, until); s > 0) out[i.gpu_model] += s * i.gpus;
  };
  for (const auto& i : closed_) add(i);
  if (open_) add(*open_);
  for (const auto& [day, models] : daily_)
    if (double share = overlap(day, day + kDay, since, until) / kDay; share > 0)
      for (const auto& [model, s] : models) out[model] += s * share;
  return out;
}

double GpuUsage::busy_seconds(std::int64_t since, std::int64_t until) const {
  double out = 0;
  for (const auto& [hour, s] : busy_hourly_)
    out += s * overlap(hour, hour + kHour, since, until) / kHour;
  for (const auto& [day, s] : busy_daily_) out += s * overlap(day, day + kDay, since, until) / kDay;
  return out;
}

std::map<std::string, double> GpuUsage::gpu_seconds_total() const {
  return gpu_seconds(std::numeric_limits<std::int64_t>::min() / 2,
                     std::numeric_limits<std::int64_t>::max() / 2);
}

double GpuUsage::busy_seconds_total() const {
  double out = 0;
  for (const auto& [h, s] : busy_hourly_) out += s;
  for (const auto& [d, s] : busy_daily_) out += s;
  return out;
}

std::string GpuUsage::gpu_model() const {
  if (open_) return open_->gpu_model;
  if (!closed_.empty()) return closed_.back().gpu_model;
  if (!daily_.empty() && !daily_.rbegin()->second.empty())
    return daily_.rbegin()->second.begin()->first;
  return "";
}

json GpuUsage::to_json() const {
  json j = extra.is_object() ? extra : json::object();
  json intervals = json::array();
  for (const auto& i : closed_) intervals.push_back(interval_json(i, false));
  j["intervals"] = intervals;
  if (open_)
    j["open"] = interval_json(*open_, true);
  else
    j.erase("open");
  json daily = json::object();
  for (const auto& [day, models] : daily_) daily[day_text(day)] = models;
  j["daily"] = daily;
  json hourly = json::object(), busy_daily = json::object();
  for (const auto& [h, s] : busy_hourly_) hourly[time_text(h)] = s;
  for (const auto& [d, s] : busy_daily_) busy_daily[day_text(d)] = s;
  j["busy_hourly"] = hourly;
  j["busy_daily"] = busy_daily;
  return j;
}

Result<GpuUsage> GpuUsage::from_json(const json& j) {
  if (!j.is_object()) return bad("", "an object");
  GpuUsage u;
  static const std::set<std::string> known = {"intervals", "open", "daily", "busy_hourly",
                                              "busy_daily"};
  for (const auto& [k, v] : j.items())
    if (!known.count(k)) u.extra[k] = v;
  if (j.contains("intervals")) {
    if (!j["intervals"].is_array()) return bad(".intervals", "an array");
    for (std::size_t n = 0; n < j["intervals"].size(); ++n) {
      auto i = read_interval(j["intervals"][n], ".intervals[" + std::to_string(n) + "]", false);
      if (!i) return i.error();
      u.closed_.push_back(std::move(*i));
    }
  }
  if (j.contains("open")) {
    auto i = read_interval(j["open"], ".open", true);
    if (!i) return i.error();
    u.open_ = std::move(*i);
  }
  if (j.contains("daily")) {
    if (!j["daily"].is_object()) return bad(".daily", "an object");
    for (const auto& [day, models] : j["daily"].items()) {
      auto d = read_day(day, ".daily." + day);
      if (!d) return d.error();
      if (!models.is_object()) return bad(".daily." + day, "an object");
      for (const auto& [model, s] : models.items()) {
        if (!s.is_number()) return bad(".daily." + day + "." + model, "a number");
        u.daily_[*d][model] = s.get<double>();
      }
    }
  }
  auto buckets = [&](const char* key, bool days, std::map<std::int64_t, double>& out) -> Status {
    if (!j.contains(key)) return {};
    if (!j[key].is_object()) return bad(std::string(".") + key, "an object");
    for (const auto& [when, s] : j[key].items()) {
      const std::string where = std::string(".") + key + "." + when;
      auto t = days ? read_day(when, where) : read_time(json(when), where);
      if (!t) return t.error();
      if (!s.is_number()) return bad(where, "a number");
      out[*t] = s.get<double>();
    }
    return {};
  };
  if (auto st = buckets("busy_hourly", false, u.busy_hourly_); !st.ok()) return st.error();
  if (auto st = buckets("busy_daily", true, u.busy_daily_); !st.ok()) return st.error();
  return u;
}

}  // namespace factory::store
