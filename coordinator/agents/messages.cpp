#include "coordinator/agents/messages.hpp"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <set>

#include "common/durations.hpp"
#include "contract/cluster_ranges.hpp"

namespace factory::coordinator {

using nlohmann::json;

const char* reason_name(RejectReason r) {
  switch (r) {
    case RejectReason::missing:
      return "missing";
    case RejectReason::wrong_type:
      return "wrong_type";
    case RejectReason::too_long:
      return "too_long";
    case RejectReason::too_many:
      return "too_many";
    case RejectReason::too_deep:
      return "too_deep";
    case RejectReason::out_of_range:
      return "out_of_range";
    case RejectReason::bad_format:
      return "bad_format";
    case RejectReason::unknown_value:
      return "unknown_value";
    case RejectReason::unknown_field:
      return "unknown_field";
  }
  return "unknown";
}

namespace {

// A hostile message may hold thousands of bad fields; the first ones say
// enough, and the rest are not worth the work of listing.
constexpr std::size_t kMaxRejectionsPerMessage = 64;

// Field names may be the agent's own (an unknown key): kept short, since
// they go to the log.
constexpr std::size_t kMaxFieldName = 80;

void add(std::vector<Rejection>& out, std::string field, RejectReason r) {
  if (out.size() >= kMaxRejectionsPerMessage) return;
  if (field.size() > kMaxFieldName) field = field.substr(0, kMaxFieldName - 3) + "...";
  out.push_back({std::move(field), r});
}

// Step ids, diagnosis codes, tiers, states: what the catalog allows for a
// step id (contract/catalog.cpp), the strictest grammar any of them has.
bool is_name(std::string_view s) {
  if (s.empty()) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == ':' || c == '-';
  });
}

// A version as build systems write them: 0.1.0, 1.2.3-rc1+g1234abc, 2:1.0~beta.
bool is_version(std::string_view s) {
  if (s.empty()) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == ':' || c == '-' || c == '+' || c == '~';
  });
}

// RFC 1123 host names (labels of letters, digits and hyphens), with the
// underscore some real machines have in theirs.
bool is_hostname(std::string_view s) {
  if (s.empty() || s.size() > limits::kHostname) return false;
  std::size_t label = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '.') {
      if (label == 0) return false;
      label = 0;
      continue;
    }
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_';
    if (!ok || ++label > 63) return false;
  }
  return true;
}

bool is_hex(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
  });
}

// Free-form JSON kept within limits::kDepth / kItems / kKey / kString:
// what does not fit is dropped and reported, the rest kept as it came.
json bounded(const json& v, const std::string& where, int depth, std::vector<Rejection>& out) {
  if (v.is_string()) {
    if (v.get_ref<const std::string&>().size() > limits::kString) {
      add(out, where, RejectReason::too_long);
      return json();
    }
    return v;
  }
  if (!v.is_object() && !v.is_array()) return v;  // numbers (always finite), booleans, null
  if (depth >= limits::kDepth) {
    add(out, where, RejectReason::too_deep);
    return json();
  }
  if (v.is_array()) {
    json a = json::array();
    std::size_t i = 0;
    for (const auto& item : v) {
      if (i == limits::kItems) {
        add(out, where, RejectReason::too_many);
        break;
      }
      json b = bounded(item, where + "[" + std::to_string(i) + "]", depth + 1, out);
      if (!b.is_null() || item.is_null()) a.push_back(std::move(b));
      ++i;
    }
    return a;
  }
  json o = json::object();
  std::size_t n = 0;
  for (const auto& [k, item] : v.items()) {
    if (n == limits::kItems) {
      add(out, where, RejectReason::too_many);
      break;
    }
    const std::string at = where.empty() ? k : where + "." + k;
    if (k.empty() || k.size() > limits::kKey || !is_name(k)) {
      add(out, where.empty() ? "(key)" : where + ".(key)", RejectReason::bad_format);
      continue;
    }
    json b = bounded(item, at, depth + 1, out);
    if (!b.is_null() || item.is_null()) o[k] = std::move(b);
    ++n;
  }
  return o;
}

// A JSON integer that is not negative. (Parsed text holds such numbers as
// unsigned, JSON built in C++ as signed: both are the same number.)
std::optional<std::uint64_t> whole_number(const json& v) {
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (v.is_number_integer() && v.get<std::int64_t>() >= 0)
    return static_cast<std::uint64_t>(v.get<std::int64_t>());
  return std::nullopt;
}

