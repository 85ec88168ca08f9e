#include "contract/health_sample.hpp"

#include <cmath>
#include <limits>
#include <regex>

#include "common/durations.hpp"
#include "contract/mig_cards.hpp"

namespace factory::proto {

using nlohmann::json;
namespace lim = health_limits;

namespace {

template <class T>
json opt(const std::optional<T>& v) {
  if (v) return *v;
  return nullptr;
}

json text_or_null(const std::string& s) {
  return s.empty() ? json(nullptr) : json(s);
}

json diagnoses_json(const std::vector<DiagnosisSample>& ds) {
  json out = json::array();
  for (const auto& d : ds) out.push_back(d.to_json());
  return out;
}

// Optional keys: present only when they say something.
void put_error_and_diagnoses(json& j, const std::string& error,
                             const std::vector<DiagnosisSample>& ds) {
  if (!error.empty()) j["error"] = error;
  if (!ds.empty()) j["diagnoses"] = diagnoses_json(ds);
}

}  // namespace

bool is_clean_text(const std::string& s, std::size_t max) {
  if (s.size() > max) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) return false;
    // C1 controls (U+0080..U+009F) are 0xC2 0x80..0x9F in UTF-8: some
    // terminals act on them as on ESC sequences.
    if (c == 0xc2 && i + 1 < s.size()) {
      auto n = static_cast<unsigned char>(s[i + 1]);
      if (n >= 0x80 && n <= 0x9f) return false;
    }
  }
  return true;
}

json DiagnosisSample::to_json() const {
  return {{"code", code}, {"summary", summary}, {"fix", fix}, {"details", details}};
}

json GpuProcessSample::to_json() const {
  return {{"pid", pid}, {"name", name}, {"used_memory_mib", opt(used_memory_mib)}};
}

json MigInstanceSample::to_json() const {
  return {{"profile", profile}, {"memory_gib", opt(memory_gib)}, {"uuid", uuid}};
}

json XidSample::to_json() const {
  return {{"xid", xid},
          {"count", count},
          {"first_at", text_or_null(first_at)},
          {"last_at", text_or_null(last_at)}};
}

json NvlinkSample::to_json() const {
  return {{"links", opt(links)},
          {"crc_flit_errors", opt(crc_flit_errors)},
          {"crc_data_errors", opt(crc_data_errors)},
          {"replay_errors", opt(replay_errors)},
          {"recovery_errors", opt(recovery_errors)}};
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
  json procs = json::array();
  for (const auto& p : processes) procs.push_back(p.to_json());
  json xs = json::array();
  for (const auto& x : xids) xs.push_back(x.to_json());
  json j = {{"index", index},
            {"name", name},
            {"uuid", text_or_null(uuid)},
            {"pci_bus_id", pci_bus_id},
            {"minor_number", opt(minor_number)},
            {"memory_total_mib", opt(memory_total_mib)},
            {"memory_used_mib", opt(memory_used_mib)},
            {"memory_free_mib", opt(memory_free_mib)},
            {"memory_reserved_mib", opt(memory_reserved_mib)},
            {"utilization_percent", opt(utilization_percent)},
            {"memory_utilization_percent", opt(memory_utilization_percent)},
            {"temperature_c", opt(temperature_c)},
            {"memory_temperature_c", opt(memory_temperature_c)},
            {"power_draw_w", opt(power_draw_w)},
            {"power_limit_w", opt(power_limit_w)},
            {"sm_clock_mhz", opt(sm_clock_mhz)},
            {"memory_clock_mhz", opt(memory_clock_mhz)},
            {"pstate", text_or_null(pstate)},
            {"ecc_errors_uncorrected_volatile", opt(ecc_errors_uncorrected_volatile)},
            {"mig_mode", text_or_null(mig_mode)},
            {"processes", std::move(procs)},
            {"serial", text_or_null(serial)},
            {"lost", lost},
            {"ecc_errors_corrected_volatile", opt(ecc_errors_corrected_volatile)},
            {"ecc_errors_corrected_aggregate", opt(ecc_errors_corrected_aggregate)},
            {"ecc_errors_uncorrected_aggregate", opt(ecc_errors_uncorrected_aggregate)},
            {"remapped_rows_correctable", opt(remapped_rows_correctable)},
            {"remapped_rows_uncorrectable", opt(remapped_rows_uncorrectable)},
            {"remapped_rows_pending", opt(remapped_rows_pending)},
            {"remapped_rows_failure", opt(remapped_rows_failure)},
            {"retired_pages_sbe", opt(retired_pages_sbe)},
            {"retired_pages_dbe", opt(retired_pages_dbe)},
            {"retired_pages_pending", opt(retired_pages_pending)},
            {"pcie_replay_count", opt(pcie_replay_count)},
            {"clocks_event_reasons", opt(clocks_event_reasons)},
            {"energy_mj", opt(energy_mj)},
            {"xids", std::move(xs)}};
  if (nvlink) j["nvlink"] = nvlink->to_json();
  if (!mig_instances.empty()) {
    json mig = json::array();
    for (const auto& m : mig_instances) mig.push_back(m.to_json());
    j["mig_instances"] = std::move(mig);
  }
  return j;
}

