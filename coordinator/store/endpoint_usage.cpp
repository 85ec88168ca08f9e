#include "coordinator/store/endpoint_usage.hpp"

#include <algorithm>
#include <limits>

#include "coordinator/store/time_buckets.hpp"

namespace factory::store {

using nlohmann::json;

namespace {

using buckets::floor_to;
using buckets::kDay;
using buckets::kHour;

// Adds without wrapping: a counter that would pass 2^64 stays at its top.
std::uint64_t sat_add(std::uint64_t a, std::uint64_t b) {
  return a > std::numeric_limits<std::uint64_t>::max() - b
             ? std::numeric_limits<std::uint64_t>::max()
             : a + b;
}

std::int64_t unix_of(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::seconds>(t.time_since_epoch()).count();
}

json counts_json(const UsageCounts& c) {
  return json::array({c.requests, c.errors, c.prompt_tokens, c.completion_tokens});
}

Status counts_from(const json& v, UsageCounts& out, const std::string& where) {
  auto bad = [&] {
    return Error(Errc::invalid_argument,
                 where + ": want [requests, errors, prompt_tokens, completion_tokens]");
  };
  if (!v.is_array() || v.size() != 4) return bad();
  std::uint64_t n[4];
  for (std::size_t i = 0; i < 4; i++) {
    if (v[i].is_number_unsigned())
      n[i] = v[i].get<std::uint64_t>();
    else if (v[i].is_number_integer() && v[i].get<std::int64_t>() >= 0)
      n[i] = static_cast<std::uint64_t>(v[i].get<std::int64_t>());
    else
      return bad();
  }
  out = UsageCounts{n[0], n[1], n[2], n[3]};
  return {};
}

Status keys_from(const json& v, std::map<std::string, UsageCounts>& out, const std::string& where) {
  if (!v.is_object()) return Error(Errc::invalid_argument, where + ": want an object");
  if (v.size() > EndpointUsage::kMaxKeys)
    return Error(Errc::invalid_argument,
                 where + ": more than " + std::to_string(EndpointUsage::kMaxKeys) + " keys");
  for (const auto& [k, c] : v.items()) {
    UsageCounts counts;
    if (auto st = counts_from(c, counts, where + "." + k); !st.ok()) return st;
    out[k] = counts;
  }
  return {};
}

json buckets_json(const std::vector<EndpointUsage::Bucket>& bs) {
  json a = json::array();
  for (const auto& b : bs) {
    json keys = json::object();
    for (const auto& [k, c] : b.keys) keys[k] = counts_json(c);
    a.push_back({{"start", b.start}, {"keys", std::move(keys)}});
  }
  return a;
}

Status buckets_from(const json& v, std::vector<EndpointUsage::Bucket>& out, std::size_t max,
                    const std::string& where) {
  if (!v.is_array()) return Error(Errc::invalid_argument, where + ": want an array");
  if (v.size() > max)
    return Error(Errc::invalid_argument, where + ": more than " + std::to_string(max) + " buckets");
  for (std::size_t i = 0; i < v.size(); i++) {
    const std::string at = where + "[" + std::to_string(i) + "]";
    const json& b = v[i];
    if (!b.is_object() || !b.contains("start") || !b["start"].is_number_integer())
      return Error(Errc::invalid_argument, at + ": want {start: unix seconds, keys: {...}}");
    EndpointUsage::Bucket bucket;
    bucket.start = b["start"].get<std::int64_t>();
    if (!out.empty() && bucket.start <= out.back().start)
      return Error(Errc::invalid_argument, at + ": buckets out of order");
    if (auto st = keys_from(b.value("keys", json::object()), bucket.keys, at + ".keys"); !st.ok())
      return st;
    out.push_back(std::move(bucket));
  }
  return {};
}

void add_to(std::vector<EndpointUsage::Bucket>& bs, std::int64_t start, const std::string& key,
            const UsageCounts& c) {
  auto it =
      std::lower_bound(bs.begin(), bs.end(), start,
                       [](const EndpointUsage::Bucket& b, std::int64_t s) { return b.start < s; });
  if (it == bs.end() || it->start != start) it = bs.insert(it, EndpointUsage::Bucket{start, {}});
  it->keys[key] += c;
}

}  // namespace

UsageCounts& UsageCounts::operator+=(const UsageCounts& o) {
  requests = sat_add(requests, o.requests);
  errors = sat_add(errors, o.errors);
  prompt_tokens = sat_add(prompt_tokens, o.prompt_tokens);
  completion_tokens = sat_add(completion_tokens, o.completion_tokens);
  return *this;
}

Status EndpointUsage::add(const std::string& key, const UsageCounts& c,
                          std::chrono::system_clock::time_point at) {
  if (!total_.contains(key) && total_.size() >= kMaxKeys)
    return Error(Errc::failed_precondition,
                 "the endpoint's usage already counts " + std::to_string(kMaxKeys) + " keys");
  const std::int64_t now = unix_of(at);
  total_[key] += c;
  add_to(hourly_, floor_to(now, kHour), key, c);
  fold(now);
  return {};
}

void EndpointUsage::fold(std::int64_t now) {
  // Hours older than kHourlyDays days go into their day.
  const std::int64_t keep_from = floor_to(now, kHour) - std::int64_t{kHourlyDays} * kDay;
  std::size_t old = 0;
  while (old < hourly_.size() && hourly_[old].start < keep_from) {
    for (const auto& [k, c] : hourly_[old].keys)
      add_to(daily_, floor_to(hourly_[old].start, kDay), k, c);
    old++;
  }
  hourly_.erase(hourly_.begin(), hourly_.begin() + static_cast<std::ptrdiff_t>(old));
  // A clock that went back leaves hours ahead of now: bounded all the same.
  const std::size_t max_hourly = static_cast<std::size_t>(kHourlyDays) * 24 + 48;
  if (hourly_.size() > max_hourly)
    hourly_.erase(hourly_.begin(), hourly_.end() - static_cast<std::ptrdiff_t>(max_hourly));
  if (daily_.size() > kMaxDaily)
    daily_.erase(daily_.begin(), daily_.end() - static_cast<std::ptrdiff_t>(kMaxDaily));
}

std::vector<KeyTotals> EndpointUsage::totals(std::chrono::system_clock::time_point since,
                                             std::chrono::system_clock::time_point until) const {
  const std::int64_t from = unix_of(since), to = unix_of(until);
  std::map<std::string, UsageCounts> sum;
  for (const auto* bs : {&daily_, &hourly_})
    for (const auto& b : *bs)
      if (b.start >= from && b.start < to)
        for (const auto& [k, c] : b.keys) sum[k] += c;
  std::vector<KeyTotals> out;
  for (const auto& [k, c] : sum)
    out.push_back(KeyTotals{k, c.requests, c.errors, c.prompt_tokens, c.completion_tokens});
  return out;
}

json EndpointUsage::to_json() const {
  json total = json::object();
  for (const auto& [k, c] : total_) total[k] = counts_json(c);
  return {{"total", std::move(total)},
          {"hourly", buckets_json(hourly_)},
          {"daily", buckets_json(daily_)}};
}

Result<EndpointUsage> EndpointUsage::from_json(const json& j) {
  if (!j.is_object()) return Error(Errc::invalid_argument, "want an object");
  EndpointUsage u;
  if (auto st = keys_from(j.value("total", json::object()), u.total_, "total"); !st.ok())
    return st.error();
  const std::size_t max_hourly = static_cast<std::size_t>(kHourlyDays) * 24 + 48;
  if (auto st = buckets_from(j.value("hourly", json::array()), u.hourly_, max_hourly, "hourly");
      !st.ok())
    return st.error();
  if (auto st = buckets_from(j.value("daily", json::array()), u.daily_, kMaxDaily, "daily");
      !st.ok())
    return st.error();
  return u;
}

}  // namespace factory::store