// Reads one JSON object field by field. Each accessor marks its key as
// known and returns the value only when it passes; finish() reports every
// key nobody asked for.
class Fields {
 public:
  Fields(const json& obj, std::vector<Rejection>& out, std::string prefix = "")
      : obj_(obj), out_(out), prefix_(std::move(prefix)) {}

  std::string at(const char* key) const { return prefix_.empty() ? key : prefix_ + "." + key; }
  void reject(const char* key, RejectReason r) { add(out_, at(key), r); }

  // The value, or nullptr when the key is absent or null (absent, as far as
  // an optional field is concerned).
  const json* get(const char* key) {
    known_.insert(key);
    if (!obj_.is_object()) return nullptr;
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  std::optional<std::string> string(const char* key, std::size_t max) {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) return reject(key, RejectReason::wrong_type), std::nullopt;
    const auto& s = v->get_ref<const std::string&>();
    if (s.size() > max) return reject(key, RejectReason::too_long), std::nullopt;
    return s;
  }
  // Free text: any valid UTF-8 (the JSON parser saw to that), within max.
  std::optional<std::string> text(const char* key, std::size_t max) { return string(key, max); }

  template <class Pred>
  std::optional<std::string> matching(const char* key, std::size_t max, Pred ok) {
    auto s = string(key, max);
    if (!s) return s;
    if (!ok(*s)) return reject(key, RejectReason::bad_format), std::nullopt;
    return s;
  }
  std::optional<std::string> name(const char* key, std::size_t max = limits::kName) {
    return matching(key, max, is_name);
  }
  std::optional<std::string> one_of(const char* key, std::initializer_list<std::string_view> vals) {
    auto s = string(key, limits::kName);
    if (!s) return s;
    if (std::find(vals.begin(), vals.end(), *s) == vals.end())
      return reject(key, RejectReason::unknown_value), std::nullopt;
    return s;
  }
  std::optional<std::string> time(const char* key) {
    return matching(key, limits::kTime, [](const std::string& s) { return parse_rfc3339(s).ok(); });
  }

  std::optional<std::uint64_t> count(const char* key, std::uint64_t max) {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number_integer()) return reject(key, RejectReason::wrong_type), std::nullopt;
    auto n = whole_number(*v);
    if (!n || *n > max) return reject(key, RejectReason::out_of_range), std::nullopt;
    return n;
  }
  std::optional<std::int64_t> integer(const char* key, std::int64_t lo, std::int64_t hi) {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number_integer()) return reject(key, RejectReason::wrong_type), std::nullopt;
    if (v->is_number_unsigned() && v->get<std::uint64_t>() > static_cast<std::uint64_t>(hi))
      return reject(key, RejectReason::out_of_range), std::nullopt;
    auto n = v->get<std::int64_t>();
    if (n < lo || n > hi) return reject(key, RejectReason::out_of_range), std::nullopt;
    return n;
  }
  std::optional<double> number(const char* key, double lo, double hi) {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) return reject(key, RejectReason::wrong_type), std::nullopt;
    double d = v->get<double>();
    if (!std::isfinite(d) || d < lo || d > hi)
      return reject(key, RejectReason::out_of_range), std::nullopt;
    return d;
  }
  std::optional<bool> boolean(const char* key) {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) return reject(key, RejectReason::wrong_type), std::nullopt;
    return v->get<bool>();
  }
  // Free-form JSON under key, bounded; an object unless any_type.
  std::optional<json> free_form(const char* key, bool any_type = false) {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!any_type && !v->is_object()) return reject(key, RejectReason::wrong_type), std::nullopt;
    return bounded(*v, at(key), 1, out_);
  }

  // Marks keys as known without reading them (read elsewhere, or ignored).
  void known(std::initializer_list<const char*> keys) {
    for (const char* k : keys) known_.insert(k);
  }
  void finish() {
    if (!obj_.is_object()) return;
    for (const auto& [k, v] : obj_.items())
      if (!known_.count(k))
        add(out_, prefix_.empty() ? k : prefix_ + "." + k, RejectReason::unknown_field);
  }

 private:
  const json& obj_;
  std::vector<Rejection>& out_;
  std::string prefix_;
  std::set<std::string, std::less<>> known_;
};

template <class T>
Decoded<T> refused(std::vector<Rejection> rejected, std::string why) {
  Decoded<T> d;
  d.rejected = std::move(rejected);
  d.refusal = std::move(why);
  return d;
}

