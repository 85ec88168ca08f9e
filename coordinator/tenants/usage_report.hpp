#pragma once
// `factory usage` and GET /v1/usage (docs/usage.md): per tenant, over a
// window, the GPU-seconds its VM ran with its cards (per card model), the
// busy GPU-seconds its health showed, and its model endpoint's use per API
// key. Deleted tenants are reported from the store's usage archive.
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "coordinator/store/tenant_record.hpp"

namespace factory::tenants {

struct UsageQuery {
  std::int64_t since = 0, until = 0;  // unix seconds, [since, until)
  std::string tenant;                 // "" every tenant
  std::string project;                // "" every project
};

// A window's end as the admin writes it: RFC 3339 ("2026-12-01T00:00:00Z"),
// or a duration before `now` ("24h", "7d"), or "now".
Result<std::int64_t> parse_usage_time(const std::string& text, std::int64_t now);
// since/until as the API and CLI take them: the defaults are the last 30
// days to now; since must be before until. Names the bad one.
Result<UsageQuery> usage_query(const std::string& since, const std::string& until,
                               const std::string& tenant, const std::string& project,
                               std::int64_t now);

// One model endpoint key's use over the window.
struct KeyUsage {
  std::string key;
  std::uint64_t requests = 0, errors = 0, prompt_tokens = 0, completion_tokens = 0;
  nlohmann::json to_json() const;
};

// The report: {"since", "until", "tenants": [{"name", "tier", "project",
// "gpu_model", "gpu_seconds", "gpu_busy_seconds", "keys": [...]}]}, one row
// per tenant and card model (a deleted tenant's rows with "deleted_at", and
// only where the window holds some of its time). Seconds are rounded.
nlohmann::json usage_report(const std::vector<store::TenantRecord>& tenants,
                            const std::vector<store::ArchivedUsage>& archived, const UsageQuery& q);

// Per-project GPU quotas: project -> card model -> GPUs its tenants may
// hold. A project, or a model of it, not named has no limit.
using ProjectGpuQuotas = std::map<std::string, std::map<std::string, int>>;
// Whether tenant `name` of `project` may hold `gpus` cards of `model`, given
// every tenant recorded now (its own record, if any, not counted: a re-run
// of its create). Every record of the project holding cards of the model
// counts, running or not (a drained VM gets its cards back). Refused with
// the numbers: "project ml: 4 of 4 nvidia.com/GH100_H200 in use; ...".
Status check_gpu_quota(const std::vector<store::TenantRecord>& tenants, const std::string& name,
                       const std::string& project, const std::string& model, int gpus,
                       const ProjectGpuQuotas& quotas);

// The tenant's model-endpoint use per key over [since, until), from the
// record's EndpointUsage (hourly buckets by the coordinator's clock, folded
// into days after 31: a bucket counts when its start is in the window).
std::vector<KeyUsage> endpoint_key_usage(const store::TenantRecord& t, std::int64_t since,
                                         std::int64_t until);

}  // namespace factory::tenants
