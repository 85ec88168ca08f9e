#pragma once
// Where the Kubernetes API is and how to prove who we are: from a kubeconfig
// (as kubectl finds it) or from the pod's service account. Factory never
// shells out to kubectl, so it reads the same sources kubectl does.
#include <filesystem>
#include <string>

#include "common/error.hpp"
#include "common/net/http_client.hpp"

namespace factory::kube {

struct ClusterAccess {
  std::string server;         // "https://10.0.0.1:6443", no trailing slash
  net::TlsClientOptions tls;  // CA, client certificate, insecure-skip-tls-verify
  std::string token;          // a static bearer token (kubeconfig `token`)
  std::string token_file;     // read on every request: service-account tokens rotate
  std::string default_namespace = "default";
  std::string context;  // kubeconfig context name, or "in-cluster"
  std::string source;   // for messages: "kubeconfig /root/.kube/config"
  bool in_cluster = false;
};

// What the process environment contributes. Tests fill one in by hand, so no
// test has to touch the real environment or /var/run/secrets.
struct AccessEnv {
  std::string kubeconfig;    // $KUBECONFIG (a colon list)
  std::string home;          // $HOME, for ~/.kube/config
  std::string service_host;  // $KUBERNETES_SERVICE_HOST
  std::string service_port;  // $KUBERNETES_SERVICE_PORT
  // Prefix for /var/run/secrets/kubernetes.io/serviceaccount: the caller's
  // to give (a test's own tree), never read from the environment, so no
  // variable can point a running coordinator at another service account.
  std::filesystem::path root = "/";

  // The four variables above from this process; the in-cluster root as given.
  static AccessEnv from_process(std::filesystem::path in_cluster_root = "/");
};

inline constexpr const char* kServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount";

// One kubeconfig file; context empty means its current-context. Relative
// certificate / key / token file paths are relative to the file's directory.
Result<ClusterAccess> load_kubeconfig(const std::filesystem::path& file,
                                      const std::string& context = "");

// The pod's service account: KUBERNETES_SERVICE_HOST/PORT, and token, ca.crt,
// namespace under <root>/var/run/secrets/kubernetes.io/serviceaccount.
Result<ClusterAccess> load_in_cluster(const AccessEnv& env);

// kubectl's order: --kubeconfig, then $KUBECONFIG (its first file; kubectl
// merges the list, we do not), then ~/.kube/config if it exists, then the
// in-cluster service account when running in a pod. --context picks a
// context other than the current one (kubeconfig only).
struct AccessOptions {
  std::string kubeconfig;  // --kubeconfig
  std::string context;     // --context
};
Result<ClusterAccess> resolve_access(const AccessOptions& opts,
                                     const AccessEnv& env = AccessEnv::from_process());

// The bearer token to send now (static, or read fresh from token_file);
// empty when the access uses a client certificate only.
Result<std::string> current_token(const ClusterAccess& access);

}  // namespace factory::kube
