// Kubeconfig and in-cluster loading, each variant proven by a real request
// to the fake API server (tests/fakes/kube_apiserver.py: real TLS, real
// client-certificate and bearer-token checks) rather than by inspecting
// fields alone.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>

#include "coordinator/kube/client.hpp"
#include "coordinator/kube/kubeconfig.hpp"
#include "tests/fakes/fake_kube.hpp"
#include "tests/support/test_support.hpp"

namespace factory::kube {
namespace {

namespace fs = std::filesystem;
using factory::testing::FakeKube;
using factory::testing::TempDir;

std::string b64(const std::string& in) {
  static const char* t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    unsigned v =
        (unsigned char)in[i] << 16 | (unsigned char)in[i + 1] << 8 | (unsigned char)in[i + 2];
    out += {t[v >> 18], t[(v >> 12) & 63], t[(v >> 6) & 63], t[v & 63]};
  }
  if (i + 1 == in.size()) {
    unsigned v = (unsigned char)in[i] << 16;
    out += {t[v >> 18], t[(v >> 12) & 63], '=', '='};
  } else if (i + 2 == in.size()) {
    unsigned v = (unsigned char)in[i] << 16 | (unsigned char)in[i + 1] << 8;
    out += {t[v >> 18], t[(v >> 12) & 63], t[(v >> 6) & 63], '='};
  }
  return out;
}

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

// The proof that an access works: the fake answers an authenticated GET.
void expect_works(const Result<ClusterAccess>& access) {
  ASSERT_TRUE(access.ok()) << access.error().message;
  KubeClient client(*access);
  auto node = client.get(kNode, "", "utho");
  ASSERT_TRUE(node.ok()) << node.error().message;
  EXPECT_EQ((*node)["metadata"]["name"], "utho");
}

class KubeconfigTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    kube_ = new FakeKube({"--token", "second-token"});
    ASSERT_TRUE(kube_->ok()) << kube_->log();
  }
  static void TearDownTestSuite() {
    delete kube_;
    kube_ = nullptr;
  }
  static FakeKube* kube_;
  TempDir dir_{"kubeconfig"};
};
FakeKube* KubeconfigTest::kube_ = nullptr;

TEST_F(KubeconfigTest, CertificateDataFromTheFakesOwnKubeconfig) {
  auto a = load_kubeconfig(kube_->kubeconfig());
  expect_works(a);
  EXPECT_EQ(a->context, "fake");
  EXPECT_EQ(a->default_namespace, "default");
  EXPECT_TRUE(a->token.empty());
  EXPECT_FALSE(a->tls.client_cert_pem.empty());
}

TEST_F(KubeconfigTest, CertificateFilesRelativeToTheKubeconfig) {
  fs::copy_file(kube_->pki("ca.crt"), dir_ / "ca.crt");
  fs::create_directories(dir_ / "creds");
  fs::copy_file(kube_->pki("admin.crt"), dir_ / "creds/admin.crt");
  fs::copy_file(kube_->pki("admin.key"), dir_ / "creds/admin.key");
  write(dir_ / "config",
        "apiVersion: v1\nkind: Config\ncurrent-context: files\n"
        "clusters:\n- name: c\n  cluster:\n    server: " +
            kube_->url() +
            "/\n    certificate-authority: ca.crt\n"
            "users:\n- name: u\n  user:\n    client-certificate: creds/admin.crt\n"
            "    client-key: " +
            (dir_ / "creds/admin.key").string() +
            "\n"
            "contexts:\n- name: files\n  context:\n    cluster: c\n    user: u\n"
            "    namespace: tenants\n");
  auto a = load_kubeconfig(dir_ / "config");
  expect_works(a);
  EXPECT_EQ(a->server, kube_->url());  // trailing slash dropped
  EXPECT_EQ(a->default_namespace, "tenants");
}

TEST_F(KubeconfigTest, TokenFileIsReadOnEveryRequest) {
  write(dir_ / "token", kube_->token() + "\n");
  ::chmod((dir_ / "token").c_str(), 0600);
  write(dir_ / "config",
        "apiVersion: v1\nkind: Config\ncurrent-context: tok\n"
        "clusters:\n- name: c\n  cluster:\n    server: " +
            kube_->url() + "\n    certificate-authority-data: " + b64(kube_->ca_pem()) +
            "\nusers:\n- name: u\n  user:\n    tokenFile: token\n"
            "contexts:\n- name: tok\n  context: {cluster: c, user: u}\n");
  auto a = load_kubeconfig(dir_ / "config");
  expect_works(a);
  EXPECT_TRUE(a->tls.client_cert_pem.empty());
  EXPECT_EQ(a->token_file, (dir_ / "token").string());

  // Rotated to another valid token: still works. Rotated to a revoked one:
  // the next request says unauthorized (proof the file is read again).
  KubeClient client(*a);
  write(dir_ / "token", "second-token\n");
  EXPECT_TRUE(client.get(kNode, "", "utho").ok());
  write(dir_ / "token", "revoked-token\n");
  auto r = client.get(kNode, "", "utho");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::unauthenticated);
  EXPECT_NE(r.error().message.find("unauthorized"), std::string::npos) << r.error().message;
}

