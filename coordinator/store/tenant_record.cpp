// The tenant record at its edges: JSON in, types inside, JSON out
// (tenant_record.hpp).
#include "coordinator/store/tenant_record.hpp"

#include <concepts>
#include <limits>
#include <string_view>
#include <type_traits>

namespace factory::store {

using nlohmann::json;

namespace {

std::string shown(const json& v) {
  std::string s = v.dump();
  if (s.size() > 48) s = s.substr(0, 45) + "...";
  return s;
}

Error bad(const std::string& where, const char* want, const json& v) {
  return Error(Errc::invalid_argument, where + ": want " + want + ", not " + shown(v));
}

// Readers, one per type a field has; `where` is the field's path.
Status read(const json& v, std::string& out, const std::string& where);
Status read(const json& v, bool& out, const std::string& where);
Status read(const json& v, int& out, const std::string& where);
Status read(const json& v, std::int64_t& out, const std::string& where);
Status read(const json& v, std::uint64_t& out, const std::string& where);
Status read(const json& v, double& out, const std::string& where);
Status read(const json& v, json& out, const std::string& where);
Status read(const json& v, EndpointUsage& out, const std::string& where);
// GpuUsage reads and writes itself (gpu_usage.hpp).
Status read(const json& v, GpuUsage& out, const std::string& where);
json write(const GpuUsage& u);

// The parts of the record (the types with an `extra`): each names its fields
// once, in each_field below, and one reader and one writer walk them.
template <class T>
concept Part = requires(const T& t) {
  { t.extra } -> std::convertible_to<const json&>;
};
template <Part T>
Status read(const json& v, T& out, const std::string& where);

template <class T>
Status read(const json& v, std::vector<T>& out, const std::string& where) {
  if (!v.is_array()) return bad(where, "an array", v);
  out.clear();
  for (std::size_t i = 0; i < v.size(); ++i) {
    T item{};
    if (auto st = read(v[i], item, where + "[" + std::to_string(i) + "]"); !st.ok()) return st;
    out.push_back(std::move(item));
  }
  return {};
}

template <class T>
Status read(const json& v, std::map<std::string, T>& out, const std::string& where) {
  if (!v.is_object()) return bad(where, "an object", v);
  out.clear();
  for (const auto& [k, item] : v.items()) {
    T value{};
    if (auto st = read(item, value, where + "." + k); !st.ok()) return st;
    out.emplace(k, std::move(value));
  }
  return {};
}

Status read(const json& v, std::string& out, const std::string& where) {
  if (!v.is_string()) return bad(where, "a string", v);
  out = v.get<std::string>();
  return {};
}

Status read(const json& v, bool& out, const std::string& where) {
  if (!v.is_boolean()) return bad(where, "true or false", v);
  out = v.get<bool>();
  return {};
}

// nlohmann holds an integer it made as signed and one it parsed as
// unsigned: both are read, each within the field's range.
Status read(const json& v, std::int64_t& out, const std::string& where) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      return bad(where, "an integer in range", v);
    out = static_cast<std::int64_t>(u);
    return {};
  }
  if (!v.is_number_integer()) return bad(where, "an integer", v);
  out = v.get<std::int64_t>();
  return {};
}

Status read(const json& v, int& out, const std::string& where) {
  std::int64_t wide = 0;
  if (auto st = read(v, wide, where); !st.ok()) return st;
  if (wide < std::numeric_limits<int>::min() || wide > std::numeric_limits<int>::max())
    return bad(where, "an integer in range", v);
  out = static_cast<int>(wide);
  return {};
}

Status read(const json& v, std::uint64_t& out, const std::string& where) {
  if (v.is_number_unsigned()) {
    out = v.get<std::uint64_t>();
    return {};
  }
  if (!v.is_number_integer()) return bad(where, "a non-negative integer", v);
  const auto i = v.get<std::int64_t>();
  if (i < 0) return bad(where, "a non-negative integer", v);
  out = static_cast<std::uint64_t>(i);
  return {};
}

Status read(const json& v, double& out, const std::string& where) {
  if (!v.is_number()) return bad(where, "a number", v);
  out = v.get<double>();
  return {};
}

Status read(const json& v, json& out, const std::string&) {
  out = v;
  return {};
}

Status read(const json& v, EndpointUsage& out, const std::string& where) {
  auto u = EndpointUsage::from_json(v);
  if (!u) return Error(Errc::invalid_argument, where + ": " + u.error().message);
  out = std::move(*u);
  return {};
}

Status read(const json& v, GpuUsage& out, const std::string& where) {
  auto u = GpuUsage::from_json(v);
  if (!u) return Error(Errc::invalid_argument, where + ": " + u.error().message);
  out = std::move(*u);
  return {};
}

json write(const GpuUsage& u) {
  return u.to_json();
}