json GpuSection::to_json() const {
  json g = json::array();
  for (const auto& r : gpus) g.push_back(r.to_json());
  json j = {{"source", source},
            {"driver_version", text_or_null(driver_version)},
            {"cuda_driver_version", text_or_null(cuda_driver_version)},
            {"gpus", std::move(g)}};
  if (!via.empty()) j["via"] = via;
  put_error_and_diagnoses(j, error, diagnoses);
  return j;
}

json OllamaModelSample::to_json() const {
  return {{"name", name},
          {"size", size},
          {"size_vram", size_vram},
          {"gpu_percent", gpu_percent},
          {"context_length", opt(context_length)},
          {"expires_at", text_or_null(expires_at)}};
}

json OllamaSection::to_json() const {
  json m = json::array();
  for (const auto& x : models) m.push_back(x.to_json());
  json j = {{"version", text_or_null(version)}, {"models", std::move(m)}};
  put_error_and_diagnoses(j, error, diagnoses);
  return j;
}

json K8sNodeSample::to_json() const {
  return {{"name", name},
          {"ready", ready},
          {"allocatable", opt(allocatable)},
          {"capacity", opt(capacity)},
          {"gpu_label", text_or_null(gpu_label)}};
}

json K8sPodSample::to_json() const {
  return {{"namespace", ns},
          {"name", name},
          {"phase", phase},
          {"status", status},
          {"node", node},
          {"gpus", opt(gpus)},
          {"gpumem_mib", opt(gpumem_mib)},
          {"gpumem_percentage", opt(gpumem_percentage)}};
}

json K8sSection::to_json() const {
  json n = json::array(), p = json::array();
  for (const auto& x : nodes) n.push_back(x.to_json());
  for (const auto& x : pods) p.push_back(x.to_json());
  json j = {{"resource", resource},
            {"allocatable", opt(allocatable)},
            {"capacity", opt(capacity)},
            {"nodes", std::move(n)},
            {"pods", std::move(p)}};
  put_error_and_diagnoses(j, error, diagnoses);
  return j;
}

json ProbeSample::to_json() const {
  json j = {{"model", model},
            {"ok", ok},
            {"ttft_ms", opt(ttft_ms)},
            {"total_ms", opt(total_ms)},
            {"at", text_or_null(at)}};
  if (!error.empty()) j["error"] = error;
  return j;
}

json EndpointSection::to_json() const {
  return {{"serving", serving},
          {"requests", requests},
          {"served", served},
          {"unauthorized", unauthorized},
          {"refused_paths", refused_paths},
          {"busy", busy},
          {"upstream_errors", upstream_errors},
          {"in_flight", in_flight},
          {"certificate_expires_at", text_or_null(certificate_expires_at)},
          {"probe", probe ? probe->to_json() : json(nullptr)}};
}

