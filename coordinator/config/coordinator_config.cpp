#include "coordinator/config/coordinator_config.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <set>
#include <thread>

#include "common/durations.hpp"
#include "common/net/server.hpp"
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

Status read_duration(const nlohmann::json& j, const char* key, std::chrono::seconds& out,
                     const std::string& where) {
  if (!j.contains(key)) return {};
  if (!j[key].is_string())
    return Error(Errc::invalid_argument, where + "." + key + ": want a duration like 90s, 1h");
  auto d = parse_duration(j[key].get<std::string>());
  if (!d) return d.error().with_context(where + "." + key);
  out = *d;
  return {};
}

const std::set<std::string> kTopKeys = {"state_dir", "external_url", "agents",
                                        "api",       "tokens",       "kube",
                                        "threads",   "catalog",      "log_level"};
const std::set<std::string> kAgentsKeys = {"listen", "idle_timeout", "cert_ttl", "renewal_grace",
                                           "binary", "quota"};
const std::set<std::string> kQuotaKeys = {"events_per_second", "event_burst", "bytes_per_day",
                                          "max_events_stored", "max_event_age"};
const std::set<std::string> kApiKeys = {"listen", "metrics_public"};

std::string known_list(const std::set<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) out += (out.empty() ? "" : ", ") + k;
  return out;
}

Status only_keys(const nlohmann::json& j, const std::set<std::string>& keys,
                 const std::string& where) {
  if (!j.is_object()) return Error(Errc::invalid_argument, where + ": want a mapping");
  for (auto& [k, v] : j.items())
    if (!keys.count(k))
      return Error(Errc::invalid_argument,
                   "unknown key '" + where + "." + k + "' (known: " + known_list(keys) + ")");
  return {};
}

// A positive number within [lo, hi] (YAML gives integers or floats).
Status read_number(const nlohmann::json& j, const char* key, double lo, double hi, double& out,
                   const std::string& where) {
  if (!j.contains(key)) return {};
  const auto& v = j[key];
  if (!v.is_number() || v.get<double>() < lo || v.get<double>() > hi)
    return Error(Errc::invalid_argument, where + "." + key + ": want a number from " +
                                             std::to_string(static_cast<long long>(lo)) + " to " +
                                             std::to_string(static_cast<long long>(hi)));
  out = v.get<double>();
  return {};
}

