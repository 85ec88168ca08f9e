#include "coordinator/feed/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <map>
#include <optional>
#include <sstream>

#include "common/durations.hpp"
#include "contract/health_sample.hpp"
#include "contract/xid_catalog.hpp"

namespace factory::feed {

namespace {

using nlohmann::json;

// A label value in the text format: backslash, double quote and newline
// escaped. Guest strings reach here only after the health sample's checks
// (no control characters), but the format is kept whatever arrives.
std::string esc(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string num(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  std::ostringstream o;
  o << std::setprecision(15) << v;
  return o.str();
}

class Exposition {
 public:
  void family(const char* name, const char* type, const char* help) {
    o_ << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
  }
  // labels: already rendered `k="v",...` (may be empty).
  void sample(const std::string& name, const std::string& labels, double v) {
    o_ << name;
    if (!labels.empty()) o_ << "{" << labels << "}";
    o_ << " " << num(v) << "\n";
  }
  std::string str() const { return o_.str(); }

 private:
  std::ostringstream o_;
};

std::string labels(std::initializer_list<std::pair<const char*, std::string>> kv) {
  std::string out;
  for (const auto& [k, v] : kv)
    out += (out.empty() ? "" : ",") + std::string(k) + "=\"" + esc(v) + "\"";
  return out;
}

// A reading the guest sent, as a sample's value; nullopt when it did not
// (an older agent, a card without the call): left out, never 0.
template <class T>
std::optional<double> reading(const std::optional<T>& v) {
  if (!v) return std::nullopt;
  return static_cast<double>(*v);
}

using proto::GpuSample;

struct TenantHealth {
  std::string tenant, tier;
  std::shared_ptr<const store::LatestHealth> health;
  const proto::HealthSample& sample() const { return health->sample; }
};

// The GPU series, named and labelled as NVIDIA's dcgm-exporter writes them
// (its default counters, etc/default-counters.csv), so the dashboards made
// for it work on Factory's tenants; `tenant` and `tier` say whose GPU it is.
struct GpuSeries {
  const char* name;
  std::optional<double> (*value)(const GpuSample&);
  const char* help;
};
constexpr GpuSeries kDcgm[] = {
    {"DCGM_FI_DEV_GPU_UTIL", [](const GpuSample& g) { return reading(g.utilization_percent); },
     "GPU utilization (in %)."},
    {"DCGM_FI_DEV_MEM_COPY_UTIL",
     [](const GpuSample& g) { return reading(g.memory_utilization_percent); },
     "Memory utilization (in %)."},
    {"DCGM_FI_DEV_FB_USED", [](const GpuSample& g) { return reading(g.memory_used_mib); },
     "Framebuffer memory used (in MiB)."},
    {"DCGM_FI_DEV_FB_FREE", [](const GpuSample& g) { return reading(g.memory_free_mib); },
     "Framebuffer memory free (in MiB)."},
    {"DCGM_FI_DEV_FB_RESERVED", [](const GpuSample& g) { return reading(g.memory_reserved_mib); },
     "Framebuffer memory reserved (in MiB)."},
    {"DCGM_FI_DEV_GPU_TEMP", [](const GpuSample& g) { return reading(g.temperature_c); },
     "GPU temperature (in C)."},
    {"DCGM_FI_DEV_MEMORY_TEMP", [](const GpuSample& g) { return reading(g.memory_temperature_c); },
     "Memory temperature (in C)."},
    {"DCGM_FI_DEV_POWER_USAGE", [](const GpuSample& g) { return reading(g.power_draw_w); },
     "Power draw (in W)."},
    {"DCGM_FI_DEV_SM_CLOCK", [](const GpuSample& g) { return reading(g.sm_clock_mhz); },
     "SM clock frequency (in MHz)."},
    {"DCGM_FI_DEV_MEM_CLOCK", [](const GpuSample& g) { return reading(g.memory_clock_mhz); },
     "Memory clock frequency (in MHz)."},
};

// The card's labels, dcgm-exporter's (camelCase `modelName` and `UUID`) or
// Factory's own in Prometheus' snake_case.
std::string card_labels(const TenantHealth& t, const GpuSample& g, bool dcgm) {
  // dcgm-exporter's `device` is the card's /dev node name.
  std::string device = "nvidia" + std::to_string(g.minor_number.value_or(g.index));
  return labels({{"gpu", std::to_string(g.index)},
                 {dcgm ? "UUID" : "uuid", g.uuid},
                 {"pci_bus_id", g.pci_bus_id},
                 {"device", device},
                 {dcgm ? "modelName" : "model_name", g.name},
                 {"hostname", t.sample().hostname},
                 {"tenant", t.tenant},
                 {"tier", t.tier}});
}
std::string gpu_labels(const TenantHealth& t, const GpuSample& g) {
  return card_labels(t, g, true);
}
std::string own_gpu_labels(const TenantHealth& t, const GpuSample& g) {
  return card_labels(t, g, false);
}

// Every GPU of every tenant.
template <class F>
void each_gpu(const std::vector<TenantHealth>& all, F&& each) {
  for (const auto& t : all)
    for (const auto& g : t.sample().gpu.gpus) each(t, g);
}

void render_gpus(Exposition& x, const std::vector<TenantHealth>& all) {
  for (const auto& s : kDcgm) {
    x.family(s.name, "gauge", s.help);
    each_gpu(all, [&](const TenantHealth& t, const GpuSample& g) {
      if (auto v = s.value(g)) x.sample(s.name, gpu_labels(t, g), *v);
    });
  }
}

// A broken card's figures, under dcgm-exporter's names and types
// (etc/default-counters.csv and dcp-metrics-included.csv), so its alert
// rules and dashboards work on Factory's tenants too. What the guest did
// not report (an older agent, a card without the call) is left out, not 0.
struct GpuFaultSeries {
  const char* name;
  const char* type;
  std::optional<double> (*value)(const GpuSample&);
  const char* help;
};
std::optional<double> flag(const std::optional<bool>& v) {
  if (!v) return std::nullopt;
  return *v ? 1 : 0;
}
constexpr GpuFaultSeries kDcgmFaults[] = {
    {"DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter",
     [](const GpuSample& g) { return reading(g.pcie_replay_count); },
     "Total number of PCIe retries."},
    {"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter",
     [](const GpuSample& g) { return reading(g.remapped_rows_correctable); },
     "Number of remapped rows for correctable errors."},
    {"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
     [](const GpuSample& g) { return reading(g.remapped_rows_uncorrectable); },
     "Number of remapped rows for uncorrectable errors."},
    {"DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge",
     [](const GpuSample& g) { return flag(g.remapped_rows_failure); },
     "Whether remapping of rows has failed."},
    {"DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge",
     [](const GpuSample& g) { return flag(g.remapped_rows_pending); },
     "Whether remapping of rows is pending."},
    {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge",
     [](const GpuSample& g) { return reading(g.clocks_event_reasons); },
     "Current clock throttle reasons (NVML's clocks event reason bits)."},
    {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter",
     [](const GpuSample& g) { return reading(g.energy_mj); },
     "Total energy consumption since the driver loaded (in mJ)."},
    {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter",
     [](const GpuSample& g) { return reading(g.ecc_errors_corrected_volatile); },
     "Total number of single-bit volatile ECC errors."},
    {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter",
     [](const GpuSample& g) { return reading(g.ecc_errors_uncorrected_volatile); },
     "Total number of double-bit volatile ECC errors."},
    {"DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter",
     [](const GpuSample& g) { return reading(g.ecc_errors_corrected_aggregate); },
     "Total number of single-bit persistent ECC errors."},
    {"DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter",
     [](const GpuSample& g) { return reading(g.ecc_errors_uncorrected_aggregate); },
     "Total number of double-bit persistent ECC errors."},
    {"DCGM_FI_DEV_RETIRED_SBE", "counter",
     [](const GpuSample& g) { return reading(g.retired_pages_sbe); },
     "Total number of retired pages due to single-bit errors."},
    {"DCGM_FI_DEV_RETIRED_DBE", "counter",
     [](const GpuSample& g) { return reading(g.retired_pages_dbe); },
     "Total number of retired pages due to double-bit errors."},
    {"DCGM_FI_DEV_RETIRED_PENDING", "counter",
     [](const GpuSample& g) { return flag(g.retired_pages_pending); },
     "Total number of pages pending retirement."},
};

struct NvlinkSeries {
  const char* name;
  std::optional<std::uint64_t> proto::NvlinkSample::*value;
  const char* help;
};
constexpr NvlinkSeries kDcgmNvlink[] = {
    {"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", &proto::NvlinkSample::crc_flit_errors,
     "Total number of NVLink flow-control CRC errors."},
    {"DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", &proto::NvlinkSample::crc_data_errors,
     "Total number of NVLink data CRC errors."},
    {"DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", &proto::NvlinkSample::replay_errors,
     "Total number of NVLink retries."},
    {"DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", &proto::NvlinkSample::recovery_errors,
     "Total number of NVLink recovery errors."},
};

void render_gpu_faults(Exposition& x, const std::vector<TenantHealth>& all) {
  x.family("DCGM_FI_DEV_XID_ERRORS", "gauge",
           "Value of the last XID error encountered (0: none not yet acknowledged).");
  each_gpu(all, [&](const TenantHealth& t, const GpuSample& g) {
    x.sample("DCGM_FI_DEV_XID_ERRORS", gpu_labels(t, g), g.last_xid());
  });
  for (const auto& s : kDcgmFaults) {
    x.family(s.name, s.type, s.help);
    each_gpu(all, [&](const TenantHealth& t, const GpuSample& g) {
      if (auto v = s.value(g)) x.sample(s.name, gpu_labels(t, g), *v);
    });
  }
  for (const auto& s : kDcgmNvlink) {
    x.family(s.name, "counter", s.help);
    each_gpu(all, [&](const TenantHealth& t, const GpuSample& g) {
      if (!g.nvlink) return;
      if (auto v = reading((*g.nvlink).*(s.value))) x.sample(s.name, gpu_labels(t, g), *v);
    });
  }
  // Factory's own: what dcgm-exporter cannot say (it stops reporting a lost
  // card), and every Xid with its count until acknowledged, labelled with
  // what it means for the card (contract/xid_catalog.hpp judges the number).
  x.family("factory_gpu_lost", "gauge",
           "1 when NVML answers GPU_IS_LOST for the card: it fell off the bus.");
  each_gpu(all, [&](const TenantHealth& t, const GpuSample& g) {
    x.sample("factory_gpu_lost", own_gpu_labels(t, g), g.lost ? 1 : 0);
  });
  x.family("factory_gpu_xid", "gauge",
           "Times the card reported this Xid, kept until acknowledged in the guest; impact: "
           "card (it needs the admin), watch, application, unknown.");
  each_gpu(all, [&](const TenantHealth& t, const GpuSample& g) {
    for (const auto& e : g.xids) {
      const gpu::XidEntry* entry = gpu::find_xid(e.xid);
      x.sample("factory_gpu_xid",
               own_gpu_labels(t, g) + "," +
                   labels({{"xid", std::to_string(e.xid)},
                           {"impact", entry ? std::string(gpu::impact_name(entry->impact))
                                            : std::string("unknown")}}),
               static_cast<double>(e.count));
    }
  });
}

// GPU time per tenant (docs/usage.md), from the record's GpuUsage: what the
// VM provider saw, so these are the coordinator's counts, not the guest's
// (the busy seconds are the guest's utilization). A deleted tenant's series
// ends with it; `factory usage` reports it from the archive.
void render_gpu_usage(Exposition& x, const std::vector<store::TenantRecord>& tenants) {
  x.family("factory_tenant_gpu_seconds_total", "counter",
           "GPU-seconds the tenant's VM ran with its cards, by card model (the VM provider's "
           "observations).");
  for (const auto& t : tenants)
    if (t.status.gpu_usage)
      for (const auto& [model, s] : t.status.gpu_usage->gpu_seconds_total())
        x.sample("factory_tenant_gpu_seconds_total",
                 labels({{"tenant", t.name}, {"tier", t.tier}, {"gpu_model", model}}), s);
  x.family("factory_tenant_gpu_busy_seconds_total", "counter",
           "Busy GPU-seconds of the tenant's cards (utilization x time, from its health).");
  for (const auto& t : tenants)
    if (t.status.gpu_usage)
      x.sample("factory_tenant_gpu_busy_seconds_total",
               labels({{"tenant", t.name}, {"tier", t.tier}}),
               t.status.gpu_usage->busy_seconds_total());
}

void render_tenant_health(Exposition& x, const std::vector<TenantHealth>& all) {
  x.family("factory_tenant_gpus", "gauge", "GPUs the tenant's guest sees (its latest health).");
  for (const auto& t : all)
    x.sample("factory_tenant_gpus", labels({{"tenant", t.tenant}, {"tier", t.tier}}),
             static_cast<double>(t.sample().gpu.gpus.size()));
  x.family("factory_tenant_health_timestamp_seconds", "gauge",
           "When the coordinator received the tenant's latest health sample (Unix time).");
  for (const auto& t : all)
    if (auto at = parse_rfc3339(t.health->received_at))
      x.sample("factory_tenant_health_timestamp_seconds", labels({{"tenant", t.tenant}}),
               std::chrono::duration<double>(at->time_since_epoch()).count());
  auto cluster_series = [&](const char* name, std::optional<std::int64_t> proto::K8sSection::*v) {
    for (const auto& t : all) {
      const auto& k = t.sample().k8s;
      if (!k || !((*k).*v)) continue;
      x.sample(name, labels({{"tenant", t.tenant}, {"tier", t.tier}, {"resource", k->resource}}),
               static_cast<double>(*((*k).*v)));
    }
  };
  x.family("factory_tenant_allocatable_gpus", "gauge",
           "Allocatable GPUs (HAMi's slices) the tenant's own cluster advertises, summed over its "
           "nodes.");
  cluster_series("factory_tenant_allocatable_gpus", &proto::K8sSection::allocatable);
  x.family("factory_tenant_capacity_gpus", "gauge",
           "GPU capacity the tenant's own cluster advertises, summed over its nodes.");
  cluster_series("factory_tenant_capacity_gpus", &proto::K8sSection::capacity);
  x.family("factory_ollama_models_loaded", "gauge", "Models the tenant's Ollama has loaded.");
  for (const auto& t : all)
    if (t.sample().ollama)
      x.sample("factory_ollama_models_loaded", labels({{"tenant", t.tenant}, {"tier", t.tier}}),
               static_cast<double>(t.sample().ollama->models.size()));
  x.family("factory_ollama_model_gpu_ratio", "gauge",
           "Share of a loaded Ollama model on the GPU (size_vram / size; 1 = all of it).");
  for (const auto& t : all) {
    if (!t.sample().ollama) continue;
    for (const auto& m : t.sample().ollama->models)
      x.sample("factory_ollama_model_gpu_ratio",
               labels({{"tenant", t.tenant}, {"tier", t.tier}, {"model", m.name}}),
               m.size > 0 ? static_cast<double>(m.size_vram) / static_cast<double>(m.size) : 0);
  }
}

// A model endpoint's proxy, as its guest last reported it. Its counters start
// again with the agent (Prometheus' counter resets).
void render_endpoints(Exposition& x, const std::vector<TenantHealth>& all) {
  x.family("factory_endpoint_up", "gauge",
           "1 when the tenant's model endpoint proxy serves (its guest's latest health).");
  for (const auto& t : all)
    if (const auto& e = t.sample().endpoint)
      x.sample("factory_endpoint_up", labels({{"tenant", t.tenant}, {"tier", t.tier}}),
               e->serving ? 1 : 0);
  x.family("factory_endpoint_requests_total", "counter",
           "Requests to the tenant's model endpoint since its agent started, by result.");
  for (const auto& t : all) {
    const auto& e = t.sample().endpoint;
    if (!e) continue;
    for (const auto& [n, result] :
         {std::pair{e->served, "served"}, std::pair{e->unauthorized, "unauthorized"},
          std::pair{e->refused_paths, "refused_path"}, std::pair{e->busy, "busy"},
          std::pair{e->upstream_errors, "upstream_error"}})
      x.sample("factory_endpoint_requests_total",
               labels({{"tenant", t.tenant}, {"tier", t.tier}, {"result", result}}),
               static_cast<double>(n));
  }
  x.family("factory_endpoint_probe_ttft_seconds", "gauge",
           "Time to the first token of the health probe's prompt, at its latest run.");
  for (const auto& t : all) {
    const auto& e = t.sample().endpoint;
    if (!e || !e->probe) continue;
    const auto& p = *e->probe;
    if (p.ok && p.ttft_ms)
      x.sample("factory_endpoint_probe_ttft_seconds",
               labels({{"tenant", t.tenant}, {"tier", t.tier}, {"model", p.model}}),
               *p.ttft_ms / 1000.0);
  }
}

// A model endpoint's usage per key, since the endpoint's first report, as
// the agent's endpoint_usage events were stored (each once; the record's
// own totals, so no reset with the agent). factory_endpoint_requests_total
// is the proxy's own count by result: these are by key, under their own
// name. Key names are the record's (their grammar: [a-z0-9-]).
void render_endpoint_usage(Exposition& x, const std::vector<store::TenantRecord>& tenants) {
  x.family("factory_endpoint_tokens_total", "counter",
           "Tokens a model endpoint's key used, as Ollama counted them, by direction.");
  for (const auto& t : tenants) {
    if (!t.endpoint || !t.endpoint->usage) continue;
    for (const auto& [key, c] : t.endpoint->usage->totals_since_creation())
      for (const auto& [n, direction] :
           {std::pair{c.prompt_tokens, "prompt"}, std::pair{c.completion_tokens, "completion"}})
        x.sample("factory_endpoint_tokens_total",
                 labels({{"tenant", t.name}, {"key", key}, {"direction", direction}}),
                 static_cast<double>(n));
  }
  x.family("factory_endpoint_key_requests_total", "counter",
           "Requests a model endpoint's key made, by outcome (error: a 4xx or 5xx answer or the "
           "model server failing).");
  for (const auto& t : tenants) {
    if (!t.endpoint || !t.endpoint->usage) continue;
    for (const auto& [key, c] : t.endpoint->usage->totals_since_creation())
      for (const auto& [n, outcome] : {std::pair{c.requests - std::min(c.errors, c.requests), "ok"},
                                       std::pair{std::min(c.errors, c.requests), "error"}})
        x.sample("factory_endpoint_key_requests_total",
                 labels({{"tenant", t.name}, {"key", key}, {"outcome", outcome}}),
                 static_cast<double>(n));
  }
}

void render_step_durations(Exposition& x, const StepDurations& d) {
  x.family("factory_plan_step_duration_seconds", "histogram",
           "How long plan steps took on the guest, from started to succeeded or failed.");
  for (const auto& [key, s] : d.series) {
    std::string l = labels({{"tier", key[0]}, {"kind", key[1]}, {"result", key[2]}});
    for (size_t i = 0; i < StepDurations::kBuckets.size(); ++i)
      x.sample("factory_plan_step_duration_seconds_bucket",
               l + ",le=\"" + num(StepDurations::kBuckets[i]) + "\"",
               static_cast<double>(s.buckets[i]));
    x.sample("factory_plan_step_duration_seconds_bucket", l + ",le=\"+Inf\"",
             static_cast<double>(s.count));
    x.sample("factory_plan_step_duration_seconds_sum", l, s.sum);
    x.sample("factory_plan_step_duration_seconds_count", l, static_cast<double>(s.count));
  }
}

}  // namespace

std::string render_metrics(const store::Store& store, const FeedState& state) {
  Exposition x;
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    x.family(name, "counter", help);
    x.sample(name, "", static_cast<double>(v));
  };
  x.family("factory_agents_connected", "gauge", "Agents connected to this coordinator now.");
  x.sample("factory_agents_connected", "", static_cast<double>(state.connected_count()));
  if (auto l = state.leadership()) {
    x.family("factory_leader", "gauge",
             "1 when this replica holds the coordinators' Lease (runs the reconcilers), else 0.");
    x.sample("factory_leader", labels({{"replica", l->replica}}), l->leading ? 1 : 0);
  }
  std::map<std::string, int> phases;
  for (auto p : {"pending", "enrolled", "provisioning", "ready", "failed", "upgrading", "degraded"})
    phases[p] = 0;
  auto tenants = store.list_tenants();
  for (auto& t : tenants) phases[t.phase]++;
  x.family("factory_tenants", "gauge", "Tenants by lifecycle phase.");
  for (auto& [p, n] : phases) x.sample("factory_tenants", labels({{"phase", p}}), n);
  auto presence = state.all();
  x.family("factory_tenant_agent_connected", "gauge", "1 when the tenant's agent is connected.");
  for (auto& t : tenants) {
    auto it = presence.find(t.name);
    x.sample("factory_tenant_agent_connected", labels({{"tenant", t.name}}),
             it != presence.end() && it->second.connected ? 1 : 0);
  }
  // Which agent version runs where (issue 27: an upgrade's progress, and what
  // is left on an old one). The version is the agent's word, read by the
  // protocol's version grammar and bounded; one per tenant, so the labels
  // are no more than the tenants.
  std::map<std::string, int> by_version;
  x.family("factory_agent_version_info", "gauge",
           "1 for each connected agent, labelled with the version it reported.");
  for (auto& t : tenants) {
    auto it = presence.find(t.name);
    if (it == presence.end() || !it->second.connected) continue;
    const std::string version = it->second.version.empty() ? "unknown" : it->second.version;
    ++by_version[version];
    x.sample("factory_agent_version_info", labels({{"tenant", t.name}, {"version", version}}), 1);
  }
  x.family("factory_agents_by_version", "gauge", "Connected agents, by the version they reported.");
  for (const auto& [version, n] : by_version)
    x.sample("factory_agents_by_version", labels({{"version", version}}), n);
  // The binary served to guests and ordered by upgrades: which version a
  // rollout would install, and which hash new tenants' user-data pins.
  if (auto bin = state.agent_binary(); bin.is_object() && bin.contains("sha256")) {
    x.family("factory_agent_binary_info", "gauge",
             "1, labelled with the version and sha256 of the agent binary served "
             "(version \"none\" when it carries no version mark).");
    x.sample("factory_agent_binary_info",
             labels({{"version", bin.value("version", std::string("none"))},
                     {"sha256", bin.value("sha256", std::string())}}),
             1);
  }
  {
    auto upgrades = state.agent_upgrades();
    for (auto r : {"upgraded", "rolled_back", "refused", "failed"}) upgrades.try_emplace(r, 0);
    x.family("factory_agent_upgrades_total", "counter",
             "Agent self-updates ended, by result (counted by the leader that saw them end).");
    for (const auto& [result, n] : upgrades)
      x.sample("factory_agent_upgrades_total", labels({{"result", result}}),
               static_cast<double>(n));
  }
  x.family("factory_agent_spool_dropped_events", "gauge",
           "Events the tenant's agent dropped because its spool was full (its last heartbeat).");
  for (auto& t : tenants) {
    auto it = presence.find(t.name);
    x.sample("factory_agent_spool_dropped_events", labels({{"tenant", t.name}}),
             static_cast<double>(it != presence.end() ? it->second.dropped_events : 0));
  }

