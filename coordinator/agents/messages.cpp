#include "coordinator/agents/messages.hpp"

#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "common/durations.hpp"
#include "contract/cluster_ranges.hpp"
#include "contract/tier_upgrade.hpp"

namespace factory::coordinator {

using nlohmann::json;
using proto::FieldReader;
using proto::is_hex;
using proto::is_hostname;
using proto::is_name;
using proto::is_version;

namespace {

// A JSON integer that is not negative. (Parsed text holds such numbers as
// unsigned, JSON built in C++ as signed: both are the same number.)
std::optional<std::uint64_t> whole_number(const json& v) {
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (v.is_number_integer() && v.get<std::int64_t>() >= 0)
    return static_cast<std::uint64_t>(v.get<std::int64_t>());
  return std::nullopt;
}

template <class T>
Decoded<T> refused(Rejections rejected, std::string why) {
  Decoded<T> d;
  d.rejected = std::move(rejected);
  d.refusal = std::move(why);
  return d;
}

// The diagnosis's fields out of d (a diagnosis object, or a diagnosis
// event whose header the caller read).
std::optional<AgentDiagnosis> read_diagnosis(FieldReader& d, const json& obj) {
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
  Rejections rej;
  FieldReader f(body, rej);
  AgentHello h;
  h.agent_id = f.matching("agent_id", limits::kAgentId, is_hex).value_or("");
  h.agent_version = f.matching("agent_version", limits::kVersion, is_version).value_or("");
  h.hostname = f.matching("hostname", limits::kHostname, is_hostname).value_or("");
  if (const json* fs = f.get("features")) {
    if (!fs->is_array()) {
      f.reject("features", RejectReason::wrong_type);
    } else {
      for (std::size_t i = 0; i < fs->size(); ++i) {
        const json& n = (*fs)[i];
        if (h.features.size() == limits::kFeatures) {
          rej.add(f.item("features", i), RejectReason::too_many);
          break;
        }
        if (!n.is_string() || n.get_ref<const std::string&>().size() > limits::kName ||
            !is_name(n.get_ref<const std::string&>()))
          rej.add(f.item("features", i), RejectReason::bad_format);
        else
          h.features.push_back(n.get<std::string>());
      }
    }
  }
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
  Rejections rej;
  FieldReader f(body, rej);
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
  Rejections rej;
  FieldReader f(body, rej);
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
  Rejections rej;
  FieldReader f(body, rej);
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

std::optional<GuestRangesReport> read_ranges(const json& r, Rejections& rej) {
  FieldReader f(r, rej, "ranges");
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
        FieldReader ef(e, rej, "ranges.around");
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

ProgressEvent read_progress(FieldReader& f, Rejections& rej) {
  ProgressEvent p;
  p.plan_hash = f.matching("plan_hash", limits::kPlanHash, is_hex);
  p.state = f.one_of("state",
                     {"started", "progress", "skipped", "succeeded", "failed", "reboot_requested"});
  p.attempt = f.integer<std::int64_t>("attempt", 0, limits::kAttempts);
  p.message = f.text("message", limits::kMessage);
  p.output_tail = f.text("output_tail", limits::kOutputTail);
  if (const json* d = f.get("diagnosis")) {
    if (!d->is_object()) {
      f.reject("diagnosis", RejectReason::wrong_type);
    } else {
      FieldReader df(*d, rej, "diagnosis");
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

PlanEvent read_plan(FieldReader& f) {
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
  Rejections rej;
  FieldReader f(body, rej);
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
  } else if (e.kind == "maintenance") {
    // Without its notice id it says nothing a journal can use: kind and id only.
    if (auto id = f.name("notice_id")) {
      MaintenanceEvent m;
      m.notice_id = *id;
      m.state = f.one_of("state", {"received", "cancelled"});
      m.node = f.name("node");
      m.deadline = f.time("deadline");
      e.body = std::move(m);
    }
  } else if (e.kind == proto::kTierUpgradeEventKind) {
    auto id = f.name("upgrade_id");
    auto state = f.one_of(
        "state", {"started", "rolling_back", "succeeded", "rolled_back", "failed", "refused"});
    TierUpgradeEvent u;
    u.from_hash = f.matching("from_hash", limits::kPlanHash, is_hex);
    u.to_hash = f.matching("to_hash", limits::kPlanHash, is_hex);
    u.step = f.name("step");
    u.message = f.text("message", limits::kMessage);
    if (const json* d = f.get("diagnosis")) {
      if (!d->is_object()) {
        f.reject("diagnosis", RejectReason::wrong_type);
      } else {
        FieldReader df(*d, rej, "diagnosis");
        u.diagnosis = read_diagnosis(df, *d);
      }
    }
    if (id && state) {
      u.upgrade_id = *id;
      u.state = *state;
      e.body = std::move(u);
    }
  } else if (e.kind == proto::kAgentUpgradeEventKind) {
    // The contract's decoder reads it whole (it ignores id, time and keys
    // it does not know); a field it refuses is named in the rejection.
    auto report = proto::decode_agent_upgrade_event(body);
    if (report) {
      e.body = AgentUpgradeReport{std::move(*report)};
    } else {
      std::string field = "(event)";
      const std::string& m = report.error().message;
      if (auto a = m.find(": "); a != std::string::npos) {
        auto b = m.find(": ", a + 2);
        if (b != std::string::npos && b - a - 2 <= limits::kKey) field = m.substr(a + 2, b - a - 2);
      }
      rej.add(field, RejectReason::bad_format);
    }
    return Decoded<AgentEvent>{std::move(e), std::move(rej), ""};
  } else if (e.kind == proto::kEndpointUsageEventKind) {
    if (auto u = proto::read_endpoint_usage(f)) e.body = EndpointUsageReport{std::move(*u)};
    return Decoded<AgentEvent>{std::move(e), std::move(rej), ""};
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
        rej.add(k, RejectReason::too_many);
        break;
      }
      if (k.size() > limits::kKey || !is_name(k)) {
        rej.add("(key)", RejectReason::bad_format);
        continue;
      }
      json b = proto::bounded(v, k, 1, rej);
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
        } else if constexpr (std::is_same_v<T, MaintenanceEvent>) {
          j["notice_id"] = b.notice_id;
          put(j, "state", b.state);
          put(j, "node", b.node);
          put(j, "deadline", b.deadline);
        } else if constexpr (std::is_same_v<T, AgentUpgradeReport>) {
          const json r = b.report.to_json();
          for (auto& [k, v] : r.items())
            if (k != "kind") j[k] = v;
        } else if constexpr (std::is_same_v<T, EndpointUsageReport>) {
          const json r = b.usage.to_json();
          for (auto& [k, v] : r.items())
            if (k != "kind") j[k] = v;
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
        } else if constexpr (std::is_same_v<T, TierUpgradeEvent>) {
          j["upgrade_id"] = b.upgrade_id;
          j["state"] = b.state;
          put(j, "from_hash", b.from_hash);
          put(j, "to_hash", b.to_hash);
          put(j, "step", b.step);
          put(j, "message", b.message);
          if (b.diagnosis) j["diagnosis"] = b.diagnosis->to_json();
        }
      },
      body);
  return j;
}

}  // namespace factory::coordinator
