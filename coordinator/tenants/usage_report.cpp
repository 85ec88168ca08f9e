// GPU usage: the leader's pass over the tenants' VMs, and the report
// (usage_meter.hpp, usage_report.hpp, docs/usage.md).
#include "coordinator/tenants/usage_report.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "common/durations.hpp"
#include "coordinator/tenants/record_facts.hpp"
#include "coordinator/tenants/service.hpp"

namespace factory::tenants {

using nlohmann::json;

Result<std::int64_t> parse_usage_time(const std::string& text, std::int64_t now) {
  if (text == "now") return now;
  if (text.find('T') != std::string::npos) {
    auto t = parse_rfc3339(text);
    if (!t) return t.error();
    return unix_seconds(*t);
  }
  auto d = parse_duration(text);
  if (!d)
    return Error(Errc::invalid_argument, "'" + text.substr(0, 64) +
                                             "' is neither an RFC 3339 time "
                                             "(2026-12-01T00:00:00Z) nor a duration ago (24h, 7d)");
  return now - d->count();
}

Result<UsageQuery> usage_query(const std::string& since, const std::string& until,
                               const std::string& tenant, const std::string& project,
                               std::int64_t now) {
  UsageQuery q;
  q.tenant = tenant;
  q.project = project;
  auto s = parse_usage_time(since.empty() ? "30d" : since, now);
  if (!s) return s.error().with_context("--since");
  auto u = parse_usage_time(until.empty() ? "now" : until, now);
  if (!u) return u.error().with_context("--until");
  if (*s >= *u)
    return Error(Errc::invalid_argument, "--since (" + format_rfc3339(Clock::from_time_t(*s)) +
                                             ") must be before --until (" +
                                             format_rfc3339(Clock::from_time_t(*u)) + ")");
  q.since = *s;
  q.until = *u;
  return q;
}

Status check_gpu_quota(const std::vector<store::TenantRecord>& tenants, const std::string& name,
                       const std::string& project, const std::string& model, int gpus,
                       const ProjectGpuQuotas& quotas) {
  if (gpus <= 0) return {};
  auto p = quotas.find(project);
  if (p == quotas.end()) return {};
  auto limit = p->second.find(model);
  if (limit == p->second.end()) return {};
  int in_use = 0;
  for (const auto& t : tenants) {
    if (t.name == name || t.spec.project.value_or("default") != project) continue;
    const std::string m = t.status.kube && t.status.kube->gpu_resource
                              ? *t.status.kube->gpu_resource
                              : t.spec.gpu_resource.value_or("");
    if (m == model) in_use += std::max(0, t.spec.gpus.value_or(0));
  }
  if (in_use + gpus <= limit->second) return {};
  return Error(Errc::failed_precondition,
               "project " + project + ": " + std::to_string(in_use) + " of " +
                   std::to_string(limit->second) + " " + model + " in use; tenant " + name +
                   " asks for " + std::to_string(gpus) + " more (quotas.projects." + project +
                   ".gpus in the coordinator's config; `factory usage --project " + project +
                   "` lists its tenants)");
}

json KeyUsage::to_json() const {
  return {{"name", key},
          {"requests", requests},
          {"errors", errors},
          {"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens}};
}

namespace {

std::vector<KeyUsage> key_usage(const std::optional<store::EndpointUsage>& usage,
                                std::int64_t since, std::int64_t until) {
  std::vector<KeyUsage> out;
  if (!usage) return out;
  for (const auto& k : usage->totals(Clock::from_time_t(since), Clock::from_time_t(until)))
    out.push_back({k.key, k.requests, k.errors, k.prompt_tokens, k.completion_tokens});
  return out;
}

}  // namespace

std::vector<KeyUsage> endpoint_key_usage(const store::TenantRecord& t, std::int64_t since,
                                         std::int64_t until) {
  return key_usage(t.endpoint ? t.endpoint->usage : std::nullopt, since, until);
}

void TenantService::usage_pass() {
  const auto now = Clock::now();
  if (now - usage_last_pass_ < opts_.usage_every) return;
  usage_last_pass_ = now;
  // The tenants with a VM that has cards; the provider is asked outside
  // the store's lock.
  for (const auto& t : deps_.store.tenants_where([](const store::TenantRecord& r) {
         return has_vm(r) && r.phase != "deleting" && r.spec.gpus.value_or(0) > 0;
       })) {
    const VmSpec vm = stored_vm(t);
    auto obs = provider_->observe(t.name, vm.ns);
    if (!obs) {
      // Not looked at is not stopped: the interval stays open, and is
      // closed from what the provider says when it answers again.
      spdlog::debug("tenants: usage: {}: {}", t.name, obs.error().message);
      continue;
    }
    auto o = usage_observation(t, *obs, unix_seconds(Clock::now()));
    if (auto st = usage_meter_.fold(t.name, o); !st.ok())
      spdlog::warn("tenants: usage of {}: {}", t.name, st.error().message);
  }
}

namespace {

json tenant_rows(const std::string& name, const std::string& tier, const std::string& project,
                 const std::string& model_fallback, const store::GpuUsage& u,
                 const std::vector<KeyUsage>& keys, const UsageQuery& q) {
  json rows = json::array();
  auto by_model = u.gpu_seconds(q.since, q.until);
  const double busy = u.busy_seconds(q.since, q.until);
  json key_rows = json::array();
  for (const auto& k : keys) key_rows.push_back(k.to_json());
  if (by_model.empty()) by_model[u.gpu_model().empty() ? model_fallback : u.gpu_model()] = 0;
  bool first = true;
  for (const auto& [model, seconds] : by_model) {
    rows.push_back({{"name", name},
                    {"tier", tier},
                    {"project", project},
                    {"gpu_model", model},
                    {"gpu_seconds", std::llround(seconds)},
                    // Busy time is the tenant's, not the card's: on the first row.
                    {"gpu_busy_seconds", first ? std::llround(busy) : 0},
                    {"keys", first ? key_rows : json::array()}});
    first = false;
  }
  return rows;
}

}  // namespace

json usage_report(const std::vector<store::TenantRecord>& records,
                  const std::vector<store::ArchivedUsage>& archived, const UsageQuery& q) {
  json tenants = json::array();
  auto wanted = [&](const std::string& name, const std::string& project) {
    return (q.tenant.empty() || q.tenant == name) && (q.project.empty() || q.project == project);
  };
  for (const auto& t : records) {
    const std::string project = t.spec.project.value_or("default");
    if (!wanted(t.name, project)) continue;
    const std::string model = t.status.kube && t.status.kube->gpu_resource
                                  ? *t.status.kube->gpu_resource
                                  : t.spec.gpu_resource.value_or("");
    for (auto& row :
         tenant_rows(t.name, t.tier, project, model, t.status.gpu_usage.value_or(store::GpuUsage{}),
                     endpoint_key_usage(t, q.since, q.until), q))
      tenants.push_back(std::move(row));
  }
  // Deleted tenants: only where the window holds some of their time.
  for (const auto& a : archived) {
    if (!wanted(a.tenant, a.project)) continue;
    double in_window = a.usage.busy_seconds(q.since, q.until);
    for (const auto& [m, s] : a.usage.gpu_seconds(q.since, q.until)) in_window += s;
    auto keys = key_usage(a.endpoint_usage, q.since, q.until);
    for (const auto& k : keys) in_window += static_cast<double>(k.requests);
    if (in_window <= 0) continue;
    for (auto& row : tenant_rows(a.tenant, a.tier, a.project, "", a.usage, keys, q)) {
      row["deleted_at"] = a.deleted_at;
      tenants.push_back(std::move(row));
    }
  }
  return json{{"since", format_rfc3339(Clock::from_time_t(q.since))},
              {"until", format_rfc3339(Clock::from_time_t(q.until))},
              {"tenants", tenants}};
}

Result<json> TenantService::usage_report(const UsageQuery& q) {
  auto records = deps_.store.list_tenants();
  usage_meter_.catch_up(records);
  return tenants::usage_report(records, deps_.store.archived_usage(), q);
}

}  // namespace factory::tenants
