#include "coordinator/config/coordinator_config.hpp"

#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
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

const std::set<std::string> kTopKeys = {"state_dir", "external_url", "agents",   "api",
                                        "tokens",    "kube",         "provider", "qemu",
                                        "threads",   "catalog",      "log_level"};
const std::set<std::string> kKubeKeys = {"kubeconfig", "context", "namespace", "request_timeout"};
const std::set<std::string> kQemuKeys = {"binary", "img",        "base_image", "vms_dir",
                                         "accel",  "supervisor", "ssh_listen"};

std::string resolve_against(const std::string& config_path, const std::string& p) {
  if (p.empty() || std::filesystem::path(p).is_absolute()) return p;
  return (std::filesystem::path(config_path).parent_path() / p).lexically_normal().string();
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
  if (!j.is_object()) return Error(Errc::invalid_argument, path + ": want a YAML mapping");
  for (auto& [k, v] : j.items()) {
    if (!kTopKeys.count(k))
      return Error(Errc::invalid_argument,
                   path + ": unknown key '" + k +
                       "' (known: state_dir, external_url, agents, api, tokens, kube, provider, "
                       "qemu, threads, catalog, log_level)");
  }
  try {
    if (j.contains("state_dir")) c.state_dir = j["state_dir"].get<std::string>();
    if (j.contains("external_url")) c.external_url = j["external_url"].get<std::string>();
    if (j.contains("log_level")) c.log_level = j["log_level"].get<std::string>();
    if (j.contains("agents")) {
      const auto& a = j["agents"];
      if (a.contains("listen")) c.agents_listen = a["listen"].get<std::string>();
      if (a.contains("binary")) c.agent_binary = a["binary"].get<std::string>();
      if (auto st = read_duration(a, "idle_timeout", c.agents_idle_timeout, "agents"); !st.ok())
        return st.error().with_context(path);
      if (auto st = read_duration(a, "cert_ttl", c.agent_cert_ttl, "agents"); !st.ok())
        return st.error().with_context(path);
    }
    if (j.contains("api") && j["api"].contains("listen"))
      c.api_listen = j["api"]["listen"].get<std::string>();
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
    if (j.contains("provider")) c.provider = j["provider"].get<std::string>();
    if (c.provider != "kubevirt" && c.provider != "qemu")
      return Error(Errc::invalid_argument,
                   path + ": provider: want kubevirt or qemu (got " + c.provider + ")");
    if (j.contains("qemu") && !j["qemu"].is_null()) {
      const auto& q = j["qemu"];
      if (!q.is_object()) return Error(Errc::invalid_argument, path + ": qemu: want a mapping");
      for (auto& [key, v] : q.items())
        if (!kQemuKeys.count(key))
          return Error(Errc::invalid_argument,
                       path + ": unknown key 'qemu." + key +
                           "' (known: binary, img, base_image, vms_dir, accel, supervisor, "
                           "ssh_listen)");
      const std::pair<const char*, std::string*> strings[] = {
          {"binary", &c.qemu.binary},         {"img", &c.qemu.img},
          {"base_image", &c.qemu.base_image}, {"vms_dir", &c.qemu.vms_dir},
          {"accel", &c.qemu.accel},           {"supervisor", &c.qemu.supervisor},
          {"ssh_listen", &c.qemu.ssh_listen}};
      for (auto [key, out] : strings)
        if (q.contains(key)) *out = q[key].get<std::string>();
      if (c.qemu.accel != "auto" && c.qemu.accel != "kvm" && c.qemu.accel != "tcg")
        return Error(Errc::invalid_argument,
                     path + ": qemu.accel: want auto, kvm or tcg (got " + c.qemu.accel + ")");
      if (c.qemu.supervisor != "auto" && c.qemu.supervisor != "systemd" &&
          c.qemu.supervisor != "child")
        return Error(Errc::invalid_argument, path +
                                                 ": qemu.supervisor: want auto, systemd or child "
                                                 "(got " +
                                                 c.qemu.supervisor + ")");
      if (c.qemu.binary.empty() || c.qemu.img.empty())
        return Error(Errc::invalid_argument, path + ": qemu.binary and qemu.img must not be empty");
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
  if (c.io_threads == 0)
    c.io_threads = std::clamp<std::size_t>(std::thread::hardware_concurrency(), 1, 4);
  if (c.agent_cert_ttl < std::chrono::seconds(10))
    return Error(Errc::invalid_argument, path + ": agents.cert_ttl must be at least 10s");
  return c;
}

}  // namespace factory::coordinator
