#include "coordinator/kube/kubeconfig.hpp"

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "common/atomic_file.hpp"
#include "common/yaml_json.hpp"

namespace factory::kube {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// kubeconfig *-data fields are standard base64 (possibly wrapped).
Result<std::string> base64_decode(const std::string& in, const std::string& what) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  unsigned acc = 0;
  int bits = 0;
  bool padding = false;
  for (char c : in) {
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    if (c == '=') {
      padding = true;
      continue;
    }
    int v = value(c);
    if (v < 0 || padding) return Error(Errc::invalid_argument, what + " is not valid base64");
    acc = (acc << 6) | static_cast<unsigned>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  return out;
}

std::string names_of(const json& list) {
  std::string out;
  if (!list.is_array()) return out;
  for (const auto& e : list) {
    if (!e.contains("name") || !e["name"].is_string()) continue;
    if (!out.empty()) out += ", ";
    out += e["name"].get<std::string>();
  }
  return out.empty() ? "none" : out;
}

std::string str(const json& obj, const char* key) {
  if (!obj.is_object() || !obj.contains(key) || !obj[key].is_string()) return "";
  return obj[key].get<std::string>();
}

// An entry whose name is not a string (`name: ` left empty reads as null)
// is no match, never an exception (the kubeconfig fuzz target found it).
const json* find_named(const json& doc, const char* list, const std::string& name) {
  if (!doc.contains(list) || !doc[list].is_array()) return nullptr;
  for (const auto& e : doc[list])
    if (e.is_object() && e.contains("name") && e["name"].is_string() && str(e, "name") == name)
      return &e;
  return nullptr;
}

// "*-data" inline (base64) or a file path (relative to the kubeconfig's dir).
Result<std::string> data_or_file(const json& obj, const std::string& key, const fs::path& base,
                                 const std::string& where) {
  std::string data = str(obj, (key + "-data").c_str());
  if (!data.empty()) return base64_decode(data, where + " " + key + "-data");
  std::string file = str(obj, key.c_str());
  if (file.empty()) return std::string();
  fs::path p = fs::path(file).is_absolute() ? fs::path(file) : base / file;
  auto text = read_file(p);
  if (!text)
    return Error(Errc::invalid_argument,
                 where + " " + key + ": cannot read " + p.string() + ": " + text.error().message);
  return *text;
}

std::string trim(std::string s) {
  while (!s.empty() &&
         (s.back() == '\n' || s.back() == '\r' || s.back() == ' ' || s.back() == '\t'))
    s.pop_back();
  size_t i = 0;
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n')) ++i;
  return s.substr(i);
}

std::string getenv_str(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

AccessEnv AccessEnv::from_process(std::filesystem::path in_cluster_root) {
  AccessEnv env;
  env.root = std::move(in_cluster_root);
  env.kubeconfig = getenv_str("KUBECONFIG");
  env.home = getenv_str("HOME");
  env.service_host = getenv_str("KUBERNETES_SERVICE_HOST");
  env.service_port = getenv_str("KUBERNETES_SERVICE_PORT");
  return env;
}

Result<ClusterAccess> load_kubeconfig(const fs::path& file, const std::string& context) {
  const std::string where = "kubeconfig " + file.string();
  std::error_code ec;
  if (!fs::exists(file, ec))
    return Error(Errc::invalid_argument,
                 where + " does not exist (pass --kubeconfig FILE or set KUBECONFIG)");
  auto text = read_file(file);
  if (!text) return Error(Errc::invalid_argument, where + ": " + text.error().message);
  auto doc = parse_yaml(*text, where);
  if (!doc) return doc.error();
  if (!doc->is_object() || !doc->contains("clusters"))
    return Error(Errc::invalid_argument, where + " is not a kubeconfig (no clusters: section)");

  std::string ctx_name = context.empty() ? str(*doc, "current-context") : context;
  if (ctx_name.empty())
    return Error(Errc::invalid_argument, where +
                                             " has no current-context: pass --context (contexts: " +
                                             names_of(doc->value("contexts", json())) + ")");
  const json* ctx = find_named(*doc, "contexts", ctx_name);
  if (!ctx)
    return Error(Errc::invalid_argument,
                 where + " has no context \"" + ctx_name +
                     "\" (contexts: " + names_of(doc->value("contexts", json())) + ")");
  const json& c = ctx->value("context", json::object());
  std::string cluster_name = str(c, "cluster");
  std::string user_name = str(c, "user");

  const json* cluster_entry = find_named(*doc, "clusters", cluster_name);
  if (!cluster_entry)
    return Error(Errc::invalid_argument, where + ": context \"" + ctx_name + "\" names cluster \"" +
                                             cluster_name + "\", which is not in clusters:");
  const json& cluster = cluster_entry->value("cluster", json::object());
  fs::path base = file.parent_path();

  ClusterAccess a;
  a.context = ctx_name;
  a.source = where;
  a.server = str(cluster, "server");
  while (!a.server.empty() && a.server.back() == '/') a.server.pop_back();
  if (a.server.empty())
    return Error(Errc::invalid_argument,
                 where + ": cluster \"" + cluster_name + "\" has no server: address");
  if (!a.server.starts_with("https://") && !a.server.starts_with("http://"))
    return Error(Errc::invalid_argument, where + ": cluster \"" + cluster_name + "\" server \"" +
                                             a.server + "\" is not an http(s) URL");
  if (cluster.contains("proxy-url"))
    return Error(Errc::invalid_argument,
                 where + ": cluster \"" + cluster_name +
                     "\" uses proxy-url, which factory does not support: reach the API directly");
  auto ca = data_or_file(cluster, "certificate-authority", base,
                         where + ": cluster \"" + cluster_name + "\"");
  if (!ca) return ca.error();
  a.tls.ca_pem = *ca;
  // Only a YAML true turns verification off (a string "true" is not one, and
  // reading it as a bool would throw).
  a.tls.insecure_skip_verify = cluster.is_object() &&
                               cluster.contains("insecure-skip-tls-verify") &&
                               cluster["insecure-skip-tls-verify"] == true;
  a.tls.server_name = str(cluster, "tls-server-name");
  if (auto ns = str(c, "namespace"); !ns.empty()) a.default_namespace = ns;

  if (user_name.empty()) return a;  // anonymous: allowed, the server decides
  const json* user_entry = find_named(*doc, "users", user_name);
  if (!user_entry)
    return Error(Errc::invalid_argument, where + ": context \"" + ctx_name + "\" names user \"" +
                                             user_name + "\", which is not in users:");
  const json& user = user_entry->value("user", json::object());
  const std::string uwhere = where + ": user \"" + user_name + "\"";
  if (user.contains("exec"))
    return Error(Errc::invalid_argument,
                 uwhere +
                     " gets its credentials from an exec plugin, which factory does not run: "
                     "give it a kubeconfig with a token or a client certificate");
  if (user.contains("auth-provider"))
    return Error(Errc::invalid_argument,
                 uwhere +
                     " uses an auth-provider, which factory does not support: "
                     "give it a kubeconfig with a token or a client certificate");
  if (user.contains("username") || user.contains("password"))
    return Error(Errc::invalid_argument,
                 uwhere +
                     " uses basic auth (username/password), which Kubernetes no longer "
                     "accepts: use a token or a client certificate");
  auto cert = data_or_file(user, "client-certificate", base, uwhere);
  if (!cert) return cert.error();
  auto key = data_or_file(user, "client-key", base, uwhere);
  if (!key) return key.error();
  if (cert->empty() != key->empty())
    return Error(Errc::invalid_argument,
                 uwhere +
                     " has a client certificate without its key (or a key without its "
                     "certificate)");
  a.tls.client_cert_pem = *cert;
  a.tls.client_key_pem = *key;
  a.token = str(user, "token");
  if (auto tf = str(user, "tokenFile"); !tf.empty() && a.token.empty()) {
    fs::path p = fs::path(tf).is_absolute() ? fs::path(tf) : base / tf;
    a.token_file = p.string();
    // Read once now so a wrong path is reported at load time, not at the
    // first request.
    auto t = current_token(a);
    if (!t) return Error(Errc::invalid_argument, uwhere + " tokenFile: " + t.error().message);
  }
  return a;
}

Result<ClusterAccess> load_in_cluster(const AccessEnv& env) {
  if (env.service_host.empty() || env.service_port.empty())
    return Error(Errc::failed_precondition,
                 "not running in a pod (KUBERNETES_SERVICE_HOST/PORT unset): pass --kubeconfig");
  fs::path dir = env.root / fs::path(kServiceAccountDir).relative_path();
  ClusterAccess a;
  a.in_cluster = true;
  a.context = "in-cluster";
  a.source = "the pod's service account (" + dir.string() + ")";
  std::string host = env.service_host;
  if (host.find(':') != std::string::npos) host = "[" + host + "]";  // IPv6 service IP
  a.server = "https://" + host + ":" + env.service_port;
  auto ca = read_file(dir / "ca.crt");
  if (!ca)
    return Error(Errc::failed_precondition, "in-cluster: cannot read " + (dir / "ca.crt").string() +
                                                ": " + ca.error().message +
                                                " (is a service account token mounted?)");
  a.tls.ca_pem = *ca;
  a.token_file = (dir / "token").string();
  auto t = current_token(a);
  if (!t)
    return Error(Errc::failed_precondition,
                 "in-cluster: " + t.error().message + " (is automountServiceAccountToken off?)");
  if (auto ns = read_file(dir / "namespace"); ns && !trim(*ns).empty())
    a.default_namespace = trim(*ns);
  return a;
}

Result<ClusterAccess> resolve_access(const AccessOptions& opts, const AccessEnv& env) {
  if (!opts.kubeconfig.empty()) return load_kubeconfig(opts.kubeconfig, opts.context);
  if (!env.kubeconfig.empty()) {
    std::string first = env.kubeconfig.substr(0, env.kubeconfig.find(':'));
    if (!first.empty()) {
      auto r = load_kubeconfig(first, opts.context);
      if (!r) r.error().context("KUBECONFIG");
      return r;
    }
  }
  if (!env.home.empty()) {
    fs::path def = fs::path(env.home) / ".kube" / "config";
    std::error_code ec;
    if (fs::exists(def, ec)) return load_kubeconfig(def, opts.context);
  }
  if (!env.service_host.empty()) {
    if (!opts.context.empty())
      return Error(Errc::invalid_argument,
                   "--context " + opts.context + " needs a kubeconfig, and none was found");
    return load_in_cluster(env);
  }
  return Error(Errc::invalid_argument,
               "no Kubernetes credentials: no --kubeconfig, KUBECONFIG unset, no ~/.kube/config, "
               "and not running in a pod");
}

Result<std::string> current_token(const ClusterAccess& access) {
  if (!access.token.empty()) return access.token;
  if (access.token_file.empty()) return std::string();
  auto t = read_file(access.token_file);
  if (!t)
    return Error(Errc::unauthenticated,
                 "cannot read the token file " + access.token_file + ": " + t.error().message);
  std::string token = trim(*t);
  if (token.empty())
    return Error(Errc::unauthenticated, "the token file " + access.token_file + " is empty");
  return token;
}

}  // namespace factory::kube