// The diagnosis's fields out of d (a diagnosis object, or a diagnosis
// event whose header the caller read).
std::optional<AgentDiagnosis> read_diagnosis(Fields& d, const json& obj) {
  AgentDiagnosis diag;
  auto code = d.name("code");
  diag.summary = d.text("summary", limits::kMessage).value_or("");
  diag.fix = d.text("fix", limits::kMessage).value_or("");
  if (auto details = d.free_form("details")) diag.details = std::move(*details);
  d.finish();
  if (!code) {
    if (!obj.contains("code")) d.reject("code", RejectReason::missing);
    return std::nullopt;
  }
  diag.code = *code;
  return diag;
}

void put(json& j, const char* key, const std::optional<std::string>& v) {
  if (v) j[key] = *v;
}
template <class N>
void put(json& j, const char* key, const std::optional<N>& v) {
  if (v) j[key] = *v;
}

}  // namespace

json GuestRangesReport::to_json() const {
  json a = json::array();
  for (const auto& [range, source] : around) a.push_back({{"range", range}, {"source", source}});
  return {{"cluster-cidr", cluster_cidr},
          {"service-cidr", service_cidr},
          {"cluster-dns", cluster_dns},
          {"around", a}};
}

json AgentDiagnosis::to_json() const {
  json j = {{"code", code}, {"summary", summary}, {"fix", fix}};
  if (!details.empty()) j["details"] = details;
  return j;
}

Decoded<AgentHello> decode_hello(const json& body) {
  Decoded<AgentHello> out;
  std::vector<Rejection> rej;
  Fields f(body, rej);
  AgentHello h;
  h.agent_id = f.matching("agent_id", limits::kAgentId, is_hex).value_or("");
  h.agent_version = f.matching("agent_version", limits::kVersion, is_version).value_or("");
  h.hostname = f.matching("hostname", limits::kHostname, is_hostname).value_or("");
  // The claimed tenant is compared, not trusted: any string will do for
  // that, within a length (a tenant name is a DNS label).
  if (const json* t = f.get("tenant")) {
    if (!t->is_string())
      f.reject("tenant", RejectReason::wrong_type);
    else if (t->get_ref<const std::string&>().size() > limits::kName)
      f.reject("tenant", RejectReason::too_long);
    else
      h.tenant = t->get<std::string>();
  }
  f.finish();
  out.value = std::move(h);
  out.rejected = std::move(rej);
  return out;
}

Decoded<AgentHeartbeat> decode_heartbeat(const json& body) {
  Decoded<AgentHeartbeat> out;
  std::vector<Rejection> rej;
  Fields f(body, rej);
  AgentHeartbeat hb;
  hb.pending_events = f.count("pending_events", limits::kCount).value_or(0);
  hb.dropped_events = f.count("dropped_events", limits::kCount).value_or(0);
  hb.plan_hash = f.matching("plan_hash", limits::kPlanHash,
                            [](const std::string& s) { return s.empty() || is_hex(s); });
  hb.plan_state = f.name("plan_state");
  hb.steps_done = f.count("steps_done", limits::kSteps);
  hb.steps_total = f.count("steps_total", limits::kSteps);
  f.finish();
  out.value = std::move(hb);
  out.rejected = std::move(rej);
  return out;
}

Decoded<EnrollRequest> decode_enroll(const json& body) {
  std::vector<Rejection> rej;
  Fields f(body, rej);
  EnrollRequest r;
  auto token = f.string("token", limits::kToken);
  auto csr = f.string("csr", limits::kCsr);
  r.agent_version = f.matching("agent_version", limits::kVersion, is_version).value_or("");
  r.hostname = f.matching("hostname", limits::kHostname, is_hostname).value_or("");
  f.finish();
  if (!token || !csr) {
    if (!body.contains("token")) f.reject("token", RejectReason::missing);
    if (!body.contains("csr")) f.reject("csr", RejectReason::missing);
    return refused<EnrollRequest>(std::move(rej), "enroll needs 'token' (at most " +
                                                      std::to_string(limits::kToken) +
                                                      " bytes) and 'csr' (a PEM CSR)");
  }
  r.token = std::move(*token);
  r.csr = std::move(*csr);
  Decoded<EnrollRequest> out;
  out.value = std::move(r);
  out.rejected = std::move(rej);
  return out;
}

Decoded<RenewRequest> decode_renew(const json& body) {
  std::vector<Rejection> rej;
  Fields f(body, rej);
  auto csr = f.string("csr", limits::kCsr);
  f.finish();
  if (!csr) {
    if (!body.contains("csr")) f.reject("csr", RejectReason::missing);
    return refused<RenewRequest>(std::move(rej), "renew needs 'csr' (a PEM CSR)");
  }
  Decoded<RenewRequest> out;
  out.value = RenewRequest{std::move(*csr)};
  out.rejected = std::move(rej);
  return out;
}