TEST_F(KubeconfigTest, StaticTokenAndNonCurrentContext) {
  int dead = factory::testing::free_loopback_port();
  write(dir_ / "config",
        "apiVersion: v1\nkind: Config\ncurrent-context: prod\n"
        "clusters:\n"
        "- name: prod\n  cluster:\n    server: https://127.0.0.1:" +
            std::to_string(dead) + "\n    certificate-authority-data: " + b64(kube_->ca_pem()) +
            "\n"
            "- name: fake\n  cluster:\n    server: " +
            kube_->url() + "\n    certificate-authority-data: " + b64(kube_->ca_pem()) +
            "\n"
            "users:\n- name: u\n  user:\n    token: " +
            kube_->token() +
            "\n"
            "contexts:\n"
            "- name: prod\n  context: {cluster: prod, user: u}\n"
            "- name: fake\n  context: {cluster: fake, user: u, namespace: kubevirt}\n");
  auto other = load_kubeconfig(dir_ / "config", "fake");
  expect_works(other);
  EXPECT_EQ(other->context, "fake");
  EXPECT_EQ(other->default_namespace, "kubevirt");

  // The current context points at nothing: one clear line naming the server.
  auto current = load_kubeconfig(dir_ / "config");
  ASSERT_TRUE(current.ok()) << current.error().message;
  auto r = KubeClient(*current).get(kNode, "", "utho");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::unavailable);
  EXPECT_EQ(r.error().message,
            "cannot reach the Kubernetes API at https://127.0.0.1:" + std::to_string(dead) +
                ": connection refused (is the kubeconfig's server right?)");
}

TEST_F(KubeconfigTest, InsecureSkipVerifyAndAMissingCa) {
  std::string user = "users:\n- name: u\n  user:\n    token: " + kube_->token() +
                     "\n"
                     "contexts:\n- name: x\n  context: {cluster: c, user: u}\n";
  write(dir_ / "insecure", "current-context: x\nclusters:\n- name: c\n  cluster:\n    server: " +
                               kube_->url() + "\n    insecure-skip-tls-verify: true\n" + user);
  expect_works(load_kubeconfig(dir_ / "insecure"));

  // No CA and no skip: the system store does not know the cluster's CA.
  write(dir_ / "noca", "current-context: x\nclusters:\n- name: c\n  cluster:\n    server: " +
                           kube_->url() + "\n" + user);
  auto a = load_kubeconfig(dir_ / "noca");
  ASSERT_TRUE(a.ok()) << a.error().message;
  auto r = KubeClient(*a).get(kNode, "", "utho");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::unauthenticated);
  EXPECT_EQ(r.error().message.rfind("cannot trust the Kubernetes API at " + kube_->url(), 0), 0u)
      << r.error().message;
}

TEST_F(KubeconfigTest, InClusterServiceAccountUnderARootPrefix) {
  fs::path sa = dir_ / "root/var/run/secrets/kubernetes.io/serviceaccount";
  write(sa / "token", kube_->token());
  write(sa / "ca.crt", kube_->ca_pem());
  write(sa / "namespace", "factory\n");
  AccessEnv env;
  env.service_host = "127.0.0.1";
  env.service_port = std::to_string(kube_->port());
  env.root = dir_ / "root";
  auto a = resolve_access({}, env);
  expect_works(a);
  EXPECT_TRUE(a->in_cluster);
  EXPECT_EQ(a->default_namespace, "factory");
  EXPECT_EQ(a->server, kube_->url());

  // A pod without a mounted token: one line that says what is missing.
  fs::remove(sa / "token");
  auto missing = load_in_cluster(env);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("token"), std::string::npos) << missing.error().message;
}

// The in-cluster root is injected by the caller; the environment, which
// once had a FACTORY_INCLUSTER_ROOT test hook, cannot move it.
TEST_F(KubeconfigTest, InClusterRootComesFromTheCallerNotTheEnvironment) {
  const char* was = std::getenv("KUBERNETES_SERVICE_HOST");
  const std::string host_before = was ? was : "";
  ::setenv("FACTORY_INCLUSTER_ROOT", (dir_ / "elsewhere").c_str(), 1);
  ::setenv("KUBERNETES_SERVICE_HOST", "10.43.0.1", 1);
  AccessEnv plain = AccessEnv::from_process();
  AccessEnv given = AccessEnv::from_process(dir_ / "root");
  ::unsetenv("FACTORY_INCLUSTER_ROOT");
  if (was)
    ::setenv("KUBERNETES_SERVICE_HOST", host_before.c_str(), 1);
  else
    ::unsetenv("KUBERNETES_SERVICE_HOST");
  EXPECT_EQ(plain.root, fs::path("/"));
  EXPECT_EQ(given.root, dir_ / "root");
  EXPECT_EQ(given.service_host, "10.43.0.1");
}

