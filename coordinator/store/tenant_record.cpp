// The tenant record at its edges: JSON in, types inside, JSON out
// (tenant_record.hpp).
#include "coordinator/store/tenant_record.hpp"

#include <limits>

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
Status read(const json& v, GuestRanges& out, const std::string& where);
Status read(const json& v, TenantSpec& out, const std::string& where);
Status read(const json& v, AgentPresence& out, const std::string& where);
Status read(const json& v, KubeStatus& out, const std::string& where);
Status read(const json& v, DiagnosisRecord& out, const std::string& where);
Status read(const json& v, PlanStep& out, const std::string& where);
Status read(const json& v, PlanStatus& out, const std::string& where);
Status read(const json& v, GpuFaultRecord& out, const std::string& where);
Status read(const json& v, RestartJournal& out, const std::string& where);
Status read(const json& v, TenantStatus& out, const std::string& where);
Status read(const json& v, EndpointState& out, const std::string& where);

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

// An object's fields, read one by one; what is left (unknown keys, and
// known ones that are null) becomes the type's `extra`.
class Fields {
 public:
  Fields(const json& object, const std::string& where) : rest_(object), where_(where) {}

  template <class T>
  Fields& get(const char* key, std::optional<T>& out) {
    if (error_) return *this;
    auto it = rest_.find(key);
    if (it == rest_.end() || it->is_null()) return *this;
    T value{};
    if (auto st = read(*it, value, where_.empty() ? key : where_ + "." + key); !st.ok()) {
      error_ = st.error();
      return *this;
    }
    out = std::move(value);
    rest_.erase(it);
    return *this;
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

Status read(const json& v, GuestRanges& g, const std::string& where) {
  if (!v.is_object()) return bad(where, "an object", v);
  Fields f(v, where);
  f.get("avoid", g.avoid).get("pool", g.pool).get("planned", g.planned).get("fixed", g.fixed);
  return f.done(g.extra);
}

Status read(const json& v, TenantSpec& s, const std::string& where) {
  if (!v.is_object()) return bad(where, "an object", v);
  Fields f(v, where);
  f.get("tier", s.tier)
      .get("namespace", s.ns)
      .get("cpu", s.cpu)
      .get("memory", s.memory)
      .get("disk", s.disk)
      .get("image", s.image)
      .get("gpus", s.gpus)
      .get("gpu_resource", s.gpu_resource)
      .get("ssh_node_port", s.ssh_node_port)
      .get("needs_mig", s.needs_mig)
      .get("ssh_service", s.ssh_service)
      .get("endpoint_port", s.endpoint_port)
      .get("labels", s.labels)
      .get("ssh_authorized_keys", s.ssh_authorized_keys)
      .get("models", s.models)
      .get("guest_ranges", s.guest_ranges);
  return f.done(s.extra);
}

Status read(const json& v, AgentPresence& a, const std::string& where) {
  if (!v.is_object()) return bad(where, "an object", v);
  Fields f(v, where);
  f.get("agent_id", a.agent_id)
      .get("cert_serials", a.cert_serials)
      .get("certificate_expires_at", a.certificate_expires_at)
      .get("enrolled_at", a.enrolled_at)
      .get("hostname", a.hostname)
      .get("version", a.version)
      .get("revoked_at", a.revoked_at);
  return f.done(a.extra);
}

Status read(const json& v, KubeStatus& k, const std::string& where) {
  if (!v.is_object()) return bad(where, "an object", v);
  Fields f(v, where);
  f.get("state", k.state)
      .get("namespace", k.ns)
      .get("started_at", k.started_at)
      .get("created_at", k.created_at)
      .get("gpu_resource", k.gpu_resource)
      .get("objects", k.objects)
      .get("bootstrap_token_id", k.bootstrap_token_id)
      .get("error", k.error);
  return f.done(k.extra);
}

Status read(const json& v, DiagnosisRecord& d, const std::string& where) {
  if (!v.is_object()) return bad(where, "an object", v);
  Fields f(v, where);
  f.get("kind", d.kind)
      .get("code", d.code)
      .get("summary", d.summary)
      .get("fix", d.fix)
      .get("details", d.details)
      .get("time", d.time)
      .get("truncated", d.truncated);
  return f.done(d.extra);
}

Status read(const json& v, PlanStep& s, const std::string& where) {
  if (!v.is_object()) return bad(where, "an object", v);
  Fields f(v, where);
  f.get("state", s.state)
      .get("started_at", s.started_at)
      .get("time", s.time)
      .get("truncated", s.truncated)
      .get("attempt", s.attempt)
      .get("message", s.message)
      .get("output_tail", s.output_tail)
      .get("diagnosis", s.diagnosis)
      .get("percent", s.percent)
      .get("completed", s.completed)
      .get("total", s.total)
      .get("allocatable", s.allocatable)
      .get("expected", s.expected)
      .get("ranges", s.ranges);
  return f.done(s.extra);
}

Status read(const json& v, PlanStatus& p, const std::string& where) {
  if (!v.is_object()) return bad(where, "an object", v);
  Fields f(v, where);
  f.get("hash", p.hash)
      .get("tier", p.tier)
      .get("state", p.state)
      .get("message", p.message)
      .get("failed_step", p.failed_step)
      .get("steps_total", p.steps_total)
      .get("steps_done", p.steps_done)
      .get("time", p.time)
      .get("truncated", p.truncated)
      .get("steps", p.steps);
  return f.done(p.extra);
}

Status read(const json& v, GpuFaultRecord& g, const std::string& where) {
  if (!v.is_object()) return bad(where, "an object", v);
  Fields f(v, where);
  f.get("gpu", g.gpu)
      .get("uuid", g.uuid)
      .get("serial", g.serial)
      .get("name", g.name)
      .get("pci_bus_id", g.pci_bus_id)
      .get("kind", g.kind)
      .get("xid", g.xid)
      .get("code", g.code)
      .get("summary", g.summary)
      .get("fix", g.fix)
      .get("first_seen", g.first_seen);
  return f.done(g.extra);
}

Status read(const json& v, RestartJournal& r, const std::string& where) {
  if (!v.is_object()) return bad(where, "an object", v);
  Fields f(v, where);
  f.get("state", r.state)
      .get("requested_at", r.requested_at)
      .get("finished_at", r.finished_at)
      .get("from_instance", r.from_instance)
      .get("avoid_gpus", r.avoid_gpus)
      .get("gpus_before", r.gpus_before)
      .get("gpus_after", r.gpus_after)
      .get("note", r.note)
      .get("error", r.error);
  return f.done(r.extra);
}

Status read(const json& v, TenantStatus& s, const std::string& where) {
  if (!v.is_object()) return bad(where, "an object", v);
  Fields f(v, where);
  f.get("kube", s.kube)
      .get("plan", s.plan)
      .get("diagnoses", s.diagnoses)
      .get("gpu_faults", s.gpu_faults)
      .get("restart", s.restart);
  return f.done(s.extra);
}

Status read(const json& v, EndpointState& e, const std::string& where) {
  if (!v.is_object()) return bad(where, "an object", v);
  Fields f(v, where);
  f.get("key_sha256", e.key_sha256)
      .get("port", e.port)
      .get("host", e.host)
      .get("rotated_at", e.rotated_at)
      .get("url", e.url);
  return f.done(e.extra);
}

// Writers: the JSON of each type, its unknown keys first.
json write(const GuestRanges& g);
json write(const KubeStatus& k);
json write(const DiagnosisRecord& d);
json write(const PlanStep& s);
json write(const PlanStatus& p, bool with_steps = true);
json write(const GpuFaultRecord& g);
json write(const RestartJournal& r);

template <class T>
json write(const T& v) {
  return json(v);
}

template <class T>
json write(const std::map<std::string, T>& m) {
  json j = json::object();
  for (const auto& [k, v] : m) j[k] = write(v);
  return j;
}

template <class T>
void put(json& j, const char* key, const std::optional<T>& v) {
  if (v) j[key] = write(*v);
}

json start(const json& extra) {
  return extra.is_object() ? extra : json::object();
}

json write(const GuestRanges& g) {
  json j = start(g.extra);
  put(j, "avoid", g.avoid);
  put(j, "pool", g.pool);
  put(j, "planned", g.planned);
  put(j, "fixed", g.fixed);
  return j;
}

json write(const KubeStatus& k) {
  json j = start(k.extra);
  put(j, "state", k.state);
  put(j, "namespace", k.ns);
  put(j, "started_at", k.started_at);
  put(j, "created_at", k.created_at);
  put(j, "gpu_resource", k.gpu_resource);
  put(j, "objects", k.objects);
  put(j, "bootstrap_token_id", k.bootstrap_token_id);
  put(j, "error", k.error);
  return j;
}

json write(const DiagnosisRecord& d) {
  json j = start(d.extra);
  put(j, "kind", d.kind);
  put(j, "code", d.code);
  put(j, "summary", d.summary);
  put(j, "fix", d.fix);
  put(j, "details", d.details);
  put(j, "time", d.time);
  put(j, "truncated", d.truncated);
  return j;
}

json write(const PlanStep& s) {
  json j = start(s.extra);
  put(j, "state", s.state);
  put(j, "started_at", s.started_at);
  put(j, "time", s.time);
  put(j, "truncated", s.truncated);
  put(j, "attempt", s.attempt);
  put(j, "message", s.message);
  put(j, "output_tail", s.output_tail);
  put(j, "diagnosis", s.diagnosis);
  put(j, "percent", s.percent);
  put(j, "completed", s.completed);
  put(j, "total", s.total);
  put(j, "allocatable", s.allocatable);
  put(j, "expected", s.expected);
  put(j, "ranges", s.ranges);
  return j;
}

json write(const PlanStatus& p, bool with_steps) {
  json j = start(p.extra);
  put(j, "hash", p.hash);
  put(j, "tier", p.tier);
  put(j, "state", p.state);
  put(j, "message", p.message);
  put(j, "failed_step", p.failed_step);
  put(j, "steps_total", p.steps_total);
  put(j, "steps_done", p.steps_done);
  put(j, "time", p.time);
  put(j, "truncated", p.truncated);
  if (with_steps) put(j, "steps", p.steps);
  return j;
}

json write(const GpuFaultRecord& g) {
  json j = start(g.extra);
  put(j, "gpu", g.gpu);
  put(j, "uuid", g.uuid);
  put(j, "serial", g.serial);
  put(j, "name", g.name);
  put(j, "pci_bus_id", g.pci_bus_id);
  put(j, "kind", g.kind);
  put(j, "xid", g.xid);
  put(j, "code", g.code);
  put(j, "summary", g.summary);
  put(j, "fix", g.fix);
  put(j, "first_seen", g.first_seen);
  return j;
}

json write(const RestartJournal& r) {
  json j = start(r.extra);
  put(j, "state", r.state);
  put(j, "requested_at", r.requested_at);
  put(j, "finished_at", r.finished_at);
  put(j, "from_instance", r.from_instance);
  put(j, "avoid_gpus", r.avoid_gpus);
  put(j, "gpus_before", r.gpus_before);
  put(j, "gpus_after", r.gpus_after);
  put(j, "note", r.note);
  put(j, "error", r.error);
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
  return write(*this, with_steps);
}
json GpuFaultRecord::to_json() const {
  return write(*this);
}
json RestartJournal::to_json() const {
  return write(*this);
}

// ---- TenantSpec ----

bool TenantSpec::empty() const {
  return to_json().empty();
}

json TenantSpec::to_json() const {
  json j = start(extra);
  put(j, "tier", tier);
  put(j, "namespace", ns);
  put(j, "cpu", cpu);
  put(j, "memory", memory);
  put(j, "disk", disk);
  put(j, "image", image);
  put(j, "gpus", gpus);
  put(j, "gpu_resource", gpu_resource);
  put(j, "ssh_node_port", ssh_node_port);
  put(j, "needs_mig", needs_mig);
  put(j, "ssh_service", ssh_service);
  put(j, "endpoint_port", endpoint_port);
  put(j, "labels", labels);
  put(j, "ssh_authorized_keys", ssh_authorized_keys);
  put(j, "models", models);
  put(j, "guest_ranges", guest_ranges);
  return j;
}

Result<TenantSpec> TenantSpec::from_json(const json& j) {
  return read_part<TenantSpec>(j, "spec");
}

// ---- AgentPresence ----

bool AgentPresence::empty() const {
  return to_json().empty();
}

json AgentPresence::to_json() const {
  json j = start(extra);
  put(j, "agent_id", agent_id);
  put(j, "cert_serials", cert_serials);
  put(j, "certificate_expires_at", certificate_expires_at);
  put(j, "enrolled_at", enrolled_at);
  put(j, "hostname", hostname);
  put(j, "version", version);
  put(j, "revoked_at", revoked_at);
  return j;
}

Result<AgentPresence> AgentPresence::from_json(const json& j) {
  return read_part<AgentPresence>(j, "agent");
}

// ---- TenantStatus ----

bool TenantStatus::empty() const {
  return to_json().empty();
}

json TenantStatus::to_json() const {
  json j = start(extra);
  put(j, "kube", kube);
  put(j, "plan", plan);
  put(j, "diagnoses", diagnoses);
  put(j, "gpu_faults", gpu_faults);
  put(j, "restart", restart);
  return j;
}

Result<TenantStatus> TenantStatus::from_json(const json& j) {
  return read_part<TenantStatus>(j, "status");
}

// ---- EndpointState ----

json EndpointState::to_json() const {
  json j = start(extra);
  put(j, "key_sha256", key_sha256);
  put(j, "port", port);
  put(j, "host", host);
  put(j, "rotated_at", rotated_at);
  put(j, "url", url);
  return j;
}

Result<EndpointState> EndpointState::from_json(const json& j) {
  return read_part<EndpointState>(j, "endpoint");
}

// ---- TenantRecord ----

json TenantRecord::to_json() const {
  json j = start(extra);
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