  render_gpu_usage(x, tenants);

  std::vector<TenantHealth> health;
  for (auto& t : tenants)
    if (auto h = store.get_health(t.name)) health.push_back({t.name, t.tier, std::move(h)});
  render_gpus(x, health);
  render_gpu_faults(x, health);
  render_tenant_health(x, health);
  render_endpoints(x, health);
  render_endpoint_usage(x, tenants);
  render_step_durations(x, state.step_durations());

  const AgentCounters& m = state.counters();
  x.family("factory_enrollments_total", "counter", "Agent enrollments, by result.");
  x.sample("factory_enrollments_total", labels({{"result", "accepted"}}),
           static_cast<double>(m.enrollments_accepted.load()));
  x.sample("factory_enrollments_total", labels({{"result", "refused"}}),
           static_cast<double>(m.enrollments_refused.load()));
  x.family("factory_events_ingested_total", "counter", "Agent events stored, by kind.");
  for (const auto& [kind, n] : state.events_by_kind())
    x.sample("factory_events_ingested_total", labels({{"kind", kind}}), static_cast<double>(n));
  x.family("factory_health_samples_total", "counter",
           "Health samples taken in as the tenant's latest.");
  for (const auto& [tenant, n] : state.health_samples())
    x.sample("factory_health_samples_total", labels({{"tenant", tenant}}), static_cast<double>(n));
  x.family("factory_agent_messages_rejected_total", "counter",
           "Parts of agents' messages dropped (a field out of its bounds, a message over its "
           "rate), by tenant and reason.");
  for (const auto& [key, n] : state.rejected())
    x.sample("factory_agent_messages_rejected_total",
             labels({{"tenant", key.first}, {"reason", key.second}}), static_cast<double>(n));