// An object's fields, read one by one; what is left (unknown keys, and
// known ones that are null) becomes the type's `extra`.
class Fields {
 public:
  Fields(const json& object, const std::string& where) : rest_(object), where_(where) {}

  template <class T>
  void operator()(const char* key, std::optional<T>& out) {
    if (error_) return;
    auto it = rest_.find(key);
    if (it == rest_.end() || it->is_null()) return;
    T value{};
    if (auto st = read(*it, value, where_.empty() ? key : where_ + "." + key); !st.ok()) {
      error_ = st.error();
      return;
    }
    out = std::move(value);
    rest_.erase(it);
  }

  Status done(json& extra) {
    if (error_) return *error_;
    extra = std::move(rest_);
    return {};
  }

 private:
  json rest_;
  std::string where_;
  std::optional<Error> error_;
};

// Each part's fields, in the order they are written, each named once.
template <class S, class T>
concept Is = std::same_as<std::remove_const_t<S>, T>;

template <Is<GuestRanges> S, class V>
void each_field(S& g, V& v) {
  v("avoid", g.avoid);
  v("pool", g.pool);
  v("planned", g.planned);
  v("fixed", g.fixed);
}

template <Is<TenantSpec> S, class V>
void each_field(S& s, V& v) {
  v("tier", s.tier);
  v("namespace", s.ns);
  v("cpu", s.cpu);
  v("memory", s.memory);
  v("disk", s.disk);
  v("image", s.image);
  v("gpus", s.gpus);
  v("gpu_resource", s.gpu_resource);
  v("ssh_node_port", s.ssh_node_port);
  v("needs_mig", s.needs_mig);
  v("ssh_service", s.ssh_service);
  v("endpoint_port", s.endpoint_port);
  v("labels", s.labels);
  v("ssh_authorized_keys", s.ssh_authorized_keys);
  v("models", s.models);
  v("guest_ranges", s.guest_ranges);
  v("project", s.project);
}

template <Is<AgentPresence> S, class V>
void each_field(S& a, V& v) {
  v("agent_id", a.agent_id);
  v("cert_serials", a.cert_serials);
  v("certificate_expires_at", a.certificate_expires_at);
  v("enrolled_at", a.enrolled_at);
  v("hostname", a.hostname);
  v("version", a.version);
  v("revoked_at", a.revoked_at);
}

template <Is<KubeStatus> S, class V>
void each_field(S& k, V& v) {
  v("state", k.state);
  v("namespace", k.ns);
  v("started_at", k.started_at);
  v("created_at", k.created_at);
  v("gpu_resource", k.gpu_resource);
  v("objects", k.objects);
  v("bootstrap_token_id", k.bootstrap_token_id);
  v("error", k.error);
}

template <Is<DiagnosisRecord> S, class V>
void each_field(S& d, V& v) {
  v("kind", d.kind);
  v("code", d.code);
  v("summary", d.summary);
  v("fix", d.fix);
  v("details", d.details);
  v("time", d.time);
  v("truncated", d.truncated);
}

template <Is<PlanStep> S, class V>
void each_field(S& s, V& v) {
  v("state", s.state);
  v("started_at", s.started_at);
  v("time", s.time);
  v("truncated", s.truncated);
  v("attempt", s.attempt);
  v("message", s.message);
  v("output_tail", s.output_tail);
  v("diagnosis", s.diagnosis);
  v("percent", s.percent);
  v("completed", s.completed);
  v("total", s.total);
  v("allocatable", s.allocatable);
  v("expected", s.expected);
  v("ranges", s.ranges);
}

template <Is<PlanStatus> S, class V>
void each_field(S& p, V& v) {
  v("hash", p.hash);
  v("tier", p.tier);
  v("state", p.state);
  v("message", p.message);
  v("failed_step", p.failed_step);
  v("steps_total", p.steps_total);
  v("steps_done", p.steps_done);
  v("time", p.time);
  v("truncated", p.truncated);
  v("steps", p.steps);
}

template <Is<GpuFaultRecord> S, class V>
void each_field(S& g, V& v) {
  v("gpu", g.gpu);
  v("uuid", g.uuid);
  v("serial", g.serial);
  v("name", g.name);
  v("pci_bus_id", g.pci_bus_id);
  v("kind", g.kind);
  v("xid", g.xid);
  v("code", g.code);
  v("summary", g.summary);
  v("fix", g.fix);
  v("first_seen", g.first_seen);
}

template <Is<RestartJournal> S, class V>
void each_field(S& r, V& v) {
  v("state", r.state);
  v("requested_at", r.requested_at);
  v("finished_at", r.finished_at);
  v("from_instance", r.from_instance);
  v("avoid_gpus", r.avoid_gpus);
  v("gpus_before", r.gpus_before);
  v("gpus_after", r.gpus_after);
  v("note", r.note);
  v("error", r.error);
}