json HealthSample::to_json() const {
  json j = {{"time", time}, {"hostname", hostname}, {"gpu", gpu.to_json()}};
  if (!plan_hash.empty()) j["plan_hash"] = plan_hash;
  if (ollama) j["ollama"] = ollama->to_json();
  if (k8s) j["k8s"] = k8s->to_json();
  if (endpoint) j["endpoint"] = endpoint->to_json();
  return j;
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

void HealthRejects::add(const std::string& reason, const std::string& field) {
  ++by_reason[reason];
  if (fields.size() < 8) fields.push_back(field + " (" + reason + ")");
}

// ---------------------------------------------------------------------------
// Reading a stranger's sample.

namespace {

// One object of the sample, read field by field; what breaks a rule is
// dropped and counted with its path.
class Reader {
 public:
  Reader(const json& obj, std::string where, HealthRejects& rejects)
      : obj_(obj), where_(std::move(where)), rejects_(rejects) {}

  const json* get(const char* key) const {
    if (!obj_.is_object()) return nullptr;
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  std::string path(const char* key) const { return where_ + "." + key; }
  void reject(const char* reason, const char* key) const { rejects_.add(reason, path(key)); }

  std::string text(const char* key, std::size_t max) const {
    const json* v = get(key);
    if (!v) return "";
    if (!v->is_string()) return reject("bad_type", key), "";
    const auto& s = v->get_ref<const std::string&>();
    if (s.size() > max) return reject("too_long", key), "";
    if (!is_clean_text(s, max)) return reject("bad_text", key), "";
    return s;
  }

  template <class T>
  std::optional<T> integer(const char* key, long double lo, long double hi) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number_integer()) return reject("bad_type", key), std::nullopt;
    long double x = v->is_number_unsigned() ? static_cast<long double>(v->get<std::uint64_t>())
                                            : static_cast<long double>(v->get<std::int64_t>());
    if (x < lo || x > hi) return reject("out_of_range", key), std::nullopt;
    return static_cast<T>(x);
  }

  std::optional<double> real(const char* key, double lo, double hi) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) return reject("bad_type", key), std::nullopt;
    double x = v->get<double>();
    if (!std::isfinite(x) || x < lo || x > hi) return reject("out_of_range", key), std::nullopt;
    return x;
  }

  std::optional<bool> opt_boolean(const char* key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) return reject("bad_type", key), std::nullopt;
    return v->get<bool>();
  }

  bool boolean(const char* key) const {
    const json* v = get(key);
    if (!v) return false;
    if (!v->is_boolean()) return reject("bad_type", key), false;
    return v->get<bool>();
  }

  // The elements of a list field, at most max (the rest counted once).
  std::vector<const json*> list(const char* key, std::size_t max) const {
    std::vector<const json*> out;
    const json* v = get(key);
    if (!v) return out;
    if (!v->is_array()) return reject("bad_type", key), out;
    for (const auto& e : *v) {
      if (out.size() == max) {
        reject("too_many", key);
        break;
      }
      if (!e.is_object()) {
        reject("bad_type", key);
        continue;
      }
      out.push_back(&e);
    }
    return out;
  }

  const std::string& where() const { return where_; }
  HealthRejects& rejects() const { return rejects_; }

 private:
  const json& obj_;
  std::string where_;
  HealthRejects& rejects_;
};

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

std::vector<DiagnosisSample> read_diagnoses(const Reader& r) {
  static const std::regex code_re("^[a-z][a-z0-9_]{0,63}$");
  std::vector<DiagnosisSample> out;
  int i = 0;
  for (const json* e : r.list("diagnoses", lim::kDiagnoses)) {
    Reader d(*e, r.where() + ".diagnoses[" + std::to_string(i++) + "]", r.rejects());
    DiagnosisSample s;
    s.code = d.text("code", lim::kShort);
    if (!std::regex_match(s.code, code_re)) {
      // A diagnosis is its code: without one it is nothing to show.
      d.reject("bad_text", "code");
      continue;
    }
    s.summary = d.text("summary", lim::kText);
    s.fix = d.text("fix", lim::kText);
    if (const json* det = d.get("details")) {
      if (!det->is_object())
        d.reject("bad_type", "details");
      else if (det->dump().size() > lim::kDetails)
        d.reject("too_long", "details");
      else if (!clean_json(*det))
        d.reject("bad_text", "details");
      else
        s.details = *det;
    }
    out.push_back(std::move(s));
  }
  return out;
}

// An RFC 3339 time the agent wrote, or "" (counted) when it is not one.
std::string timestamp(const Reader& r, const char* key) {
  std::string s = r.text(key, lim::kShort);
  if (!s.empty() && !parse_rfc3339(s)) {
    r.reject("bad_text", key);
    return "";
  }
  return s;
}