TEST_F(KubeconfigTest, ResolveOrderFollowsKubectl) {
  write(dir_ / "home/.kube/config",
        "current-context: h\nclusters:\n- name: c\n  cluster:\n"
        "    server: https://home.invalid\ncontexts:\n- name: h\n"
        "  context: {cluster: c}\n");
  write(dir_ / "env1",
        "current-context: e\nclusters:\n- name: c\n  cluster:\n"
        "    server: https://env.invalid\ncontexts:\n- name: e\n  context: {cluster: c}\n");
  AccessEnv env;
  env.home = (dir_ / "home").string();
  env.service_host = "10.43.0.1";  // in a pod too: kubeconfig still wins
  env.service_port = "443";
  auto home = resolve_access({}, env);
  ASSERT_TRUE(home.ok()) << home.error().message;
  EXPECT_EQ(home->server, "https://home.invalid");

  env.kubeconfig = (dir_ / "env1").string() + ":" + (dir_ / "home/.kube/config").string();
  auto fromenv = resolve_access({}, env);
  ASSERT_TRUE(fromenv.ok()) << fromenv.error().message;
  EXPECT_EQ(fromenv->server, "https://env.invalid");

  auto flag = resolve_access({.kubeconfig = kube_->kubeconfig()}, env);
  ASSERT_TRUE(flag.ok()) << flag.error().message;
  EXPECT_EQ(flag->server, kube_->url());

  AccessEnv nothing;
  nothing.home = (dir_ / "nohome").string();
  auto none = resolve_access({}, nothing);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().message,
            "no Kubernetes credentials: no --kubeconfig, KUBECONFIG unset, no ~/.kube/config, and "
            "not running in a pod");
}

TEST_F(KubeconfigTest, BrokenKubeconfigsAreOneClearLine) {
  struct Case {
    std::string name, text, context, expect;
  };
  std::string cluster = "clusters:\n- name: c\n  cluster:\n    server: https://x.invalid\n";
  std::vector<Case> cases = {
      {"yaml", "clusters: [\n", "", "invalid YAML at line"},
      {"notkc", "just: text\n", "", "is not a kubeconfig"},
      {"nocurrent", cluster + "contexts:\n- name: a\n  context: {cluster: c}\n", "",
       "has no current-context: pass --context (contexts: a)"},
      {"nocontext", cluster + "current-context: a\ncontexts:\n- name: a\n  context: {cluster: c}\n",
       "b", "has no context \"b\" (contexts: a)"},
      {"nocluster", cluster + "current-context: a\ncontexts:\n- name: a\n  context: {cluster: z}\n",
       "", "names cluster \"z\", which is not in clusters:"},
      {"exec",
       cluster + "current-context: a\ncontexts:\n- name: a\n  context: {cluster: c, user: u}\n"
                 "users:\n- name: u\n  user:\n    exec: {command: aws}\n",
       "", "exec plugin, which factory does not run"},
      {"badb64",
       "current-context: a\ncontexts:\n- name: a\n  context: {cluster: c}\nclusters:\n"
       "- name: c\n  cluster:\n    server: https://x.invalid\n"
       "    certificate-authority-data: '***'\n",
       "", "certificate-authority-data is not valid base64"},
      {"cafile",
       "current-context: a\ncontexts:\n- name: a\n  context: {cluster: c}\nclusters:\n"
       "- name: c\n  cluster:\n    server: https://x.invalid\n"
       "    certificate-authority: missing-ca.crt\n",
       "", "certificate-authority: cannot read"},
      {"keyless",
       cluster +
           "current-context: a\ncontexts:\n- name: a\n  context: {cluster: c, user: u}\n"
           "users:\n- name: u\n  user:\n    client-certificate-data: " +
           b64("x") + "\n",
       "", "client certificate without its key"},
  };
  for (const auto& c : cases) {
    write(dir_ / c.name, c.text);
    auto a = load_kubeconfig(dir_ / c.name, c.context);
    ASSERT_FALSE(a.ok()) << c.name;
    EXPECT_EQ(a.error().code, Errc::invalid_argument) << c.name;
    EXPECT_NE(a.error().message.find(c.expect), std::string::npos)
        << c.name << ": " << a.error().message;
    EXPECT_EQ(a.error().message.find('\n'), std::string::npos) << c.name;
  }
  auto missing = load_kubeconfig(dir_ / "does-not-exist");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().message,
            "kubeconfig " + (dir_ / "does-not-exist").string() +
                " does not exist (pass --kubeconfig FILE or set KUBECONFIG)");
}

}  // namespace
}  // namespace factory::kube