template <Is<MaintenanceJournal> S, class V>
void each_field(S& m, V& v) {
  v("state", m.state);
  v("node", m.node);
  v("notice_id", m.notice_id);
  v("noticed_at", m.noticed_at);
  v("deadline", m.deadline);
  v("move", m.move);
  v("notice_sent_at", m.notice_sent_at);
  v("guest_received_at", m.guest_received_at);
  v("stop_requested_at", m.stop_requested_at);
  v("stopped_at", m.stopped_at);
  v("start_requested_at", m.start_requested_at);
  v("back_at", m.back_at);
  v("cancelled_at", m.cancelled_at);
  v("instance_before", m.instance_before);
  v("node_after", m.node_after);
  v("note", m.note);
  v("error", m.error);
}

template <Is<TierPlan> S, class V>
void each_field(S& p, V& v) {
  v("hash", p.hash);
  v("plan", p.plan);
  v("pinned_at", p.pinned_at);
}

template <Is<TierUpgradeJournal> S, class V>
void each_field(S& u, V& v) {
  v("id", u.id);
  v("state", u.state);
  v("requested_at", u.requested_at);
  v("started_at", u.started_at);
  v("finished_at", u.finished_at);
  v("from_hash", u.from_hash);
  v("to_hash", u.to_hash);
  v("to_plan", u.to_plan);
  v("steps", u.steps);
  v("pins", u.pins);
  v("failed_step", u.failed_step);
  v("message", u.message);
  v("diagnosis", u.diagnosis);
}

template <Is<AgentUpgradeJournal> S, class V>
void each_field(S& u, V& v) {
  v("state", u.state);
  v("upgrade_id", u.upgrade_id);
  v("rollout_id", u.rollout_id);
  v("order", u.order);
  v("max_unavailable", u.max_unavailable);
  v("from_version", u.from_version);
  v("to_version", u.to_version);
  v("to_sha256", u.to_sha256);
  v("size", u.size);
  v("url", u.url);
  v("confirm_within_s", u.confirm_within_s);
  v("requested_at", u.requested_at);
  v("sent_at", u.sent_at);
  v("installing_at", u.installing_at);
  v("done_at", u.done_at);
  v("reason", u.reason);
  v("announced", u.announced);
}

template <Is<TenantStatus> S, class V>
void each_field(S& s, V& v) {
  v("kube", s.kube);
  v("plan", s.plan);
  v("diagnoses", s.diagnoses);
  v("gpu_faults", s.gpu_faults);
  v("restart", s.restart);
  v("maintenance", s.maintenance);
  v("tier_plan", s.tier_plan);
  v("tier_upgrade", s.tier_upgrade);
  v("agent_upgrade", s.agent_upgrade);
  v("gpu_usage", s.gpu_usage);
}

template <Is<EndpointKey> S, class V>
void each_field(S& k, V& v) {
  v("name", k.name);
  v("sha256", k.sha256);
  v("created_at", k.created_at);
  v("rpm", k.rpm);
  v("tpm", k.tpm);
}

template <Is<EndpointState> S, class V>
void each_field(S& e, V& v) {
  v("key_sha256", e.key_sha256);
  v("port", e.port);
  v("host", e.host);
  v("rotated_at", e.rotated_at);
  v("url", e.url);
  v("keys", e.keys);
  v("usage", e.usage);
}

template <Part T>
Status read(const json& v, T& out, const std::string& where) {
  if (!v.is_object()) return bad(where, "an object", v);
  Fields f(v, where);
  each_field(out, f);
  return f.done(out.extra);
}

// Writers: the JSON of each part, its unknown keys first.
template <Part T>
json write(const T& part, const char* skip = nullptr);

template <class T>
requires(!Part<T>) json write(const T& v) {
  return json(v);
}

template <Part T>
json write(const std::vector<T>& items) {
  json a = json::array();
  for (const auto& item : items) a.push_back(write(item));
  return a;
}

json write(const EndpointUsage& u) {
  return u.to_json();
}

template <class T>
json write(const std::map<std::string, T>& m) {
  json j = json::object();
  for (const auto& [k, v] : m) j[k] = write(v);
  return j;
}

// Puts each field that is set under its key (but `skip`).
class Writer {
 public:
  Writer(json& j, const char* skip) : j_(j), skip_(skip) {}
  template <class T>
  void operator()(const char* key, const std::optional<T>& v) {
    if (v && !(skip_ && std::string_view(key) == skip_)) j_[key] = write(*v);
  }

 private:
  json& j_;
  const char* skip_;
};

template <Part T>
json write(const T& part, const char* skip) {
  json j = part.extra.is_object() ? part.extra : json::object();
  Writer w(j, skip);
  each_field(part, w);
  return j;
}

