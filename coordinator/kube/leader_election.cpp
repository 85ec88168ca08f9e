#include "coordinator/kube/leader_election.hpp"

#include <spdlog/spdlog.h>

#include <cstdio>
#include <ctime>

namespace factory::kube {

std::string format_micro_time(Clock::time_point t) {
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
  std::time_t secs = static_cast<std::time_t>(us / 1000000);
  std::tm tm{};
  ::gmtime_r(&secs, &tm);
  char buf[96];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<long long>(us % 1000000));
  return buf;
}

namespace {

std::string str_at(const json& spec, const char* key) {
  auto it = spec.find(key);
  return it != spec.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::int64_t int_at(const json& spec, const char* key) {
  auto it = spec.find(key);
  return it != spec.end() && it->is_number_integer() ? it->get<std::int64_t>() : 0;
}

}  // namespace

LeaderElector::LeaderElector(KubeClient client, LeaderElectionOptions opts,
                             LeaderCallbacks callbacks)
    : client_(std::move(client)), opts_(std::move(opts)), callbacks_(std::move(callbacks)) {}

LeaderElector::~LeaderElector() {
  stop();
}

void LeaderElector::start() {
  std::lock_guard lk(mu_);
  if (thread_.joinable()) return;
  thread_ = std::thread([this] { run(); });
}

void LeaderElector::stop() {
  {
    std::lock_guard lk(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

LeaderState LeaderElector::state() const {
  std::lock_guard lk(mu_);
  return state_;
}

void LeaderElector::set_leading(bool leading) {
  {
    std::lock_guard lk(mu_);
    if (state_.leading == leading) return;
    state_.leading = leading;
    if (leading) {
      state_.holder = opts_.identity;
      ++state_.transitions;
    }
  }
  if (leading) {
    spdlog::info("leader election: {} leads now (Lease {}/{})", opts_.identity, opts_.ns,
                 opts_.lease_name);
    if (callbacks_.on_start) callbacks_.on_start();
  } else {
    spdlog::warn("leader election: {} no longer leads (Lease {}/{})", opts_.identity, opts_.ns,
                 opts_.lease_name);
    if (callbacks_.on_stop) callbacks_.on_stop();
  }
}

json LeaderElector::record(const std::string& acquire_time, std::int64_t transitions) const {
  return {{"holderIdentity", opts_.identity},
          {"leaseDurationSeconds", static_cast<std::int64_t>(opts_.lease_duration.count())},
          {"acquireTime", acquire_time},
          {"renewTime", format_micro_time(Clock::now())},
          {"leaseTransitions", transitions}};
}

bool LeaderElector::try_acquire_or_renew() {
  const auto now = std::chrono::steady_clock::now();
  auto lease = client_.get(kLease, opts_.ns, opts_.lease_name);
  if (!lease) {
    if (lease.error().code != Errc::not_found) {
      spdlog::debug("leader election: cannot read Lease {}/{}: {}", opts_.ns, opts_.lease_name,
                    lease.error().message);
      return false;
    }
    json obj = {{"apiVersion", "coordination.k8s.io/v1"},
                {"kind", "Lease"},
                {"metadata", {{"name", opts_.lease_name}, {"namespace", opts_.ns}}},
                {"spec", record(format_micro_time(Clock::now()), 0)}};
    auto made = client_.create(obj);
    if (!made) {
      // already_exists: another replica made it first; it leads.
      spdlog::debug("leader election: cannot create Lease {}/{}: {}", opts_.ns, opts_.lease_name,
                    made.error().message);
      return false;
    }
    observed_holder_ = opts_.identity;
    observed_renew_ = str_at((*made)["spec"], "renewTime");
    observed_at_ = now;
    last_renewed_ = now;
    return true;
  }

  json& obj = *lease;
  json spec = obj.value("spec", json::object());
  if (!spec.is_object()) spec = json::object();
  const std::string holder = str_at(spec, "holderIdentity");
  const std::string renew = str_at(spec, "renewTime");
  if (holder != observed_holder_ || renew != observed_renew_) {
    if (holder != observed_holder_ && callbacks_.on_new_leader && holder != opts_.identity)
      callbacks_.on_new_leader(holder);
    observed_holder_ = holder;
    observed_renew_ = renew;
    observed_at_ = now;
  }
  {
    std::lock_guard lk(mu_);
    state_.holder = holder;
  }
  std::int64_t duration_s = int_at(spec, "leaseDurationSeconds");
  if (duration_s <= 0) duration_s = opts_.lease_duration.count();
  const bool mine = holder == opts_.identity;
  const bool expired = holder.empty() || now - observed_at_ >= std::chrono::seconds(duration_s);
  if (!mine && !expired) return false;

  // Take it (a new term) or renew it (the same term); conditional on the
  // version read, so of two replicas racing only one write succeeds.
  std::int64_t transitions = int_at(spec, "leaseTransitions");
  std::string acquired = str_at(spec, "acquireTime");
  if (!mine) {
    ++transitions;
    acquired = format_micro_time(Clock::now());
  }
  obj["spec"] = record(acquired.empty() ? format_micro_time(Clock::now()) : acquired, transitions);
  auto written = client_.update(obj);
  if (!written) {
    spdlog::debug("leader election: {} Lease {}/{}: {}", mine ? "cannot renew" : "cannot take",
                  opts_.ns, opts_.lease_name, written.error().message);
    return false;
  }
  if (!mine)
    spdlog::info("leader election: {} took Lease {}/{} from {}", opts_.identity, opts_.ns,
                 opts_.lease_name, holder.empty() ? "nobody (released)" : holder + " (expired)");
  observed_holder_ = opts_.identity;
  observed_renew_ = str_at((*written)["spec"], "renewTime");
  observed_at_ = now;
  last_renewed_ = now;
  return true;
}

void LeaderElector::release() {
  auto lease = client_.get(kLease, opts_.ns, opts_.lease_name);
  if (!lease) return;
  json spec = lease->value("spec", json::object());
  if (!spec.is_object() || str_at(spec, "holderIdentity") != opts_.identity) return;
  // As client-go does on release: no holder, a one-second duration, so
  // every follower may take it at its next try.
  spec["holderIdentity"] = "";
  spec["leaseDurationSeconds"] = 1;
  spec["renewTime"] = format_micro_time(Clock::now());
  (*lease)["spec"] = spec;
  if (auto st = client_.update(*lease); !st)
    spdlog::warn("leader election: could not release Lease {}/{}: {}", opts_.ns, opts_.lease_name,
                 st.error().message);
  else
    spdlog::info("leader election: {} released Lease {}/{}", opts_.identity, opts_.ns,
                 opts_.lease_name);
}

void LeaderElector::run() {
  for (;;) {
    {
      std::lock_guard lk(mu_);
      if (stopping_) break;
    }
    const bool held = try_acquire_or_renew();
    const bool leading = state().leading;
    if (held) {
      set_leading(true);
    } else if (leading &&
               std::chrono::steady_clock::now() - last_renewed_ >= opts_.renew_deadline) {
      // Could not renew in time: stop acting before the Lease can expire
      // for the others (renew_deadline < lease_duration).
      set_leading(false);
    } else if (leading && observed_holder_ != opts_.identity) {
      set_leading(false);  // someone else holds it now
    }
    std::unique_lock lk(mu_);
    cv_.wait_for(lk, opts_.retry_period, [this] { return stopping_; });
    if (stopping_) break;
  }
  if (state().leading) {
    set_leading(false);
    release();
  }
}

}  // namespace factory::kube