// A byte count: a whole number, or one with a binary suffix (Ki, Mi, Gi).
Result<std::uint64_t> parse_bytes(const nlohmann::json& v, const std::string& where) {
  auto bad = [&] {
    return Error(Errc::invalid_argument,
                 where + ": want a byte count like 33554432, 512Ki, 32Mi or 1Gi");
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

const std::set<std::string> kKubeKeys = {"kubeconfig", "context", "namespace", "request_timeout"};

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
  if (!j.is_object()) return Error(Errc::invalid_argument, path + ": want a YAML mapping");
  for (auto& [k, v] : j.items()) {
    if (!kTopKeys.count(k))
      return Error(Errc::invalid_argument,
                   path + ": unknown key '" + k +
                       "' (known: state_dir, external_url, agents, api, tokens, kube, threads, "
                       "catalog, log_level)");
  }
  try {
    if (j.contains("state_dir")) c.state_dir = j["state_dir"].get<std::string>();
    if (j.contains("external_url")) c.external_url = j["external_url"].get<std::string>();
    if (j.contains("log_level")) c.log_level = j["log_level"].get<std::string>();
    if (j.contains("agents") && !j["agents"].is_null()) {
      const auto& a = j["agents"];
      if (auto st = only_keys(a, kAgentsKeys, "agents"); !st.ok())
        return st.error().with_context(path);
      if (a.contains("listen")) c.agents_listen = a["listen"].get<std::string>();
      if (a.contains("binary")) c.agent_binary = a["binary"].get<std::string>();
      if (auto st = read_duration(a, "idle_timeout", c.agents_idle_timeout, "agents"); !st.ok())
        return st.error().with_context(path);
      if (auto st = read_duration(a, "cert_ttl", c.agent_cert_ttl, "agents"); !st.ok())
        return st.error().with_context(path);
      if (auto st = read_duration(a, "renewal_grace", c.agent_renewal_grace, "agents"); !st.ok())
        return st.error().with_context(path);
      if (a.contains("quota") && !a["quota"].is_null()) {
        const auto& q = a["quota"];
        const std::string w = "agents.quota";
        if (auto st = only_keys(q, kQuotaKeys, w); !st.ok()) return st.error().with_context(path);
        if (auto st = read_number(q, "events_per_second", 1, 1e6, c.quota_events_per_second, w);
            !st.ok())
          return st.error().with_context(path);
        if (auto st = read_number(q, "event_burst", 1, 1e7, c.quota_event_burst, w); !st.ok())
          return st.error().with_context(path);
        if (q.contains("bytes_per_day")) {
          auto b = parse_bytes(q["bytes_per_day"], w + ".bytes_per_day");
          if (!b) return b.error().with_context(path);
          // Below a few full-size frames a tenant could be left unable to
          // send one event, ever.
          if (*b < (1u << 20))
            return Error(Errc::invalid_argument,
                         path + ": agents.quota.bytes_per_day must be at least 1Mi");
          c.quota_bytes_per_day = *b;
        }
        if (q.contains("max_events_stored")) {
          const auto& m = q["max_events_stored"];
          // YAML integers come as signed numbers.
          if (!m.is_number_integer() || m.get<std::int64_t>() < 1 ||
              m.get<std::int64_t>() > 100'000'000)
            return Error(Errc::invalid_argument,
                         path +
                             ": agents.quota.max_events_stored: want a whole number from 1 to "
                             "100000000");
          c.quota_max_events_stored = static_cast<std::size_t>(m.get<std::int64_t>());
        }
        if (auto st = read_duration(q, "max_event_age", c.quota_max_event_age, w); !st.ok())
          return st.error().with_context(path);
        if (c.quota_max_event_age < std::chrono::hours(1))
          return Error(Errc::invalid_argument,
                       path + ": agents.quota.max_event_age must be at least 1h");
      }
    }
    if (j.contains("api") && !j["api"].is_null()) {
      const auto& a = j["api"];
      if (auto st = only_keys(a, kApiKeys, "api"); !st.ok()) return st.error().with_context(path);
      if (a.contains("listen")) c.api_listen = a["listen"].get<std::string>();
      if (a.contains("metrics_public")) {
        if (!a["metrics_public"].is_boolean())
          return Error(Errc::invalid_argument, path + ": api.metrics_public: want true or false");
        c.metrics_public = a["metrics_public"].get<bool>();
      }
    }
    if (j.contains("tokens")) {
      if (auto st = read_duration(j["tokens"], "default_ttl", c.token_default_ttl, "tokens");
          !st.ok())
        return st.error().with_context(path);
      if (auto st = read_duration(j["tokens"], "tenant_ttl", c.token_tenant_ttl, "tokens");
          !st.ok())
        return st.error().with_context(path);
    }
    if (j.contains("threads") && !j["threads"].is_null()) {
      const auto& t = j["threads"];
      if (!t.is_object()) return Error(Errc::invalid_argument, path + ": threads: want a mapping");
      for (auto& [key, v] : t.items()) {
        if (key != "io" && key != "workers")
          return Error(Errc::invalid_argument,
                       path + ": unknown key 'threads." + key + "' (known: io, workers)");
        if (!v.is_number_unsigned() || v.get<std::uint64_t>() > 64)
          return Error(Errc::invalid_argument,
                       path + ": threads." + key + ": want a whole number from 0 to 64");
      }
      if (t.contains("io")) c.io_threads = t["io"].get<std::size_t>();
      if (t.contains("workers")) c.worker_threads = t["workers"].get<std::size_t>();
      if (c.worker_threads == 0)
        return Error(Errc::invalid_argument, path + ": threads.workers must be at least 1");
    }
    if (j.contains("catalog") && !j["catalog"].is_null())
      c.catalog = j["catalog"].get<std::string>();
    if (j.contains("kube") && !j["kube"].is_null()) {
      const auto& k = j["kube"];
      if (!k.is_object()) return Error(Errc::invalid_argument, path + ": kube: want a mapping");
      for (auto& [key, v] : k.items())
        if (!kKubeKeys.count(key))
          return Error(Errc::invalid_argument,
                       path + ": unknown key 'kube." + key +
                           "' (known: kubeconfig, context, namespace, request_timeout)");
      if (k.contains("kubeconfig")) c.kube_kubeconfig = k["kubeconfig"].get<std::string>();
      if (k.contains("context")) c.kube_context = k["context"].get<std::string>();
      if (k.contains("namespace")) c.kube_namespace = k["namespace"].get<std::string>();
      if (auto st = read_duration(k, "request_timeout", c.kube_request_timeout, "kube"); !st.ok())
        return st.error().with_context(path);
    }
  } catch (const nlohmann::json::exception& e) {
    return Error(Errc::invalid_argument, path + ": wrong type for a key: " + e.what());
  }
  for (auto* l : {&c.agents_listen, &c.api_listen}) {
    if (auto hp = net::split_host_port(*l); !hp) return hp.error().with_context(path);
  }
  if (c.external_url.empty()) {
    auto hp = net::split_host_port(c.agents_listen);
    std::string host = hp->first;
    if (host.empty() || host == "0.0.0.0" || host == "::")
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
  if (c.kube_namespace.empty())
    return Error(Errc::invalid_argument, path + ": kube.namespace must not be empty");
  if (c.kube_request_timeout < std::chrono::seconds(1))
    return Error(Errc::invalid_argument, path + ": kube.request_timeout must be at least 1s");
  if (c.token_tenant_ttl < std::chrono::minutes(5) ||
      c.token_tenant_ttl > std::chrono::hours(24 * 7))
    return Error(Errc::invalid_argument, path + ": tokens.tenant_ttl must be between 5m and 7d");
  if (c.io_threads == 0)
    c.io_threads = std::clamp<std::size_t>(std::thread::hardware_concurrency(), 1, 4);
  if (c.agent_cert_ttl < std::chrono::seconds(10))
    return Error(Errc::invalid_argument, path + ": agents.cert_ttl must be at least 10s");
  return c;
}

}  // namespace factory::coordinator
