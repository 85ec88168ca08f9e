#include "coordinator/config/coordinator_config.hpp"

#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "common/durations.hpp"
#include "common/log.hpp"
#include "common/net/server.hpp"
#include "common/validation.hpp"
#include "common/yaml_json.hpp"

namespace factory::coordinator {

namespace {

std::string dial_host(const std::string& listen_host) {
  if (listen_host.empty() || listen_host == "0.0.0.0") return "127.0.0.1";
  if (listen_host == "::") return "[::1]";
  if (listen_host.find(':') != std::string::npos) return "[" + listen_host + "]";
  return listen_host;
}

std::string hostname() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

// Durations are written as the CLI takes them ("90s", "1h"), so a bare
// number (seconds? milliseconds?) is refused rather than guessed.
Status read_duration(validation::ConfigMap& m, const char* key, std::chrono::seconds& out) {
  const nlohmann::json* v = m.take(key);
  if (!v) return {};
  if (!v->is_string()) return m.wrong_type(key, "a duration like 90s, 1h");
  auto d = parse_duration(v->get<std::string>());
  if (!d) return m.bad_value(key, d.error().message);
  out = *d;
  return {};
}

std::string resolve_against(const std::string& config_path, const std::string& p) {
  if (p.empty() || std::filesystem::path(p).is_absolute()) return p;
  return (std::filesystem::path(config_path).parent_path() / p).lexically_normal().string();
}

// A byte count: a whole number, or one with a binary suffix (Ki, Mi, Gi).
Result<std::uint64_t> parse_bytes(const nlohmann::json& v) {
  auto bad = [] {
    return Error(Errc::invalid_argument, "want a byte count like 33554432, 512Ki, 32Mi or 1Gi");
  };
  if (v.is_number_integer() && v.get<std::int64_t>() >= 0)
    return static_cast<std::uint64_t>(v.get<std::int64_t>());
  if (!v.is_string()) return bad();
  const std::string s = v.get<std::string>();
  std::size_t digits = 0;
  while (digits < s.size() && std::isdigit(static_cast<unsigned char>(s[digits]))) ++digits;
  if (digits == 0 || digits > 12) return bad();
  std::uint64_t n = std::stoull(s.substr(0, digits));
  const std::string unit = s.substr(digits);
  if (unit.empty()) return n;
  if (unit == "Ki") return n << 10;
  if (unit == "Mi") return n << 20;
  if (unit == "Gi") return n << 30;
  return bad();
}

// A number within [lo, hi] (YAML gives integers or floats).
Status read_number(validation::ConfigMap& m, const char* key, double lo, double hi, double& out) {
  const nlohmann::json* v = m.take(key);
  if (!v) return {};
  if (!v->is_number()) return m.wrong_type(key, "a number");
  double d = v->get<double>();
  if (d < lo || d > hi)
    return m.bad_value(key, "want a number from " + std::to_string(static_cast<long long>(lo)) +
                                " to " + std::to_string(static_cast<long long>(hi)));
  out = d;
  return {};
}

// agents.quota: each tenant's share of the coordinator (agents/quota.hpp).
Status read_quota(validation::ConfigMap& q, CoordinatorConfig& c) {
  for (auto st : {read_number(q, "events_per_second", 1, 1e6, c.quota_events_per_second),
                  read_number(q, "event_burst", 1, 1e7, c.quota_event_burst)})
    if (!st.ok()) return st;
  if (const nlohmann::json* b = q.take("bytes_per_day")) {
    auto n = parse_bytes(*b);
    if (!n) return q.bad_value("bytes_per_day", n.error().message);
    // Below a few full-size frames a tenant could be left unable to send
    // one event, ever.
    if (*n < (1u << 20)) return q.bad_value("bytes_per_day", "must be at least 1Mi");
    c.quota_bytes_per_day = *n;
  }
  if (auto st = q.read("max_events_stored", c.quota_max_events_stored, 100'000'000); !st.ok())
    return st;
  if (c.quota_max_events_stored < 1) return q.bad_value("max_events_stored", "must be at least 1");
  if (auto st = read_duration(q, "max_event_age", c.quota_max_event_age); !st.ok()) return st;
  if (c.quota_max_event_age < std::chrono::hours(1))
    return q.bad_value("max_event_age", "must be at least 1h");
  return q.done();
}

// quotas.projects: project -> {gpus: {card model: GPUs}} (docs/usage.md).
// Every name and number checked here, so a typo stops `factory serve`.
Status read_project_quotas(validation::ConfigMap& q, CoordinatorConfig& c) {
  const nlohmann::json* v = q.take("projects");
  if (!v) return q.done();
  const char* want = "a map of project -> {gpus: {card model: GPUs}}";
  if (!v->is_object()) return q.wrong_type("projects", want);
  auto label = [](const std::string& s) {
    if (s.empty() || s.size() > 63 || s.front() == '-' || s.back() == '-') return false;
    return std::all_of(s.begin(), s.end(), [](char ch) {
      return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-';
    });
  };
  for (const auto& [project, body] : v->items()) {
    if (!label(project))
      return q.bad_value("projects", "'" + project.substr(0, 63) +
                                         "' is not a project name (a DNS-1123 label: lower-case "
                                         "letters, digits, '-'; at most 63)");
    if (body.is_null()) continue;
    if (!body.is_object()) return q.wrong_type("projects", want);
    for (const auto& [k, gpus] : body.items()) {
      if (k != "gpus")
        return q.bad_value("projects", project + ": unknown key '" + k + "' (want gpus)");
      if (!gpus.is_object()) return q.wrong_type("projects", want);
      for (const auto& [model, n] : gpus.items()) {
        if (model.find('/') == std::string::npos || model.size() > 317)
          return q.bad_value("projects", project + ".gpus: '" + model.substr(0, 64) +
                                             "' is not a card model (nvidia.com/GH100_H200)");
        if (!n.is_number_integer() || n.get<std::int64_t>() < 0 || n.get<std::int64_t>() > 100000)
          return q.bad_value("projects",
                             project + ".gpus." + model + ": want a whole number of GPUs from 0");
        c.project_gpu_quotas[project][model] = n.get<int>();
      }
    }
  }
  return q.done();
}

// guest_ranges: every range parsed here, so a typo stops `factory serve`
// instead of a tenant's create.
Status read_guest_ranges(validation::ConfigMap& g, CoordinatorConfig& c) {
  if (const nlohmann::json* v = g.take("avoid")) {
    if (!v->is_array()) return g.wrong_type("avoid", "a list of ranges like 192.168.0.0/16");
    for (const auto& r : *v) {
      if (!r.is_string()) return g.wrong_type("avoid", "a list of ranges like 192.168.0.0/16");
      auto p = ranges::IpPrefix::parse(r.get<std::string>());
      if (!p) return g.bad_value("avoid", p.error().message);
      c.guest_ranges_avoid.push_back(
          {r.get<std::string>(), "guest_ranges.avoid in the coordinator config"});
    }
  }
  ranges::Pool& pool = c.guest_ranges_pool;
  if (const nlohmann::json* v = g.take("pool")) {
    auto want = [&] { return g.wrong_type("pool", "a list of IPv4 ranges like 10.52.0.0/14"); };
    if (!v->is_array()) return want();
    pool.blocks.clear();
    for (const auto& b : *v) {
      if (!b.is_string()) return want();
      pool.blocks.push_back(b.get<std::string>());
    }
  }
  for (auto [k, out] : {std::pair{"pod_prefix", &pool.pod_prefix},
                        {"service_prefix", &pool.service_prefix},
                        {"dns_offset", &pool.dns_offset}})
    if (const nlohmann::json* v = g.take(k)) {
      if (!v->is_number_integer() || v->get<std::int64_t>() < 0 || v->get<std::int64_t>() > 1 << 24)
        return g.wrong_type(k, "a whole number");
      *out = v->get<int>();
    }
  if (auto st = pool.check(); !st.ok()) {
    // "blocks[1]: ..." is the file's "pool[1]: ...".
    std::string m = st.error().message;
    if (m.rfind("blocks", 0) == 0) m = "pool" + m.substr(6);
    auto colon = m.find(": ");
    return g.bad_value(m.substr(0, colon).c_str(), m.substr(colon + 2));
  }
  return g.done();
}

// Every key of the file, read strictly (validation::ConfigMap): the layout
// below is the one coordinator_config.hpp documents.
Status read_keys(const nlohmann::json& doc, const std::string& path, CoordinatorConfig& c) {
  auto top = validation::ConfigMap::open(doc, path);
  if (!top) return top.error();
  // Each list is read left to right (a braced list is sequenced), so done()
  // comes after the reads that make its keys known; the first error wins.
  for (auto st : {top->read("state_dir", c.state_dir), top->read("store", c.store),
                  top->read("external_url", c.external_url), top->read("catalog", c.catalog),
                  top->read("log_level", c.log_level)})
    if (!st.ok()) return st;
  // The value is not repeated: it may hold a password.
  if (!c.store.empty() && c.store.rfind("postgres://", 0) != 0 &&
      c.store.rfind("postgresql://", 0) != 0)
    return top->bad_value("store",
                          "want \"\" (SQLite in state_dir) or a postgres:// URI such as "
                          "postgres://factory@db.example:5432/factory");

  auto agents = top->section("agents");
  if (!agents) return agents.error();
  for (auto st : {agents->read("listen", c.agents_listen), agents->read("binary", c.agent_binary),
                  read_duration(*agents, "idle_timeout", c.agents_idle_timeout),
                  read_duration(*agents, "cert_ttl", c.agent_cert_ttl),
                  read_duration(*agents, "renewal_grace", c.agent_renewal_grace),
                  read_duration(*agents, "upgrade_grace", c.agent_upgrade_grace)})
    if (!st.ok()) return st;
  auto quota = agents->section("quota");
  if (!quota) return quota.error();
  if (auto st = read_quota(*quota, c); !st.ok()) return st;
  if (auto st = agents->done(); !st.ok()) return st;

  auto api = top->section("api");
  if (!api) return api.error();
  for (auto st : {api->read("listen", c.api_listen), api->read("metrics_public", c.metrics_public),
                  read_duration(*api, "events_heartbeat", c.events_heartbeat), api->done()})
    if (!st.ok()) return st;

  auto endpoints = top->section("endpoints");
  if (!endpoints) return endpoints.error();
  for (auto st : {endpoints->read("host", c.endpoints_host), endpoints->done()})
    if (!st.ok()) return st;

  auto tokens = top->section("tokens");
  if (!tokens) return tokens.error();
  for (auto st : {read_duration(*tokens, "default_ttl", c.token_default_ttl),
                  read_duration(*tokens, "tenant_ttl", c.token_tenant_ttl), tokens->done()})
    if (!st.ok()) return st;

  auto kube = top->section("kube");
  if (!kube) return kube.error();
  for (auto st : {kube->read("kubeconfig", c.kube_kubeconfig),
                  kube->read("context", c.kube_context), kube->read("namespace", c.kube_namespace),
                  read_duration(*kube, "request_timeout", c.kube_request_timeout), kube->done()})
    if (!st.ok()) return st;

  if (auto st = top->read("provider", c.provider); !st.ok()) return st;
  if (c.provider != "kubevirt" && c.provider != "qemu")
    return top->bad_value("provider", "want kubevirt or qemu (got " + c.provider + ")");
  auto tenants = top->section("tenants");
  if (!tenants) return tenants.error();
  for (auto st : {tenants->read("source", c.tenants_source), tenants->done()})
    if (!st.ok()) return st;
  if (c.tenants_source != "coordinator" && c.tenants_source != "kubernetes")
    return tenants->bad_value("source",
                              "want coordinator or kubernetes (got " + c.tenants_source + ")");
  if (c.tenants_source == "kubernetes" && c.provider != "kubevirt")
    return tenants->bad_value("source",
                              "kubernetes needs provider: kubevirt (Tenant objects live in the "
                              "host cluster)");
  auto le = top->section("leader_election");
  if (!le) return le.error();
  LeaderElectionSettings& l = c.leader_election;
  for (auto st :
       {le->read("enabled", l.enabled), le->read("lease", l.lease), le->read("namespace", l.ns),
        le->read("identity", l.identity), read_duration(*le, "lease_duration", l.lease_duration),
        read_duration(*le, "renew_deadline", l.renew_deadline),
        read_duration(*le, "retry_period", l.retry_period), le->done()})
    if (!st.ok()) return st;
  if (l.enabled && c.provider != "kubevirt")
    return le->bad_value("enabled", "a Lease needs provider: kubevirt (the host cluster)");
  if (l.retry_period < std::chrono::seconds(1) || l.renew_deadline <= l.retry_period ||
      l.lease_duration <= l.renew_deadline)
    return le->bad_value("lease_duration",
                         "want retry_period >= 1s < renew_deadline < lease_duration (a leader "
                         "must give up before another may take over)");

  auto qemu = top->section("qemu");
  if (!qemu) return qemu.error();
  for (auto st :
       {qemu->read("binary", c.qemu.binary), qemu->read("img", c.qemu.img),
        qemu->read("base_image", c.qemu.base_image), qemu->read("vms_dir", c.qemu.vms_dir),
        qemu->read("accel", c.qemu.accel), qemu->read("supervisor", c.qemu.supervisor),
        qemu->read("ssh_listen", c.qemu.ssh_listen), qemu->done()})
    if (!st.ok()) return st;
  if (c.qemu.accel != "auto" && c.qemu.accel != "kvm" && c.qemu.accel != "tcg")
    return qemu->bad_value("accel", "want auto, kvm or tcg (got " + c.qemu.accel + ")");
  if (c.qemu.supervisor != "auto" && c.qemu.supervisor != "systemd" && c.qemu.supervisor != "child")
    return qemu->bad_value("supervisor",
                           "want auto, systemd or child (got " + c.qemu.supervisor + ")");
  if (c.qemu.binary.empty() || c.qemu.img.empty())
    return qemu->bad_value("binary", "qemu.binary and qemu.img must not be empty");

  auto usage = top->section("usage");
  if (!usage) return usage.error();
  for (auto st : {read_duration(*usage, "observe_every", c.usage_observe_every), usage->done()})
    if (!st.ok()) return st;
  if (c.usage_observe_every < std::chrono::seconds(1) ||
      c.usage_observe_every > std::chrono::minutes(5))
    return usage->bad_value("observe_every", "want 1s to 5m");

  auto quotas = top->section("quotas");
  if (!quotas) return quotas.error();
  if (auto st = read_project_quotas(*quotas, c); !st.ok()) return st;

  auto guest_ranges = top->section("guest_ranges");
  if (!guest_ranges) return guest_ranges.error();
  if (auto st = read_guest_ranges(*guest_ranges, c); !st.ok()) return st;

  auto threads = top->section("threads");
  if (!threads) return threads.error();
  for (auto st : {threads->read("io", c.io_threads, 64),
                  threads->read("workers", c.worker_threads, 64), threads->done()})
    if (!st.ok()) return st;

  return top->done();
}

}  // namespace

std::string CoordinatorConfig::api_url() const {
  auto hp = net::split_host_port(api_listen);
  if (!hp) return "https://127.0.0.1:8444";
  return "https://" + dial_host(hp->first) + ":" + std::to_string(hp->second);
}

std::string CoordinatorConfig::agents_https_url() const {
  std::string u = external_url;
  if (u.rfind("wss://", 0) == 0) return "https://" + u.substr(6);
  return u;
}

Result<CoordinatorConfig> load_coordinator_config(const std::string& path, bool required) {
  CoordinatorConfig c;
  c.source = path;
  nlohmann::json j = nlohmann::json::object();
  if (std::filesystem::exists(path)) {
    auto doc = load_yaml_file(path);
    if (!doc) return doc.error();
    if (!doc->is_null()) j = *doc;
  } else if (required) {
    return Error(Errc::not_found, "config file " + path +
                                      " not found (pass --config FILE, or create it; every key "
                                      "has a default)");
  }
  if (auto st = read_keys(j, path, c); !st.ok()) return st.error();
  if (auto st = check_log_level(c.log_level); !st.ok())
    return st.error().with_context(path + ": log_level");
  if (c.worker_threads == 0)
    return Error(Errc::invalid_argument, path + ": threads.workers must be at least 1");
  for (auto* l : {&c.agents_listen, &c.api_listen}) {
    if (auto hp = net::split_host_port(*l); !hp) return hp.error().with_context(path);
  }
  if (c.external_url.empty()) {
    auto hp = net::split_host_port(c.agents_listen);
    std::string host = hp->first;
    // QEMU's user-mode networking shows the host's addresses (its loopback
    // included) to the guest as 10.0.2.2, whatever the host is called.
    if (c.provider == "qemu")
      host = "10.0.2.2";
    else if (host.empty() || host == "0.0.0.0" || host == "::")
      host = hostname();
    else if (host.find(':') != std::string::npos)
      host = "[" + host + "]";
    c.external_url = "wss://" + host + ":" + std::to_string(hp->second);
  }
  if (c.external_url.rfind("wss://", 0) != 0)
    return Error(Errc::invalid_argument,
                 path + ": external_url must start with wss:// (got " + c.external_url + ")");
  if (!c.kube_kubeconfig.empty() && std::filesystem::path(c.kube_kubeconfig).is_relative())
    c.kube_kubeconfig =
        (std::filesystem::path(path).parent_path() / c.kube_kubeconfig).lexically_normal().string();
  c.qemu.base_image = resolve_against(path, c.qemu.base_image);
  c.qemu.vms_dir = c.qemu.vms_dir.empty() ? (std::filesystem::path(c.state_dir) / "vms").string()
                                          : resolve_against(path, c.qemu.vms_dir);
  // QEMU's hostfwd takes an IPv4 address (its user-mode stack is IPv4).
  if (in_addr a{}; ::inet_pton(AF_INET, c.qemu.ssh_listen.c_str(), &a) != 1)
    return Error(Errc::invalid_argument,
                 path + ": qemu.ssh_listen: want an IPv4 address such as 127.0.0.1 (got " +
                     c.qemu.ssh_listen + ")");
  if (c.kube_namespace.empty())
    return Error(Errc::invalid_argument, path + ": kube.namespace must not be empty");
  if (c.kube_request_timeout < std::chrono::seconds(1))
    return Error(Errc::invalid_argument, path + ": kube.request_timeout must be at least 1s");
  if (c.token_tenant_ttl < std::chrono::minutes(5) ||
      c.token_tenant_ttl > std::chrono::hours(24 * 7))
    return Error(Errc::invalid_argument, path + ": tokens.tenant_ttl must be between 5m and 7d");
  if (c.leader_election.ns.empty()) {
    const char* pod_ns = std::getenv("POD_NAMESPACE");
    c.leader_election.ns = pod_ns && *pod_ns ? pod_ns : c.kube_namespace;
  }
  if (c.leader_election.identity.empty()) {
    const char* pod = std::getenv("POD_NAME");
    c.leader_election.identity =
        pod && *pod ? std::string(pod) : hostname() + "-" + std::to_string(::getpid());
  }
  if (c.io_threads == 0)
    c.io_threads = std::clamp<std::size_t>(std::thread::hardware_concurrency(), 1, 4);
  if (c.agent_cert_ttl < std::chrono::seconds(10))
    return Error(Errc::invalid_argument, path + ": agents.cert_ttl must be at least 10s");
  return c;
}

}  // namespace factory::coordinator