void read_faults(const Reader& r, GpuSample& g) {
  g.serial = r.text("serial", lim::kShort);
  g.lost = r.boolean("lost");
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
  g.remapped_rows_pending = r.opt_boolean("remapped_rows_pending");
  g.remapped_rows_failure = r.opt_boolean("remapped_rows_failure");
  g.retired_pages_sbe = r.integer<std::uint64_t>("retired_pages_sbe", 0, kMaxCount);
  g.retired_pages_dbe = r.integer<std::uint64_t>("retired_pages_dbe", 0, kMaxCount);
  g.retired_pages_pending = r.opt_boolean("retired_pages_pending");
  // NVML's counter is an unsigned int.
  g.pcie_replay_count = r.integer<std::uint64_t>("pcie_replay_count", 0, 4294967295.0L);
  // A 64-bit mask of which NVML defines nine bits; a newer driver's bits
  // are kept, anything past 32 bits is not a reading.
  g.clocks_event_reasons = r.integer<std::uint64_t>("clocks_event_reasons", 0, 4294967295.0L);
  // 2^53 mJ is 285 years at 1 kW.
  g.energy_mj = r.integer<std::uint64_t>("energy_mj", 0, 9007199254740992.0L);
  if (const json* n = r.get("nvlink")) {
    if (n->is_object()) {
      Reader nr(*n, r.where() + ".nvlink", r.rejects());
      NvlinkSample s;
      s.links = nr.integer<std::uint64_t>("links", 0, 64);
      s.crc_flit_errors = nr.integer<std::uint64_t>("crc_flit_errors", 0, kMaxErrors);
      s.crc_data_errors = nr.integer<std::uint64_t>("crc_data_errors", 0, kMaxErrors);
      s.replay_errors = nr.integer<std::uint64_t>("replay_errors", 0, kMaxErrors);
      s.recovery_errors = nr.integer<std::uint64_t>("recovery_errors", 0, kMaxErrors);
      g.nvlink = s;
    } else {
      r.reject("bad_type", "nvlink");
    }
  }
  int i = 0;
  for (const json* e : r.list("xids", lim::kXids)) {
    Reader x(*e, r.where() + ".xids[" + std::to_string(i++) + "]", r.rejects());
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

GpuSample read_gpu(const Reader& r, int position) {
  GpuSample g;
  g.index = r.integer<int>("index", 0, 63).value_or(position);
  g.name = r.text("name", lim::kName);
  g.uuid = r.text("uuid", lim::kShort);
  g.pci_bus_id = r.text("pci_bus_id", lim::kShort);
  g.minor_number = r.integer<int>("minor_number", 0, 255);
  g.memory_total_mib = r.integer<std::uint64_t>("memory_total_mib", 0, kMaxMib);
  g.memory_used_mib = r.integer<std::uint64_t>("memory_used_mib", 0, kMaxMib);
  g.memory_free_mib = r.integer<std::uint64_t>("memory_free_mib", 0, kMaxMib);
  g.memory_reserved_mib = r.integer<std::uint64_t>("memory_reserved_mib", 0, kMaxMib);
  g.utilization_percent = r.integer<int>("utilization_percent", 0, 100);
  g.memory_utilization_percent = r.integer<int>("memory_utilization_percent", 0, 100);
  g.temperature_c = r.integer<int>("temperature_c", -60, 200);
  g.memory_temperature_c = r.integer<int>("memory_temperature_c", -60, 200);
  g.power_draw_w = r.real("power_draw_w", 0, 10000);
  g.power_limit_w = r.real("power_limit_w", 0, 10000);
  g.sm_clock_mhz = r.integer<int>("sm_clock_mhz", 0, 100000);
  g.memory_clock_mhz = r.integer<int>("memory_clock_mhz", 0, 100000);
  g.pstate = r.text("pstate", 4);
  static const std::regex pstate_re("^P([0-9]|1[0-5])$");
  if (!g.pstate.empty() && !std::regex_match(g.pstate, pstate_re)) {
    r.reject("out_of_range", "pstate");
    g.pstate.clear();
  }
  g.ecc_errors_uncorrected_volatile =
      r.integer<std::uint64_t>("ecc_errors_uncorrected_volatile", 0, 1e15L);
  g.mig_mode = r.text("mig_mode", 16);
  if (!g.mig_mode.empty() && g.mig_mode != "Enabled" && g.mig_mode != "Disabled") {
    r.reject("out_of_range", "mig_mode");
    g.mig_mode.clear();
  }
  int i = 0;
  for (const json* e : r.list("processes", lim::kProcesses)) {
    Reader p(*e, r.where() + ".processes[" + std::to_string(i++) + "]", r.rejects());
    GpuProcessSample s;
    auto pid = p.integer<std::uint32_t>("pid", 1, std::numeric_limits<std::int32_t>::max());
    if (!pid) continue;  // a process is its pid
    s.pid = *pid;
    s.name = p.text("name", lim::kName);
    s.used_memory_mib = p.integer<std::uint64_t>("used_memory_mib", 0, kMaxMib);
    g.processes.push_back(std::move(s));
  }
  i = 0;
  static const std::regex mig_uuid("^MIG-[0-9A-Za-z-]{1,60}$");
  for (const json* e : r.list("mig_instances", lim::kMigInstances)) {
    Reader m(*e, r.where() + ".mig_instances[" + std::to_string(i++) + "]", r.rejects());
    MigInstanceSample s;
    s.profile = m.text("profile", 24);
    if (!valid_mig_profile_name(s.profile)) {
      m.reject("out_of_range", "profile");
      continue;  // a slice is its profile
    }
    s.memory_gib = m.real("memory_gib", 0, 4096);
    s.uuid = m.text("uuid", lim::kShort);
    if (!s.uuid.empty() && !std::regex_match(s.uuid, mig_uuid)) {
      m.reject("out_of_range", "uuid");
      s.uuid.clear();
    }
    g.mig_instances.push_back(std::move(s));
  }
  read_faults(r, g);
  return g;
}

GpuSection read_gpu_section(const Reader& r) {
  GpuSection s;
  s.source = r.text("source", 16);
  if (s.source != "nvml" && s.source != "nvidia-smi" && s.source != "none") {
    if (!s.source.empty()) r.reject("out_of_range", "source");
    s.source = "none";
  }
  s.driver_version = r.text("driver_version", lim::kShort);
  s.cuda_driver_version = r.text("cuda_driver_version", lim::kShort);
  s.via = r.text("via", lim::kText);
  int i = 0;
  for (const json* e : r.list("gpus", lim::kGpus)) {
    Reader g(*e, r.where() + ".gpus[" + std::to_string(i) + "]", r.rejects());
    s.gpus.push_back(read_gpu(g, i++));
  }
  s.error = r.text("error", lim::kText);
  s.diagnoses = read_diagnoses(r);
  return s;
}

OllamaSection read_ollama(const Reader& r) {
  OllamaSection s;
  s.version = r.text("version", lim::kShort);
  int i = 0;
  for (const json* e : r.list("models", lim::kModels)) {
    Reader m(*e, r.where() + ".models[" + std::to_string(i++) + "]", r.rejects());
    OllamaModelSample x;
    x.name = m.text("name", lim::kName);
    if (x.name.empty()) continue;  // a model is its name
    x.size = m.integer<std::uint64_t>("size", 0, kMaxBytes).value_or(0);
    x.size_vram = m.integer<std::uint64_t>("size_vram", 0, kMaxBytes).value_or(0);
    if (x.size_vram > x.size) {
      m.reject("out_of_range", "size_vram");
      x.size_vram = x.size;
    }
    x.gpu_percent = m.integer<int>("gpu_percent", 0, 100).value_or(0);
    x.context_length = m.integer<std::int64_t>("context_length", 0, 1LL << 31);
    x.expires_at = m.text("expires_at", lim::kShort);
    s.models.push_back(std::move(x));
  }
  s.error = r.text("error", lim::kText);
  s.diagnoses = read_diagnoses(r);
  return s;
}

K8sSection read_k8s(const Reader& r) {
  static const std::regex resource_re("^[A-Za-z0-9.-]+/[A-Za-z0-9_.-]+$");
  K8sSection s;
  s.resource = r.text("resource", lim::kName);
  if (!std::regex_match(s.resource, resource_re)) {
    if (!s.resource.empty()) r.reject("out_of_range", "resource");
    s.resource = "nvidia.com/gpu";
  }
  s.allocatable = r.integer<std::int64_t>("allocatable", 0, kMaxCount);
  s.capacity = r.integer<std::int64_t>("capacity", 0, kMaxCount);
  int i = 0;
  for (const json* e : r.list("nodes", lim::kNodes)) {
    Reader n(*e, r.where() + ".nodes[" + std::to_string(i++) + "]", r.rejects());
    K8sNodeSample x;
    x.name = n.text("name", lim::kName);
    x.ready = n.boolean("ready");
    x.allocatable = n.integer<std::int64_t>("allocatable", 0, kMaxCount);
    x.capacity = n.integer<std::int64_t>("capacity", 0, kMaxCount);
    x.gpu_label = n.text("gpu_label", lim::kShort);
    s.nodes.push_back(std::move(x));
  }
  i = 0;
  for (const json* e : r.list("pods", lim::kPods)) {
    Reader p(*e, r.where() + ".pods[" + std::to_string(i++) + "]", r.rejects());
    K8sPodSample x;
    x.ns = p.text("namespace", lim::kShort);
    x.name = p.text("name", lim::kName);
    x.phase = p.text("phase", lim::kShort);
    x.status = p.text("status", lim::kShort);
    x.node = p.text("node", lim::kName);
    x.gpus = p.integer<std::int64_t>("gpus", 0, kMaxCount);
    x.gpumem_mib = p.integer<std::int64_t>("gpumem_mib", 0, kMaxMib);
    x.gpumem_percentage = p.integer<std::int64_t>("gpumem_percentage", 0, 100);
    s.pods.push_back(std::move(x));
  }
  s.error = r.text("error", lim::kText);
  s.diagnoses = read_diagnoses(r);
  return s;
}

EndpointSection read_endpoint(const Reader& r) {
  EndpointSection s;
  s.serving = r.boolean("serving");
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
  s.certificate_expires_at = r.text("certificate_expires_at", lim::kShort);
  if (const json* p = r.get("probe")) {
    if (p->is_object()) {
      Reader pr(*p, r.where() + ".probe", r.rejects());
      ProbeSample x;
      x.model = pr.text("model", lim::kName);
      x.ok = pr.boolean("ok");
      // An hour is longer than any probe is waited for.
      x.ttft_ms = pr.real("ttft_ms", 0, 3.6e6);
      x.total_ms = pr.real("total_ms", 0, 3.6e6);
      x.at = pr.text("at", lim::kShort);
      x.error = pr.text("error", lim::kText);
      s.probe = std::move(x);
    } else if (!p->is_null()) {
      r.reject("bad_type", "probe");
    }
  }
  return s;
}

}  // namespace

HealthSample parse_health_sample(const json& body, HealthRejects& rejects) {
  HealthSample h;
  if (!body.is_object()) {
    rejects.add("bad_message", "health");
    return h;
  }
  Reader r(body, "health", rejects);
  h.time = r.text("time", lim::kShort);
  h.hostname = r.text("hostname", lim::kName);
  h.plan_hash = r.text("plan_hash", lim::kShort);
  if (const json* g = r.get("gpu")) {
    if (g->is_object())
      h.gpu = read_gpu_section(Reader(*g, "health.gpu", rejects));
    else
      r.reject("bad_type", "gpu");
  }
  if (const json* o = r.get("ollama")) {
    if (o->is_object())
      h.ollama = read_ollama(Reader(*o, "health.ollama", rejects));
    else
      r.reject("bad_type", "ollama");
  }
  if (const json* k = r.get("k8s")) {
    if (k->is_object())
      h.k8s = read_k8s(Reader(*k, "health.k8s", rejects));
    else
      r.reject("bad_type", "k8s");
  }
  if (const json* e = r.get("endpoint")) {
    if (e->is_object())
      h.endpoint = read_endpoint(Reader(*e, "health.endpoint", rejects));
    else
      r.reject("bad_type", "endpoint");
  }
  return h;
}

}  // namespace factory::proto