  counter("factory_enrollments_accepted_total", "Agent enrollments accepted.",
          m.enrollments_accepted);
  counter("factory_enrollments_refused_total", "Agent enrollments refused (bad token or CSR).",
          m.enrollments_refused);
  counter("factory_agent_connections_refused_total",
          "Agent connections refused (revoked certificate, wrong tenant).", m.connections_refused);
  counter("factory_events_stored_total", "Agent events stored.", m.events_stored);
  counter("factory_events_duplicate_total", "Replayed agent events dropped as duplicates.",
          m.events_duplicate);
  counter("factory_frames_rejected_total", "Malformed frames from agents.", m.frames_rejected);
  counter("factory_frames_unknown_type_total", "Frames of an unknown type, ignored.",
          m.frames_unknown_type);
  counter("factory_certificates_renewed_total", "Agent certificates renewed.",
          m.certificates_renewed);
  counter("factory_store_failures_total",
          "Agent events the store could not write (the session was closed; the agent resends).",
          m.store_failures);
  x.family("factory_agent_quota_refusals_total", "counter",
           "Agent messages refused because the tenant was over a quota (agents.quota), by "
           "tenant and quota.");
  for (const auto& [key, n] : state.over_quota())
    x.sample("factory_agent_quota_refusals_total",
             labels({{"tenant", key.first}, {"quota", key.second}}), static_cast<double>(n));
  counter("factory_events_expired_total",
          "Stored agent events dropped by retention, oldest first (agents.quota.max_events_stored, "
          "max_event_age).",
          store.stats().events_expired);
  const auto store_stats = store.stats();
  counter("factory_store_transactions_total",
          "Transactions the store's writer committed (each a batch of events and record changes).",
          store_stats.transactions);
  counter("factory_store_records_written_total",
          "Tenant records the store wrote: an event's projection, at most once per tenant per "
          "transaction, or a change of the record.",
          store_stats.records_written);
  const BusStats bus = state.bus().stats();
  x.family("factory_feed_readers", "gauge", "Readers of GET /v1/events now.");
  x.sample("factory_feed_readers", "", static_cast<double>(bus.subscribers));
  counter("factory_feed_readers_dropped_total",
          "Readers of GET /v1/events dropped for falling behind (a full 1 MiB queue).",
          bus.dropped_slow);
  x.family("factory_store_queued_operations", "gauge",
           "Events and record changes waiting for the store's writer now.");
  x.sample("factory_store_queued_operations", "", static_cast<double>(store.stats().queued));
  return x.str();
}

}  // namespace factory::feed
