// GPU usage metering (usage_meter.hpp).
#include "coordinator/tenants/usage_meter.hpp"

#include <algorithm>

#include "common/durations.hpp"
#include "coordinator/tenants/record_facts.hpp"

namespace factory::tenants {

namespace {

std::optional<std::int64_t> unix_of(const std::string& rfc3339) {
  if (rfc3339.empty()) return std::nullopt;
  auto t = parse_rfc3339(rfc3339);
  if (!t) return std::nullopt;
  return unix_seconds(*t);
}

}  // namespace

store::UsageObservation usage_observation(const store::TenantRecord& t, const VmObservation& o,
                                          std::int64_t now) {
  store::UsageObservation u;
  u.now = now;
  u.running = o.running();
  u.instance = o.instance;
  u.gpu_model = t.status.kube && t.status.kube->gpu_resource ? *t.status.kube->gpu_resource
                                                             : t.spec.gpu_resource.value_or("");
  // The provider's count where it names the cards (QEMU), else the record's.
  u.gpus = !o.gpus.empty() ? static_cast<int>(o.gpus.size()) : t.spec.gpus.value_or(0);
  u.running_since = unix_of(o.running_since);
  u.stopped_at = unix_of(o.stopped_at);
  return u;
}

double busy_gpus(const proto::HealthSample& s) {
  double sum = 0;
  for (const auto& g : s.gpu.gpus)
    if (g.utilization_percent) sum += std::clamp(*g.utilization_percent, 0, 100) / 100.0;
  return sum;
}

void UsageMeter::catch_up(store::GpuUsage& u, const std::optional<store::UsageObservation>& seen) {
  if (seen && u.open() && u.open()->instance == seen->instance) u.observe(*seen);
}

Status UsageMeter::fold(const std::string& tenant, const store::UsageObservation& o) {
  auto rec = store_.get_tenant(tenant);
  if (!rec || rec->phase == "deleting") return {};
  std::lock_guard lk(mu_);
  store::GpuUsage u = rec->status.gpu_usage.value_or(store::GpuUsage{});
  Pending& p = pending_[tenant];
  // The looks not written yet first: an interval this look closes at its
  // last look closes at the latest one, not at the latest written.
  const std::optional<store::UsageObservation> seen = p.last_running;
  catch_up(u, seen);
  const auto change = u.observe(o);
  // Busy: the latest sample's utilization over the time since the previous
  // look, capped, and only from a sample fresh enough to speak for it.
  if (o.running && p.last_look > 0 && o.now > p.last_look)
    if (auto h = store_.get_health(tenant))
      if (auto at = unix_of(h->received_at); at && o.now - *at <= opts_.sample_fresh)
        p.busy += busy_gpus(h->sample) *
                  static_cast<double>(std::min(o.now - p.last_look, opts_.busy_cap));
  p.last_look = o.now;
  if (o.running)
    p.last_running = o;
  else
    p.last_running.reset();
  const bool due = change == store::GpuUsage::Change::changed ||
                   ((change == store::GpuUsage::Change::extended || p.busy > 0) &&
                    o.now - p.written_at >= opts_.write_every);
  if (!due) return {};
  const double busy = p.busy;
  auto r = store_.update_tenant(tenant, [&](store::TenantRecord& t) -> Status {
    // A delete under way has closed the usage for good (close_for_delete).
    if (t.phase == "deleting") return Error(Errc::conflict, "deleting");
    auto& g = t.status.gpu_usage;
    if (!g) g.emplace();
    catch_up(*g, seen);
    g->observe(o);
    g->add_busy(o.now, busy);
    return {};
  });
  if (!r) {
    if (r.error().code == Errc::conflict || r.error().code == Errc::not_found) return {};
    return r.error();
  }
  p.busy -= busy;
  p.written_at = o.now;
  return {};
}

void UsageMeter::catch_up(std::vector<store::TenantRecord>& records) {
  std::lock_guard lk(mu_);
  for (auto& t : records)
    if (auto it = pending_.find(t.name); it != pending_.end() && t.status.gpu_usage) {
      catch_up(*t.status.gpu_usage, it->second.last_running);
      t.status.gpu_usage->add_busy(it->second.last_look, it->second.busy);
    }
}

Status UsageMeter::close_for_delete(const std::string& tenant, std::int64_t now) {
  double busy = 0;
  std::optional<store::UsageObservation> seen;
  {
    std::lock_guard lk(mu_);
    if (auto it = pending_.find(tenant); it != pending_.end()) {
      busy = it->second.busy;
      seen = it->second.last_running;
      pending_.erase(it);
    }
  }
  auto r = store_.update_tenant(tenant, [&](store::TenantRecord& t) -> Status {
    if (!t.status.gpu_usage) return Error(Errc::conflict, "no usage");
    catch_up(*t.status.gpu_usage, seen);
    // A look within three write periods still speaks for the VM running
    // until the delete; an older one is all that is known.
    t.status.gpu_usage->close_for_delete(now, 3 * opts_.write_every);
    t.status.gpu_usage->add_busy(now, busy);
    return {};
  });
  if (!r && r.error().code != Errc::conflict && r.error().code != Errc::not_found) return r.error();
  return {};
}

}  // namespace factory::tenants