namespace {

// Every range must read as one (an agent's garbage is not shown as a range).
bool is_range(const std::string& s) {
  return ranges::IpPrefix::parse(s).ok();
}

std::optional<GuestRangesReport> read_ranges(const json& r, std::vector<Rejection>& rej) {
  Fields f(r, rej, "ranges");
  GuestRangesReport g;
  auto pods = f.matching("cluster-cidr", 64, is_range);
  auto svcs = f.matching("service-cidr", 64, is_range);
  auto dns = f.matching("cluster-dns", 64, is_range);
  if (const json* a = f.get("around")) {
    if (!a->is_array()) {
      f.reject("around", RejectReason::wrong_type);
    } else if (a->size() > limits::kRangesAround) {
      f.reject("around", RejectReason::too_long);
    } else {
      for (const auto& e : *a) {
        Fields ef(e, rej, "ranges.around");
        auto range = ef.matching("range", 64, is_range);
        auto source = ef.text("source", limits::kName * 4);
        ef.finish();
        if (range && source) g.around.emplace_back(*range, *source);
      }
    }
  }
  f.finish();
  for (const char* key : {"cluster-cidr", "service-cidr", "cluster-dns"})
    if (!r.contains(key)) f.reject(key, RejectReason::missing);
  if (!pods || !svcs || !dns) return std::nullopt;
  g.cluster_cidr = *pods;
  g.service_cidr = *svcs;
  g.cluster_dns = *dns;
  return g;
}

ProgressEvent read_progress(Fields& f, std::vector<Rejection>& rej) {
  ProgressEvent p;
  p.plan_hash = f.matching("plan_hash", limits::kPlanHash, is_hex);
  p.state = f.one_of("state",
                     {"started", "progress", "skipped", "succeeded", "failed", "reboot_requested"});
  p.attempt = f.integer("attempt", 0, static_cast<std::int64_t>(limits::kAttempts));
  p.message = f.text("message", limits::kMessage);
  p.output_tail = f.text("output_tail", limits::kOutputTail);
  if (const json* d = f.get("diagnosis")) {
    if (!d->is_object()) {
      f.reject("diagnosis", RejectReason::wrong_type);
    } else {
      Fields df(*d, rej, "diagnosis");
      p.diagnosis = read_diagnosis(df, *d);
    }
  }
  p.percent = f.number("percent", 0, 100);
  p.completed = f.count("completed", limits::kCount);
  p.total = f.count("total", limits::kCount);
  p.allocatable = f.count("allocatable", limits::kCount);
  p.expected = f.count("expected", limits::kCount);
  if (const json* r = f.get("ranges")) {
    if (!r->is_object())
      f.reject("ranges", RejectReason::wrong_type);
    else
      p.ranges = read_ranges(*r, rej);
  }
  return p;
}

PlanEvent read_plan(Fields& f) {
  PlanEvent p;
  p.plan_hash = f.matching("plan_hash", limits::kPlanHash, is_hex);
  p.tier = f.name("tier");
  p.state = f.one_of("state", {"running", "succeeded", "failed"});
  p.steps_total = f.count("steps_total", limits::kSteps);
  p.steps_done = f.count("steps_done", limits::kSteps);
  p.message = f.text("message", limits::kMessage);
  p.failed_step = f.name("failed_step");
  return p;
}

}  // namespace