// from_json of a top-level part: the error says it is the record's.
template <class T>
Result<T> read_part(const json& j, const char* where) {
  T out;
  if (auto st = read(j, out, where); !st.ok())
    return Error(Errc::invalid_argument, "tenant record: " + st.error().message);
  return out;
}

}  // namespace

json GuestRanges::to_json() const {
  return write(*this);
}
json KubeStatus::to_json() const {
  return write(*this);
}
json DiagnosisRecord::to_json() const {
  return write(*this);
}
json PlanStep::to_json() const {
  return write(*this);
}
json PlanStatus::to_json(bool with_steps) const {
  return write(*this, with_steps ? nullptr : "steps");
}
json GpuFaultRecord::to_json() const {
  return write(*this);
}
json RestartJournal::to_json() const {
  return write(*this);
}
json MaintenanceJournal::to_json() const {
  return write(*this);
}
json TierPlan::to_json() const {
  return write(*this);
}
json TierUpgradeJournal::to_json() const {
  return write(*this);
}
json AgentUpgradeJournal::to_json() const {
  return write(*this);
}

// ---- TenantSpec ----

bool TenantSpec::empty() const {
  return to_json().empty();
}

json TenantSpec::to_json() const {
  return write(*this);
}

Result<TenantSpec> TenantSpec::from_json(const json& j) {
  return read_part<TenantSpec>(j, "spec");
}

// ---- AgentPresence ----

bool AgentPresence::empty() const {
  return to_json().empty();
}

json AgentPresence::to_json() const {
  return write(*this);
}

Result<AgentPresence> AgentPresence::from_json(const json& j) {
  return read_part<AgentPresence>(j, "agent");
}

// ---- TenantStatus ----

bool TenantStatus::empty() const {
  return to_json().empty();
}

json TenantStatus::to_json() const {
  return write(*this);
}

Result<TenantStatus> TenantStatus::from_json(const json& j) {
  return read_part<TenantStatus>(j, "status");
}

// ---- EndpointState ----

json EndpointKey::to_json() const {
  return write(*this);
}

json EndpointState::to_json() const {
  return write(*this);
}

Result<EndpointState> EndpointState::from_json(const json& j) {
  return read_part<EndpointState>(j, "endpoint");
}

// ---- TenantRecord ----

json TenantRecord::to_json() const {
  json j = extra.is_object() ? extra : json::object();
  j["name"] = name;
  j["tier"] = tier;
  j["phase"] = phase;
  j["created_at"] = created_at;
  j["spec"] = spec.to_json();
  j["agent"] = agent.to_json();
  j["status"] = status.to_json();
  if (endpoint) {
    json e = endpoint->to_json();
    if (!e.empty()) j["endpoint"] = std::move(e);
  }
  return j;
}

Result<TenantRecord> TenantRecord::from_json(const json& j) {
  auto fail = [](const std::string& m) {
    return Error(Errc::invalid_argument, "tenant record: " + m);
  };
  if (!j.is_object()) return fail(bad("record", "an object", j).message);
  TenantRecord t;
  json rest = j;
  // name is required; the other strings have their defaults when absent.
  auto it = rest.find("name");
  if (it == rest.end()) return fail("no name");
  if (auto st = read(*it, t.name, "name"); !st.ok()) return fail(st.error().message);
  rest.erase(it);
  const std::pair<const char*, std::string*> strings[] = {
      {"tier", &t.tier}, {"phase", &t.phase}, {"created_at", &t.created_at}};
  for (auto [key, out] : strings) {
    it = rest.find(key);
    if (it == rest.end()) continue;
    if (auto st = read(*it, *out, key); !st.ok()) return fail(st.error().message);
    rest.erase(it);
  }
  // Each part: absent or null reads as empty, as records always had it.
  auto part = [&](const char* key, auto& out) -> Status {
    auto p = rest.find(key);
    if (p == rest.end()) return {};
    if (!p->is_null())
      if (auto st = read(*p, out, key); !st.ok()) return st;
    rest.erase(p);
    return {};
  };
  if (auto st = part("spec", t.spec); !st.ok()) return fail(st.error().message);
  if (auto st = part("agent", t.agent); !st.ok()) return fail(st.error().message);
  if (auto st = part("status", t.status); !st.ok()) return fail(st.error().message);
  EndpointState e;
  it = rest.find("endpoint");
  const bool has_endpoint = it != rest.end() && !(it->is_object() && it->empty());
  if (auto st = part("endpoint", e); !st.ok()) return fail(st.error().message);
  if (has_endpoint && !(e == EndpointState{})) t.endpoint = std::move(e);
  t.extra = std::move(rest);
  return t;
}

}  // namespace factory::store
