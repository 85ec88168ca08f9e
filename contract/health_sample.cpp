#include "contract/health_sample.hpp"

#include <cmath>
#include <limits>

#include "common/durations.hpp"
#include "common/json_writer.hpp"
#include "contract/mig_cards.hpp"

namespace factory::proto {

using nlohmann::json;
namespace lim = health_limits;

namespace {

// Each type's fields, listed once: to_json() writes them into a tree and
// to_text() into bytes (common/json_writer.hpp), from this one list.

// Declared first: list() finds each by ordinary lookup (not by argument-
// dependent lookup, which skips this unnamed namespace).
template <class W>
void write(W& w, const DiagnosisSample& d);
template <class W>
void write(W& w, const GpuProcessSample& p);
template <class W>
void write(W& w, const MigInstanceSample& m);
template <class W>
void write(W& w, const XidSample& x);
template <class W>
void write(W& w, const GpuSample& g);
template <class W>
void write(W& w, const OllamaModelSample& m);
template <class W>
void write(W& w, const K8sNodeSample& n);
template <class W>
void write(W& w, const K8sPodSample& p);

template <class W>
void text_or_null(W& w, std::string_view k, const std::string& s) {
  w.key(k);
  if (s.empty())
    w.value(nullptr);
  else
    w.value(s);
}

template <class W, class T>
void member(W& w, std::string_view k, const T& v) {
  w.key(k);
  w.value(v);
}

template <class W>
void write(W& w, const DiagnosisSample& d) {
  w.begin_object();
  member(w, "code", d.code);
  member(w, "summary", d.summary);
  member(w, "fix", d.fix);
  member(w, "details", d.details);
  w.end_object();
}

template <class W, class T>
void list(W& w, std::string_view k, const std::vector<T>& xs) {
  w.key(k);
  w.begin_array();
  for (const auto& x : xs) write(w, x);
  w.end_array();
}

// Optional keys: present only when they say something.
template <class W>
void error_and_diagnoses(W& w, const std::string& error, const std::vector<DiagnosisSample>& ds) {
  if (!error.empty()) member(w, "error", error);
  if (!ds.empty()) list(w, "diagnoses", ds);
}

template <class W>
void write(W& w, const GpuProcessSample& p) {
  w.begin_object();
  member(w, "pid", p.pid);
  member(w, "name", p.name);
  member(w, "used_memory_mib", p.used_memory_mib);
  w.end_object();
}

template <class W>
void write(W& w, const MigInstanceSample& m) {
  w.begin_object();
  member(w, "profile", m.profile);
  member(w, "memory_gib", m.memory_gib);
  member(w, "uuid", m.uuid);
  w.end_object();
}

template <class W>
void write(W& w, const XidSample& x) {
  w.begin_object();
  member(w, "xid", x.xid);
  member(w, "count", x.count);
  text_or_null(w, "first_at", x.first_at);
  text_or_null(w, "last_at", x.last_at);
  w.end_object();
}

template <class W>
void write(W& w, const NvlinkSample& n) {
  w.begin_object();
  member(w, "links", n.links);
  member(w, "crc_flit_errors", n.crc_flit_errors);
  member(w, "crc_data_errors", n.crc_data_errors);
  member(w, "replay_errors", n.replay_errors);
  member(w, "recovery_errors", n.recovery_errors);
  w.end_object();
}

template <class W>
void write(W& w, const GpuSample& g) {
  w.begin_object();
  member(w, "index", g.index);
  member(w, "name", g.name);
  text_or_null(w, "uuid", g.uuid);
  member(w, "pci_bus_id", g.pci_bus_id);
  member(w, "minor_number", g.minor_number);
  member(w, "memory_total_mib", g.memory_total_mib);
  member(w, "memory_used_mib", g.memory_used_mib);
  member(w, "memory_free_mib", g.memory_free_mib);
  member(w, "memory_reserved_mib", g.memory_reserved_mib);
  member(w, "utilization_percent", g.utilization_percent);
  member(w, "memory_utilization_percent", g.memory_utilization_percent);
  member(w, "temperature_c", g.temperature_c);
  member(w, "memory_temperature_c", g.memory_temperature_c);
  member(w, "power_draw_w", g.power_draw_w);
  member(w, "power_limit_w", g.power_limit_w);
  member(w, "sm_clock_mhz", g.sm_clock_mhz);
  member(w, "memory_clock_mhz", g.memory_clock_mhz);
  text_or_null(w, "pstate", g.pstate);
  member(w, "ecc_errors_uncorrected_volatile", g.ecc_errors_uncorrected_volatile);
  text_or_null(w, "mig_mode", g.mig_mode);
  list(w, "processes", g.processes);
  text_or_null(w, "serial", g.serial);
  member(w, "lost", g.lost);
  member(w, "ecc_errors_corrected_volatile", g.ecc_errors_corrected_volatile);
  member(w, "ecc_errors_corrected_aggregate", g.ecc_errors_corrected_aggregate);
  member(w, "ecc_errors_uncorrected_aggregate", g.ecc_errors_uncorrected_aggregate);
  member(w, "remapped_rows_correctable", g.remapped_rows_correctable);
  member(w, "remapped_rows_uncorrectable", g.remapped_rows_uncorrectable);
  member(w, "remapped_rows_pending", g.remapped_rows_pending);
  member(w, "remapped_rows_failure", g.remapped_rows_failure);
  member(w, "retired_pages_sbe", g.retired_pages_sbe);
  member(w, "retired_pages_dbe", g.retired_pages_dbe);
  member(w, "retired_pages_pending", g.retired_pages_pending);
  member(w, "pcie_replay_count", g.pcie_replay_count);
  member(w, "clocks_event_reasons", g.clocks_event_reasons);
  member(w, "energy_mj", g.energy_mj);
  list(w, "xids", g.xids);
  if (g.nvlink) {
    w.key("nvlink");
    write(w, *g.nvlink);
  }
  if (!g.mig_instances.empty()) list(w, "mig_instances", g.mig_instances);
  w.end_object();
}

template <class W>
void write(W& w, const GpuSection& s) {
  w.begin_object();
  member(w, "source", s.source);
  text_or_null(w, "driver_version", s.driver_version);
  text_or_null(w, "cuda_driver_version", s.cuda_driver_version);
  list(w, "gpus", s.gpus);
  if (!s.via.empty()) member(w, "via", s.via);
  error_and_diagnoses(w, s.error, s.diagnoses);
  w.end_object();
}

template <class W>
void write(W& w, const OllamaModelSample& m) {
  w.begin_object();
  member(w, "name", m.name);
  member(w, "size", m.size);
  member(w, "size_vram", m.size_vram);
  member(w, "gpu_percent", m.gpu_percent);
  member(w, "context_length", m.context_length);
  text_or_null(w, "expires_at", m.expires_at);
  w.end_object();
}

template <class W>
void write(W& w, const OllamaSection& o) {
  w.begin_object();
  text_or_null(w, "version", o.version);
  list(w, "models", o.models);
  error_and_diagnoses(w, o.error, o.diagnoses);
  w.end_object();
}

template <class W>
void write(W& w, const K8sNodeSample& n) {
  w.begin_object();
  member(w, "name", n.name);
  member(w, "ready", n.ready);
  member(w, "allocatable", n.allocatable);
  member(w, "capacity", n.capacity);
  text_or_null(w, "gpu_label", n.gpu_label);
  w.end_object();
}

template <class W>
void write(W& w, const K8sPodSample& p) {
  w.begin_object();
  member(w, "namespace", p.ns);
  member(w, "name", p.name);
  member(w, "phase", p.phase);
  member(w, "status", p.status);
  member(w, "node", p.node);
  member(w, "gpus", p.gpus);
  member(w, "gpumem_mib", p.gpumem_mib);
  member(w, "gpumem_percentage", p.gpumem_percentage);
  w.end_object();
}

template <class W>
void write(W& w, const K8sSection& k) {
  w.begin_object();
  member(w, "resource", k.resource);
  member(w, "allocatable", k.allocatable);
  member(w, "capacity", k.capacity);
  list(w, "nodes", k.nodes);
  list(w, "pods", k.pods);
  error_and_diagnoses(w, k.error, k.diagnoses);
  w.end_object();
}

template <class W>
void write(W& w, const ProbeSample& p) {
  w.begin_object();
  member(w, "model", p.model);
  member(w, "ok", p.ok);
  member(w, "ttft_ms", p.ttft_ms);
  member(w, "total_ms", p.total_ms);
  text_or_null(w, "at", p.at);
  if (!p.error.empty()) member(w, "error", p.error);
  w.end_object();
}

template <class W>
void write(W& w, const EndpointSection& e) {
  w.begin_object();
  member(w, "serving", e.serving);
  member(w, "requests", e.requests);
  member(w, "served", e.served);
  member(w, "unauthorized", e.unauthorized);
  member(w, "refused_paths", e.refused_paths);
  member(w, "busy", e.busy);
  member(w, "upstream_errors", e.upstream_errors);
  member(w, "in_flight", e.in_flight);
  text_or_null(w, "certificate_expires_at", e.certificate_expires_at);
  w.key("probe");
  if (e.probe)
    write(w, *e.probe);
  else
    w.value(nullptr);
  w.end_object();
}

template <class W>
void write(W& w, const HealthSample& h) {
  w.begin_object();
  member(w, "time", h.time);
  member(w, "hostname", h.hostname);
  w.key("gpu");
  write(w, h.gpu);
  if (!h.plan_hash.empty()) member(w, "plan_hash", h.plan_hash);
  if (h.ollama) {
    w.key("ollama");
    write(w, *h.ollama);
  }
  if (h.k8s) {
    w.key("k8s");
    write(w, *h.k8s);
  }
  if (h.endpoint) {
    w.key("endpoint");
    write(w, *h.endpoint);
  }
  w.end_object();
}

template <class T>
json tree_of(const T& x) {
  JsonTree w;
  write(w, x);
  return w.take();
}

}  // namespace

json DiagnosisSample::to_json() const {
  return tree_of(*this);
}
json GpuProcessSample::to_json() const {
  return tree_of(*this);
}
json MigInstanceSample::to_json() const {
  return tree_of(*this);
}
json XidSample::to_json() const {
  return tree_of(*this);
}
json NvlinkSample::to_json() const {
  return tree_of(*this);
}

int GpuSample::last_xid() const {
  // The latest by time; among equal times (or unreadable ones) the later
  // in the list, which the agent keeps oldest first.
  const XidSample* last = nullptr;
  std::optional<Clock::time_point> last_time;
  for (const auto& x : xids) {
    auto t = parse_rfc3339(x.last_at);
    std::optional<Clock::time_point> at = t ? std::optional(*t) : std::nullopt;
    if (!last || !at || !last_time || *at >= *last_time) {
      last = &x;
      last_time = at;
    }
  }
  return last ? last->xid : 0;
}

json GpuSample::to_json() const {
  return tree_of(*this);
}
json GpuSection::to_json() const {
  return tree_of(*this);
}
json OllamaModelSample::to_json() const {
  return tree_of(*this);
}
json OllamaSection::to_json() const {
  return tree_of(*this);
}
json K8sNodeSample::to_json() const {
  return tree_of(*this);
}
json K8sPodSample::to_json() const {
  return tree_of(*this);
}
json K8sSection::to_json() const {
  return tree_of(*this);
}
json ProbeSample::to_json() const {
  return tree_of(*this);
}
json EndpointSection::to_json() const {
  return tree_of(*this);
}
json HealthSample::to_json() const {
  return tree_of(*this);
}

std::string HealthSample::to_text() const {
  // A whole H200 sample is about 1.9 KB.
  JsonText w(2048);
  write(w, *this);
  return w.take();
}

std::vector<const DiagnosisSample*> HealthSample::all_diagnoses() const {
  std::vector<const DiagnosisSample*> out;
  for (const auto& d : gpu.diagnoses) out.push_back(&d);
  if (ollama)
    for (const auto& d : ollama->diagnoses) out.push_back(&d);
  if (k8s)
    for (const auto& d : k8s->diagnoses) out.push_back(&d);
  return out;
}

std::string clip_text(const std::string& s, std::size_t max) {
  std::string out;
  out.reserve(std::min(s.size(), max));
  std::size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    std::size_t len = c < 0x80           ? 1
                      : (c >> 5) == 0x6  ? 2
                      : (c >> 4) == 0xe  ? 3
                      : (c >> 3) == 0x1e ? 4
                                         : 0;
    bool valid = len > 0 && i + len <= s.size();
    for (std::size_t k = 1; valid && k < len; ++k)
      valid = (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
    // Overlong forms and C1 controls (0xC2 0x80..0x9F) are refused too.
    if (valid && len == 2 &&
        (c < 0xc2 || (c == 0xc2 && static_cast<unsigned char>(s[i + 1]) < 0xa0)))
      valid = false;
    if (valid && len == 1 && (c < 0x20 || c == 0x7f)) valid = false;
    std::string piece = valid ? s.substr(i, len) : std::string("?");
    if (out.size() + piece.size() > max) break;
    out += piece;
    i += valid ? len : 1;
  }
  return out;
}

namespace {

template <class T>
void cap(std::vector<T>& v, std::size_t n) {
  if (v.size() > n) v.resize(n);
}

// Details as the coordinator accepts them: strings clipped, at most 4 deep.
json clip_json(const json& j, int depth) {
  if (j.is_string()) return clip_text(j.get_ref<const std::string&>(), lim::kText);
  if (j.is_object()) {
    json out = json::object();
    if (depth >= 4) return out;
    for (auto& [k, v] : j.items()) out[clip_text(k, lim::kShort)] = clip_json(v, depth + 1);
    return out;
  }
  if (j.is_array()) {
    json out = json::array();
    if (depth >= 4) return out;
    for (auto& v : j) out.push_back(clip_json(v, depth + 1));
    return out;
  }
  return j;
}

void clip_diagnoses(std::vector<DiagnosisSample>& ds) {
  cap(ds, lim::kDiagnoses);
  for (auto& d : ds) {
    d.code = clip_text(d.code, lim::kShort);
    d.summary = clip_text(d.summary, lim::kText);
    d.fix = clip_text(d.fix, lim::kText);
    d.details = d.details.is_object() ? clip_json(d.details, 0) : json::object();
    if (d.details.dump().size() > lim::kDetails) d.details = json::object();
  }
}

}  // namespace

void make_sendable(HealthSample& h) {
  h.time = clip_text(h.time, lim::kShort);
  h.hostname = clip_text(h.hostname, lim::kName);
  h.plan_hash = clip_text(h.plan_hash, lim::kShort);
  auto& g = h.gpu;
  g.driver_version = clip_text(g.driver_version, lim::kShort);
  g.cuda_driver_version = clip_text(g.cuda_driver_version, lim::kShort);
  g.via = clip_text(g.via, lim::kText);
  g.error = clip_text(g.error, lim::kText);
  clip_diagnoses(g.diagnoses);
  cap(g.gpus, lim::kGpus);
  for (auto& x : g.gpus) {
    x.name = clip_text(x.name, lim::kName);
    x.uuid = clip_text(x.uuid, lim::kShort);
    x.pci_bus_id = clip_text(x.pci_bus_id, lim::kShort);
    x.serial = clip_text(x.serial, lim::kShort);
    cap(x.processes, lim::kProcesses);
    for (auto& p : x.processes) p.name = clip_text(p.name, lim::kName);
    cap(x.mig_instances, lim::kMigInstances);
    for (auto& m : x.mig_instances) {
      m.profile = clip_text(m.profile, lim::kShort);
      m.uuid = clip_text(m.uuid, lim::kShort);
    }
    // The most recent are the ones to keep.
    if (x.xids.size() > lim::kXids)
      x.xids.erase(x.xids.begin(), x.xids.end() - static_cast<std::ptrdiff_t>(lim::kXids));
    for (auto& e : x.xids) {
      e.first_at = clip_text(e.first_at, lim::kShort);
      e.last_at = clip_text(e.last_at, lim::kShort);
    }
  }
  if (h.ollama) {
    auto& o = *h.ollama;
    o.version = clip_text(o.version, lim::kShort);
    o.error = clip_text(o.error, lim::kText);
    clip_diagnoses(o.diagnoses);
    cap(o.models, lim::kModels);
    for (auto& m : o.models) {
      m.name = clip_text(m.name, lim::kName);
      m.expires_at = clip_text(m.expires_at, lim::kShort);
    }
  }
  if (h.k8s) {
    auto& k = *h.k8s;
    k.resource = clip_text(k.resource, lim::kName);
    k.error = clip_text(k.error, lim::kText);
    clip_diagnoses(k.diagnoses);
    cap(k.nodes, lim::kNodes);
    for (auto& n : k.nodes) {
      n.name = clip_text(n.name, lim::kName);
      n.gpu_label = clip_text(n.gpu_label, lim::kShort);
    }
    cap(k.pods, lim::kPods);
    for (auto& p : k.pods) {
      p.ns = clip_text(p.ns, lim::kShort);
      p.name = clip_text(p.name, lim::kName);
      p.phase = clip_text(p.phase, lim::kShort);
      p.status = clip_text(p.status, lim::kShort);
      p.node = clip_text(p.node, lim::kName);
    }
  }
  if (h.endpoint) {
    h.endpoint->certificate_expires_at = clip_text(h.endpoint->certificate_expires_at, lim::kShort);
    if (h.endpoint->probe) {
      auto& p = *h.endpoint->probe;
      p.model = clip_text(p.model, lim::kName);
      p.at = clip_text(p.at, lim::kShort);
      p.error = clip_text(p.error, lim::kText);
    }
  }
  // The longest lists go first when the whole would not fit a frame.
  if (h.to_json().dump().size() <= lim::kSampleBytes) return;
  for (auto& x : h.gpu.gpus) x.processes.clear();
  if (h.k8s && h.to_json().dump().size() > lim::kSampleBytes) h.k8s->pods.clear();
  if (h.to_json().dump().size() > lim::kSampleBytes) {
    auto drop_details = [](std::vector<DiagnosisSample>& ds) {
      for (auto& d : ds) d.details = json::object();
    };
    drop_details(h.gpu.diagnoses);
    if (h.ollama) drop_details(h.ollama->diagnoses);
    if (h.k8s) drop_details(h.k8s->diagnoses);
  }
}

// ---------------------------------------------------------------------------
// Reading a stranger's sample.

namespace {

// A string of the sample: shown as it is, so no control characters; ""
// when absent or dropped.
std::string text(FieldReader& r, const char* key, std::size_t max) {
  return r.clean_text(key, max).value_or("");
}

// Ranges wide enough for any card made, narrow enough that a number that
// is not a reading (a negative size, 2^63 MiB) never reaches a dashboard.
constexpr long double kMaxMib = 16.0L * 1024 * 1024;  // 16 TiB
constexpr long double kMaxBytes = 1ULL << 50;         // 1 PiB
constexpr long double kMaxCount = 1'000'000;
// Error counters: more than any card could count in its life, fewer than
// a double holds exactly (so /metrics prints what was sent).
constexpr long double kMaxErrors = 1e15L;

bool clean_json(const json& j, std::size_t depth = 0) {
  if (depth > 4) return false;
  if (j.is_string()) return is_clean_text(j.get_ref<const std::string&>(), lim::kDetails);
  if (j.is_object()) {
    for (auto& [k, v] : j.items())
      if (!is_clean_text(k, lim::kShort) || !clean_json(v, depth + 1)) return false;
  } else if (j.is_array()) {
    for (auto& v : j)
      if (!clean_json(v, depth + 1)) return false;
  }
  return true;
}

std::vector<DiagnosisSample> read_diagnoses(FieldReader& r) {
  std::vector<DiagnosisSample> out;
  int i = 0;
  for (const json* e : r.objects("diagnoses", lim::kDiagnoses)) {
    FieldReader d(*e, r.rejections(), r.item("diagnoses", i++));
    DiagnosisSample s;
    auto code = d.matching("code", lim::kShort,
                           [](const std::string& c) { return health_formats::diagnosis_code(c); });
    if (!code) {
      // A diagnosis is its code: without one it is nothing to show.
      if (!d.get("code")) d.reject("code", RejectReason::missing);
      continue;
    }
    s.code = std::move(*code);
    s.summary = text(d, "summary", lim::kText);
    s.fix = text(d, "fix", lim::kText);
    if (const json* det = d.get("details")) {
      if (!det->is_object())
        d.reject("details", RejectReason::wrong_type);
      else if (det->dump().size() > lim::kDetails)
        d.reject("details", RejectReason::too_long);
      else if (!clean_json(*det))
        d.reject("details", RejectReason::bad_format);
      else
        s.details = *det;
    }
    out.push_back(std::move(s));
  }
  return out;
}

// An RFC 3339 time the agent wrote, or "" (counted) when it is not one.
std::string timestamp(FieldReader& r, const char* key) {
  return r.time(key, lim::kShort).value_or("");
}

void read_faults(FieldReader& r, GpuSample& g) {
  g.serial = text(r, "serial", lim::kShort);
  g.lost = r.boolean("lost").value_or(false);
  g.ecc_errors_corrected_volatile =
      r.integer<std::uint64_t>("ecc_errors_corrected_volatile", 0, kMaxErrors);
  g.ecc_errors_corrected_aggregate =
      r.integer<std::uint64_t>("ecc_errors_corrected_aggregate", 0, kMaxErrors);
  g.ecc_errors_uncorrected_aggregate =
      r.integer<std::uint64_t>("ecc_errors_uncorrected_aggregate", 0, kMaxErrors);
  // A card has a few thousand spare rows at most.
  g.remapped_rows_correctable = r.integer<std::uint64_t>("remapped_rows_correctable", 0, kMaxCount);
  g.remapped_rows_uncorrectable =
      r.integer<std::uint64_t>("remapped_rows_uncorrectable", 0, kMaxCount);
  g.remapped_rows_pending = r.boolean("remapped_rows_pending");
  g.remapped_rows_failure = r.boolean("remapped_rows_failure");
  g.retired_pages_sbe = r.integer<std::uint64_t>("retired_pages_sbe", 0, kMaxCount);
  g.retired_pages_dbe = r.integer<std::uint64_t>("retired_pages_dbe", 0, kMaxCount);
  g.retired_pages_pending = r.boolean("retired_pages_pending");
  // NVML's counter is an unsigned int.
  g.pcie_replay_count = r.integer<std::uint64_t>("pcie_replay_count", 0, 4294967295.0L);
  // A 64-bit mask of which NVML defines nine bits; a newer driver's bits
  // are kept, anything past 32 bits is not a reading.
  g.clocks_event_reasons = r.integer<std::uint64_t>("clocks_event_reasons", 0, 4294967295.0L);
  // 2^53 mJ is 285 years at 1 kW.
  g.energy_mj = r.integer<std::uint64_t>("energy_mj", 0, 9007199254740992.0L);
  if (const json* n = r.get("nvlink")) {
    if (n->is_object()) {
      FieldReader nr(*n, r.rejections(), r.at("nvlink"));
      NvlinkSample s;
      s.links = nr.integer<std::uint64_t>("links", 0, 64);
      s.crc_flit_errors = nr.integer<std::uint64_t>("crc_flit_errors", 0, kMaxErrors);
      s.crc_data_errors = nr.integer<std::uint64_t>("crc_data_errors", 0, kMaxErrors);
      s.replay_errors = nr.integer<std::uint64_t>("replay_errors", 0, kMaxErrors);
      s.recovery_errors = nr.integer<std::uint64_t>("recovery_errors", 0, kMaxErrors);
      g.nvlink = s;
    } else {
      r.reject("nvlink", RejectReason::wrong_type);
    }
  }
  int i = 0;
  for (const json* e : r.objects("xids", lim::kXids)) {
    FieldReader x(*e, r.rejections(), r.item("xids", i++));
    XidSample s;
    // 999 is NVML's "an Xid it does not know"; nothing above it is one.
    auto xid = x.integer<int>("xid", 1, 999);
    if (!xid) continue;  // an Xid entry is its number
    s.xid = *xid;
    s.count = x.integer<std::uint64_t>("count", 1, 1e9L).value_or(1);
    s.first_at = timestamp(x, "first_at");
    s.last_at = timestamp(x, "last_at");
    g.xids.push_back(std::move(s));
  }
}

GpuSample read_gpu(FieldReader& r, int position) {
  GpuSample g;
  g.index = r.integer<int>("index", 0, 63).value_or(position);
  g.name = text(r, "name", lim::kName);
  g.uuid = text(r, "uuid", lim::kShort);
  g.pci_bus_id = text(r, "pci_bus_id", lim::kShort);
  g.minor_number = r.integer<int>("minor_number", 0, 255);
  g.memory_total_mib = r.integer<std::uint64_t>("memory_total_mib", 0, kMaxMib);
  g.memory_used_mib = r.integer<std::uint64_t>("memory_used_mib", 0, kMaxMib);
  g.memory_free_mib = r.integer<std::uint64_t>("memory_free_mib", 0, kMaxMib);
  g.memory_reserved_mib = r.integer<std::uint64_t>("memory_reserved_mib", 0, kMaxMib);
  g.utilization_percent = r.integer<int>("utilization_percent", 0, 100);
  g.memory_utilization_percent = r.integer<int>("memory_utilization_percent", 0, 100);
  g.temperature_c = r.integer<int>("temperature_c", -60, 200);
  g.memory_temperature_c = r.integer<int>("memory_temperature_c", -60, 200);
  g.power_draw_w = r.number("power_draw_w", 0, 10000);
  g.power_limit_w = r.number("power_limit_w", 0, 10000);
  g.sm_clock_mhz = r.integer<int>("sm_clock_mhz", 0, 100000);
  g.memory_clock_mhz = r.integer<int>("memory_clock_mhz", 0, 100000);
  g.pstate = text(r, "pstate", 4);
  if (!g.pstate.empty() && !health_formats::pstate(g.pstate)) {
    r.reject("pstate", RejectReason::bad_format);
    g.pstate.clear();
  }
  g.ecc_errors_uncorrected_volatile =
      r.integer<std::uint64_t>("ecc_errors_uncorrected_volatile", 0, 1e15L);
  g.mig_mode = text(r, "mig_mode", 16);
  if (!g.mig_mode.empty() && g.mig_mode != "Enabled" && g.mig_mode != "Disabled") {
    r.reject("mig_mode", RejectReason::unknown_value);
    g.mig_mode.clear();
  }
  int i = 0;
  for (const json* e : r.objects("processes", lim::kProcesses)) {
    FieldReader p(*e, r.rejections(), r.item("processes", i++));
    GpuProcessSample s;
    auto pid = p.integer<std::uint32_t>("pid", 1, std::numeric_limits<std::int32_t>::max());
    if (!pid) continue;  // a process is its pid
    s.pid = *pid;
    s.name = text(p, "name", lim::kName);
    s.used_memory_mib = p.integer<std::uint64_t>("used_memory_mib", 0, kMaxMib);
    g.processes.push_back(std::move(s));
  }
  i = 0;
  for (const json* e : r.objects("mig_instances", lim::kMigInstances)) {
    FieldReader m(*e, r.rejections(), r.item("mig_instances", i++));
    MigInstanceSample s;
    s.profile = text(m, "profile", 24);
    if (!valid_mig_profile_name(s.profile)) {
      m.reject("profile", RejectReason::bad_format);
      continue;  // a slice is its profile
    }
    s.memory_gib = m.number("memory_gib", 0, 4096);
    s.uuid = text(m, "uuid", lim::kShort);
    if (!s.uuid.empty() && !health_formats::mig_uuid(s.uuid)) {
      m.reject("uuid", RejectReason::bad_format);
      s.uuid.clear();
    }
    g.mig_instances.push_back(std::move(s));
  }
  read_faults(r, g);
  return g;
}

GpuSection read_gpu_section(FieldReader& r) {
  GpuSection s;
  s.source = text(r, "source", 16);
  if (s.source != "nvml" && s.source != "nvidia-smi" && s.source != "none") {
    if (!s.source.empty()) r.reject("source", RejectReason::unknown_value);
    s.source = "none";
  }
  s.driver_version = text(r, "driver_version", lim::kShort);
  s.cuda_driver_version = text(r, "cuda_driver_version", lim::kShort);
  s.via = text(r, "via", lim::kText);
  int i = 0;
  for (const json* e : r.objects("gpus", lim::kGpus)) {
    FieldReader g(*e, r.rejections(), r.item("gpus", i));
    s.gpus.push_back(read_gpu(g, i++));
  }
  s.error = text(r, "error", lim::kText);
  s.diagnoses = read_diagnoses(r);
  return s;
}

OllamaSection read_ollama(FieldReader& r) {
  OllamaSection s;
  s.version = text(r, "version", lim::kShort);
  int i = 0;
  for (const json* e : r.objects("models", lim::kModels)) {
    FieldReader m(*e, r.rejections(), r.item("models", i++));
    OllamaModelSample x;
    x.name = text(m, "name", lim::kName);
    if (x.name.empty()) continue;  // a model is its name
    x.size = m.integer<std::uint64_t>("size", 0, kMaxBytes).value_or(0);
    x.size_vram = m.integer<std::uint64_t>("size_vram", 0, kMaxBytes).value_or(0);
    if (x.size_vram > x.size) {
      m.reject("size_vram", RejectReason::out_of_range);
      x.size_vram = x.size;
    }
    x.gpu_percent = m.integer<int>("gpu_percent", 0, 100).value_or(0);
    x.context_length = m.integer<std::int64_t>("context_length", 0, 1LL << 31);
    x.expires_at = text(m, "expires_at", lim::kShort);
    s.models.push_back(std::move(x));
  }
  s.error = text(r, "error", lim::kText);
  s.diagnoses = read_diagnoses(r);
  return s;
}

K8sSection read_k8s(FieldReader& r) {
  K8sSection s;
  s.resource = text(r, "resource", lim::kName);
  if (!health_formats::k8s_resource(s.resource)) {
    if (!s.resource.empty()) r.reject("resource", RejectReason::bad_format);
    s.resource = "nvidia.com/gpu";
  }
  s.allocatable = r.integer<std::int64_t>("allocatable", 0, kMaxCount);
  s.capacity = r.integer<std::int64_t>("capacity", 0, kMaxCount);
  int i = 0;
  for (const json* e : r.objects("nodes", lim::kNodes)) {
    FieldReader n(*e, r.rejections(), r.item("nodes", i++));
    K8sNodeSample x;
    x.name = text(n, "name", lim::kName);
    x.ready = n.boolean("ready").value_or(false);
    x.allocatable = n.integer<std::int64_t>("allocatable", 0, kMaxCount);
    x.capacity = n.integer<std::int64_t>("capacity", 0, kMaxCount);
    x.gpu_label = text(n, "gpu_label", lim::kShort);
    s.nodes.push_back(std::move(x));
  }
  i = 0;
  for (const json* e : r.objects("pods", lim::kPods)) {
    FieldReader p(*e, r.rejections(), r.item("pods", i++));
    K8sPodSample x;
    x.ns = text(p, "namespace", lim::kShort);
    x.name = text(p, "name", lim::kName);
    x.phase = text(p, "phase", lim::kShort);
    x.status = text(p, "status", lim::kShort);
    x.node = text(p, "node", lim::kName);
    x.gpus = p.integer<std::int64_t>("gpus", 0, kMaxCount);
    x.gpumem_mib = p.integer<std::int64_t>("gpumem_mib", 0, kMaxMib);
    x.gpumem_percentage = p.integer<std::int64_t>("gpumem_percentage", 0, 100);
    s.pods.push_back(std::move(x));
  }
  s.error = text(r, "error", lim::kText);
  s.diagnoses = read_diagnoses(r);
  return s;
}

EndpointSection read_endpoint(FieldReader& r) {
  EndpointSection s;
  s.serving = r.boolean("serving").value_or(false);
  // Counters since the agent started: a month of a busy endpoint fits 2^40.
  constexpr long double kMaxCounter = 1ULL << 40;
  const std::pair<const char*, std::uint64_t*> counters[] = {
      {"requests", &s.requests},
      {"served", &s.served},
      {"unauthorized", &s.unauthorized},
      {"refused_paths", &s.refused_paths},
      {"busy", &s.busy},
      {"upstream_errors", &s.upstream_errors},
      {"in_flight", &s.in_flight}};
  for (auto [key, out] : counters) *out = r.integer<std::uint64_t>(key, 0, kMaxCounter).value_or(0);
  s.certificate_expires_at = text(r, "certificate_expires_at", lim::kShort);
  if (const json* p = r.get("probe")) {
    if (p->is_object()) {
      FieldReader pr(*p, r.rejections(), r.at("probe"));
      ProbeSample x;
      x.model = text(pr, "model", lim::kName);
      x.ok = pr.boolean("ok").value_or(false);
      // An hour is longer than any probe is waited for.
      x.ttft_ms = pr.number("ttft_ms", 0, 3.6e6);
      x.total_ms = pr.number("total_ms", 0, 3.6e6);
      x.at = text(pr, "at", lim::kShort);
      x.error = text(pr, "error", lim::kText);
      s.probe = std::move(x);
    } else if (!p->is_null()) {
      r.reject("probe", RejectReason::wrong_type);
    }
  }
  return s;
}

}  // namespace

namespace health_formats {

namespace {
bool lower_or_digit(char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}
bool alnum(char c) {
  return lower_or_digit(c) || (c >= 'A' && c <= 'Z');
}
template <class Allowed>
bool all_of(std::string_view s, Allowed ok) {
  for (char c : s)
    if (!ok(c)) return false;
  return true;
}
}  // namespace

bool diagnosis_code(std::string_view s) {
  return !s.empty() && s.size() <= 64 && s[0] >= 'a' && s[0] <= 'z' &&
         all_of(s, [](char c) { return lower_or_digit(c) || c == '_'; });
}

bool pstate(std::string_view s) {
  if (s.size() == 2) return s[0] == 'P' && s[1] >= '0' && s[1] <= '9';
  return s.size() == 3 && s[0] == 'P' && s[1] == '1' && s[2] >= '0' && s[2] <= '5';
}

bool mig_uuid(std::string_view s) {
  return s.size() > 4 && s.size() <= 64 && s.substr(0, 4) == "MIG-" &&
         all_of(s.substr(4), [](char c) { return alnum(c) || c == '-'; });
}

bool k8s_resource(std::string_view s) {
  auto slash = s.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash + 1 == s.size()) return false;
  return all_of(s.substr(0, slash), [](char c) { return alnum(c) || c == '.' || c == '-'; }) &&
         all_of(s.substr(slash + 1),
                [](char c) { return alnum(c) || c == '_' || c == '.' || c == '-'; });
}

}  // namespace health_formats

Decoded<HealthSample> decode_health_sample(const json& body) {
  Decoded<HealthSample> out;
  if (!body.is_object()) {
    out.rejected.add("health", RejectReason::wrong_type);
    out.refusal = "a health sample is a JSON object";
    return out;
  }
  HealthSample h;
  FieldReader r(body, out.rejected);
  h.time = text(r, "time", lim::kShort);
  h.hostname = text(r, "hostname", lim::kName);
  h.plan_hash = text(r, "plan_hash", lim::kShort);
  // Each section is an object, read by its own reader under its own path.
  auto section = [&](const char* key) -> std::optional<FieldReader> {
    const json* v = r.get(key);
    if (!v) return std::nullopt;
    if (!v->is_object()) return r.reject(key, RejectReason::wrong_type), std::nullopt;
    return FieldReader(*v, out.rejected, r.at(key));
  };
  if (auto g = section("gpu")) h.gpu = read_gpu_section(*g);
  if (auto o = section("ollama")) h.ollama = read_ollama(*o);
  if (auto k = section("k8s")) h.k8s = read_k8s(*k);
  if (auto e = section("endpoint")) h.endpoint = read_endpoint(*e);
  out.value = std::move(h);
  return out;
}

}  // namespace factory::proto