Decoded<AgentEvent> decode_event(const json& body) {
  std::vector<Rejection> rej;
  Fields f(body, rej);
  AgentEvent e;
  const json* id = f.get("id");
  const json* kind = f.get("kind");
  const auto id_value = id ? whole_number(*id) : std::nullopt;
  if (!id_value || *id_value == 0) {
    f.reject("id", !id ? RejectReason::missing
                       : (id->is_number() ? RejectReason::out_of_range : RejectReason::wrong_type));
    return refused<AgentEvent>(std::move(rej),
                               "an event needs a positive integer 'id' and a string 'kind'");
  }
  if (!kind || !kind->is_string() || kind->get_ref<const std::string&>().size() > limits::kName ||
      !is_name(kind->get_ref<const std::string&>())) {
    f.reject("kind",
             !kind ? RejectReason::missing
                   : (!kind->is_string() ? RejectReason::wrong_type : RejectReason::bad_format));
    return refused<AgentEvent>(std::move(rej),
                               "an event needs a positive integer 'id' and a string 'kind' (1-" +
                                   std::to_string(limits::kName) + " letters, digits or . _ : -)");
  }
  e.id = *id_value;
  e.kind = kind->get<std::string>();
  e.time = f.time("time");
  e.truncated = f.boolean("truncated").value_or(false);

  if (e.kind == "progress") {
    auto step = f.name("step");
    ProgressEvent p = read_progress(f, rej);
    if (step) {
      p.step = *step;
      e.body = std::move(p);
    } else if (!body.contains("step") && !e.truncated) {
      f.reject("step", RejectReason::missing);
    }
  } else if (e.kind == "plan") {
    e.body = read_plan(f);
  } else if (e.kind == "journal_reset") {
    JournalResetEvent j;
    j.plan_hash = f.matching("plan_hash", limits::kPlanHash, is_hex);
    j.reason = f.text("reason", limits::kMessage);
    j.message = f.text("message", limits::kMessage);
    e.body = std::move(j);
  } else if (e.kind == "log") {
    LogEvent l;
    l.level = f.one_of("level", {"trace", "debug", "info", "warning", "warn", "error", "critical"});
    l.message = f.text("message", limits::kMessage);
    e.body = std::move(l);
  } else if (e.kind == "diagnosis") {
    // read_diagnosis finishes f: every other key is an unknown field.
    if (auto diag = read_diagnosis(f, body)) e.body = DiagnosisEvent{std::move(*diag)};
    return Decoded<AgentEvent>{std::move(e), std::move(rej), ""};
  } else {
    // Health while it still travels as an event, and kinds a newer agent
    // sends: kept as they came, within the free-form bounds.
    json rest = json::object();
    for (const auto& [k, v] : body.items()) {
      if (k == "id" || k == "kind" || k == "time" || k == "truncated") continue;
      if (rest.size() == limits::kItems) {
        add(rej, k, RejectReason::too_many);
        break;
      }
      if (k.size() > limits::kKey || !is_name(k)) {
        add(rej, "(key)", RejectReason::bad_format);
        continue;
      }
      json b = bounded(v, k, 1, rej);
      if (!b.is_null() || v.is_null()) rest[k] = std::move(b);
    }
    if (e.kind == "health")
      e.body = HealthEvent{std::move(rest)};
    else
      e.body = OtherEvent{std::move(rest)};
    return Decoded<AgentEvent>{std::move(e), std::move(rej), ""};
  }
  f.finish();
  return Decoded<AgentEvent>{std::move(e), std::move(rej), ""};
}

json AgentEvent::to_json() const {
  json j = {{"id", id}, {"kind", kind}};
  if (time) j["time"] = *time;
  if (truncated) j["truncated"] = true;
  std::visit(
      [&](const auto& b) {
        using T = std::decay_t<decltype(b)>;
        if constexpr (std::is_same_v<T, ProgressEvent>) {
          j["step"] = b.step;
          put(j, "plan_hash", b.plan_hash);
          put(j, "state", b.state);
          put(j, "attempt", b.attempt);
          put(j, "message", b.message);
          put(j, "output_tail", b.output_tail);
          if (b.diagnosis) j["diagnosis"] = b.diagnosis->to_json();
          put(j, "percent", b.percent);
          put(j, "completed", b.completed);
          put(j, "total", b.total);
          put(j, "allocatable", b.allocatable);
          put(j, "expected", b.expected);
          if (b.ranges) j["ranges"] = b.ranges->to_json();
        } else if constexpr (std::is_same_v<T, PlanEvent>) {
          put(j, "plan_hash", b.plan_hash);
          put(j, "tier", b.tier);
          put(j, "state", b.state);
          put(j, "steps_total", b.steps_total);
          put(j, "steps_done", b.steps_done);
          put(j, "message", b.message);
          put(j, "failed_step", b.failed_step);
        } else if constexpr (std::is_same_v<T, JournalResetEvent>) {
          put(j, "plan_hash", b.plan_hash);
          put(j, "reason", b.reason);
          put(j, "message", b.message);
        } else if constexpr (std::is_same_v<T, LogEvent>) {
          put(j, "level", b.level);
          put(j, "message", b.message);
        } else if constexpr (std::is_same_v<T, DiagnosisEvent>) {
          // Named, not iterated as a temporary: items() only refers to it.
          const json d = b.diagnosis.to_json();
          for (auto& [k, v] : d.items()) j[k] = v;
        } else if constexpr (std::is_same_v<T, HealthEvent>) {
          for (auto& [k, v] : b.report.items()) j[k] = v;
        } else if constexpr (std::is_same_v<T, OtherEvent>) {
          for (auto& [k, v] : b.fields.items()) j[k] = v;
        }
      },
      body);
  return j;
}

}  // namespace factory::coordinator
