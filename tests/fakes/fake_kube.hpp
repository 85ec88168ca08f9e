#pragma once
// Starts tests/fakes/kube_apiserver.py (the fake Kubernetes API server with a
// fake KubeVirt, see its header for what it stands in for) on 127.0.0.1 for
// one test, and gives the test what it needs to talk to it: the URL, the PKI
// it wrote (CA, admin client certificate, token), ready-made kubeconfigs and
// its test-control endpoints.
//
//   factory::testing::FakeKube kube({"--vfio-cards", "10DE:27B8=2"});
//   ASSERT_TRUE(kube.ok()) << kube.log();
//   run({factory_bin(), "kubevirt", "allowlist", "--kubeconfig", kube.kubeconfig()});
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/net/http_client.hpp"
#include "tests/support/test_support.hpp"

namespace factory::testing {

class FakeKube {
 public:
  explicit FakeKube(const std::vector<std::string>& extra_args = {}) : dir_("fake-kube") {
    auto port_file = dir_ / "port";
    std::vector<std::string> argv{
        "/usr/bin/python3", (source_dir() / "tests" / "fakes" / "kube_apiserver.py").string(),
        "--pki-dir",        (dir_ / "pki").string(),
        "--port-file",      port_file.string()};
    argv.insert(argv.end(), extra_args.begin(), extra_args.end());
    proc_ = Process(argv, dir_ / "apiserver.log");
    // Up when it wrote its port; given up on as soon as it exited. A fake
    // that is not there fails the test here, with its log (SetupFailed).
    ok_ = eventually([&] { return std::filesystem::exists(port_file) || !proc_.running(); },
                     std::chrono::seconds(20), std::chrono::milliseconds(20)) &&
          std::filesystem::exists(port_file);
    if (!ok_) setup_failed("the Kubernetes API test double did not start:\n" + proc_.log());
    port_ = std::stoi(slurp(port_file));
  }

  // Always true once constructed (a fake that did not start ends the test).
  bool ok() const { return ok_; }
  std::string log() const { return proc_.log(); }
  int port() const { return port_; }
  // Its process, for a test that stops it (SIGSTOP) as a hung API server.
  int pid() const { return proc_.pid(); }
  std::string url() const { return "https://127.0.0.1:" + std::to_string(port_); }
  const TempDir& dir() const { return dir_; }
  std::filesystem::path pki(const std::string& file) const { return dir_ / ("pki/" + file); }
  // Cluster CA data + the admin client certificate as data (written by the fake).
  std::string kubeconfig() const { return pki("kubeconfig").string(); }
  std::string token() const {
    std::string t = slurp(pki("token"));
    while (!t.empty() && (t.back() == '\n' || t.back() == '\r')) t.pop_back();
    return t;
  }
  std::string ca_pem() const { return slurp(pki("ca.crt")); }

  // POST (or DELETE) to a /_fake/ test-control endpoint; returns the body.
  nlohmann::json control(const std::string& path,
                         const nlohmann::json& body = nlohmann::json::object(),
                         const std::string& method = "POST") const {
    net::HttpClient c({.ca_pem = ca_pem()});
    net::HttpRequest req;
    req.method = method;
    req.url = url() + path;
    req.body = body.dump();
    req.headers["Content-Type"] = "application/json";
    auto r = c.request(req);
    if (!r || r->status != 200) return nullptr;
    return nlohmann::json::parse(r->body, nullptr, false);
  }

  // A raw authenticated GET, bypassing the client under test.
  nlohmann::json get(const std::string& path) const {
    net::HttpClient c({.ca_pem = ca_pem()});
    net::HttpRequest req;
    req.url = url() + path;
    req.headers["Authorization"] = "Bearer " + token();
    auto r = c.request(req);
    if (!r) return nullptr;
    return nlohmann::json::parse(r->body, nullptr, false);
  }

  // A raw authenticated POST of an object (what `kubectl create -f` does);
  // the API server's answer: the object made, or its Status.
  nlohmann::json post(const std::string& path, const nlohmann::json& object) const {
    net::HttpClient c({.ca_pem = ca_pem()});
    net::HttpRequest req;
    req.method = "POST";
    req.url = url() + path;
    req.body = object.dump();
    req.headers["Authorization"] = "Bearer " + token();
    req.headers["Content-Type"] = "application/json";
    auto r = c.request(req);
    if (!r) return nullptr;
    return nlohmann::json::parse(r->body, nullptr, false);
  }

  // A raw authenticated DELETE (what `kubectl delete` does); the answer.
  nlohmann::json remove(const std::string& path) const {
    net::HttpClient c({.ca_pem = ca_pem()});
    net::HttpRequest req;
    req.method = "DELETE";
    req.url = url() + path;
    req.headers["Authorization"] = "Bearer " + token();
    auto r = c.request(req);
    if (!r) return nullptr;
    return nlohmann::json::parse(r->body, nullptr, false);
  }

  // Every request the double has seen (its last 2000), oldest first:
  // {"method", "path", "user", "contentType"}.
  nlohmann::json requests() const {
    nlohmann::json r = control("/_fake/requests", nlohmann::json::object(), "GET");
    return r.is_object() ? r.value("requests", nlohmann::json::array()) : nlohmann::json::array();
  }

  // A raw authenticated JSON merge patch (what an admin's kubectl patch does).
  nlohmann::json merge_patch(const std::string& path, const nlohmann::json& patch) const {
    net::HttpClient c({.ca_pem = ca_pem()});
    net::HttpRequest req;
    req.method = "PATCH";
    req.url = url() + path;
    req.body = patch.dump();
    req.headers["Authorization"] = "Bearer " + token();
    req.headers["Content-Type"] = "application/merge-patch+json";
    auto r = c.request(req);
    if (!r) return nullptr;
    return nlohmann::json::parse(r->body, nullptr, false);
  }

 private:
  TempDir dir_;
  Process proc_;
  bool ok_ = false;
  int port_ = 0;
};

}  // namespace factory::testing
