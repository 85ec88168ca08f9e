#pragma once
// What the tenant integration tests share: a fake cluster with the runbook
// host's two L4s on vfio-pci, a real `factory serve` configured for it, and
// checks on what the cluster holds. See tenants_test.cpp for what the fake
// stands in for.
#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <memory>
#include <sstream>

#include "common/yaml_json.hpp"
#include "tests/coordinator/tenant_test_data.hpp"
#include "tests/fakes/fake_kube.hpp"
#include "tests/support/coordinator_harness.hpp"

namespace factory::testing {

using factory::CommandResult;
using nlohmann::json;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr const char* kL4 = "nvidia.com/AD104GL_L4";

// Every namespaced kind the fake serves, as REST collections in `ns`.
inline std::vector<std::string> namespaced_collections(const std::string& ns) {
  return {"/api/v1/namespaces/" + ns + "/secrets",
          "/api/v1/namespaces/" + ns + "/services",
          "/api/v1/namespaces/" + ns + "/configmaps",
          "/api/v1/namespaces/" + ns + "/persistentvolumeclaims",
          "/api/v1/namespaces/" + ns + "/pods",
          "/apis/coordination.k8s.io/v1/namespaces/" + ns + "/leases",
          "/apis/kubevirt.io/v1/namespaces/" + ns + "/kubevirts",
          "/apis/kubevirt.io/v1/namespaces/" + ns + "/virtualmachines",
          "/apis/kubevirt.io/v1/namespaces/" + ns + "/virtualmachineinstances",
          "/apis/cdi.kubevirt.io/v1beta1/namespaces/" + ns + "/datavolumes"};
}

// "Kind/name" of every object in the namespace, whatever its kind.
inline std::vector<std::string> everything_in(const FakeKube& kube, const std::string& ns) {
  std::vector<std::string> out;
  for (const auto& path : namespaced_collections(ns)) {
    json list = kube.get(path);
    EXPECT_TRUE(list.is_object() && list.contains("items")) << path << ": " << list.dump();
    if (!list.is_object()) continue;
    for (const auto& o : list.value("items", json::array()))
      out.push_back(path.substr(path.rfind('/') + 1) + "/" + o["metadata"].value("name", ""));
  }
  return out;
}

inline std::vector<std::string> objects_of(const FakeKube& kube, const std::string& ns,
                                           const std::string& tenant) {
  std::vector<std::string> out;
  for (const auto& o : everything_in(kube, ns))
    if (o.find(tenant) != std::string::npos) out.push_back(o);
  return out;
}

inline std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  std::string l;
  while (std::getline(in, l))
    if (!l.empty()) out.push_back(l);
  return out;
}

// The failure contract of every command: one line "factory: ...", non-zero.
inline void expect_one_line_failure(const CommandResult& r, const std::string& needle) {
  EXPECT_NE(r.exit_code, 0) << r.output;
  auto ls = lines(r.output);
  ASSERT_EQ(ls.size(), 1u) << "want one clear line, got:\n" << r.output;
  EXPECT_EQ(ls[0].rfind("factory: ", 0), 0u) << ls[0];
  EXPECT_NE(ls[0].find(needle), std::string::npos) << "want '" << needle << "' in: " << ls[0];
}

// Every field the runbook gives is in `actual` with the same value (objects
// recursively, lists element by element); what Factory or the API server
// adds beside them is not the runbook's business.
inline void expect_superset(const json& expected, const json& actual,
                            const std::string& where = "") {
  if (expected.is_object()) {
    ASSERT_TRUE(actual.is_object()) << where << ": want an object, have " << actual.dump();
    for (auto& [k, v] : expected.items()) {
      ASSERT_TRUE(actual.contains(k)) << where << "." << k << " is missing";
      expect_superset(v, actual[k], where + "." + k);
    }
  } else if (expected.is_array()) {
    ASSERT_TRUE(actual.is_array()) << where << ": want a list, have " << actual.dump();
    ASSERT_EQ(expected.size(), actual.size()) << where << ": " << actual.dump();
    for (size_t i = 0; i < expected.size(); ++i)
      expect_superset(expected[i], actual[i], where + "[" + std::to_string(i) + "]");
  } else {
    EXPECT_EQ(expected, actual) << where;
  }
}

inline json replace_in_strings(json j, const std::string& from, const std::string& to) {
  if (j.is_string()) {
    std::string s = j.get<std::string>();
    for (size_t pos = 0; (pos = s.find(from, pos)) != std::string::npos; pos += to.size())
      s.replace(pos, from.size(), to);
    return s;
  }
  if (j.is_object() || j.is_array())
    for (auto& v : j) v = replace_in_strings(v, from, to);
  return j;
}

inline std::string b64decode(const std::string& in) {
  std::string out((in.size() / 4 + 1) * 3, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(in.data()),
                          static_cast<int>(in.size()));
  if (n < 0) return "";
  size_t pad = 0;
  if (!in.empty() && in.back() == '=') ++pad;
  if (in.size() > 1 && in[in.size() - 2] == '=') ++pad;
  out.resize(static_cast<size_t>(n) - pad);
  return out;
}

// The user-data a tenant's VM boots with, read back from the fake cluster.
inline json live_user_data(const FakeKube& kube, const std::string& tenant) {
  json secret = kube.get("/api/v1/namespaces/tenants/secrets/" + tenant + "-cloud-init");
  std::string text = b64decode(secret["data"].value("userdata", ""));
  EXPECT_EQ(text.rfind("#cloud-config\n", 0), 0u) << text;
  auto j = factory::parse_yaml(text, "user-data");
  EXPECT_TRUE(j.ok()) << text;
  return j.ok() ? *j : json();
}

inline std::string write_file_content(const json& user_data, const std::string& path) {
  for (const auto& f : user_data.value("write_files", json::array()))
    if (f.value("path", "") == path) return f.value("content", "");
  return "";
}

// What the guest's agent enrolls with when it boots from this user-data:
// the token the coordinator wrote into the tenant's Secret, for `h`.
inline json bootstrap_token_in(const json& user_data, factory::testing::CoordinatorHarness& h) {
  return {{"token", write_file_content(user_data, "/etc/factory/bootstrap-token")},
          {"coordinator_url", h.agents_url()},
          {"ca_sha256", h.ca_sha256()}};
}

// An agent on an empty guest root of its own under `dir`.
inline factory::testing::AgentOptions on_empty_guest(const std::filesystem::path& dir) {
  factory::testing::AgentOptions o;
  o.root = dir / "guest-root";
  std::filesystem::create_directories(o.root);
  return o;
}

inline std::string password_from(const std::string& output) {
  for (const auto& l : lines(output)) {
    auto at = l.find("password of ubuntu on ");
    if (at != std::string::npos) return l.substr(l.rfind(' ') + 1);
  }
  return "";
}

class Tenants : public ::testing::Test {
 protected:
  // The double's arguments: the runbook host's two L4s on vfio-pci unless a
  // test asks for another cluster (a second node, CDI's volumes).
  explicit Tenants(std::vector<std::string> kube_args = {"--vfio-cards", "10DE:27B8=2"})
      : kube_(std::move(kube_args)) {}

  void SetUp() override {
    ASSERT_TRUE(kube_.ok()) << kube_.log();
    key_file_ = dir_ / "admin.pub";
    write_text(key_file_, std::string(kTestEd25519Key) + "\n");
  }

  // Runbook step 3, as an admin runs it: the L4s allowlisted, the node
  // advertising both.
  void allowlist() {
    auto r = run({factory_bin(), "kubevirt", "allowlist", "--kubeconfig", kube_.kubeconfig(),
                  "--pci-id", "10de:27b8", "--resource-name", kL4});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("utho  nvidia.com/AD104GL_L4: 2\n"), std::string::npos) << r.output;
  }

  CoordinatorHarness& coordinator() {
    if (!h_) {
      h_ = std::make_unique<CoordinatorHarness>(
          dir_.path(), "kube:\n  kubeconfig: " + kube_.kubeconfig() + "\n");
      h_->start();
    }
    return *h_;
  }

  CommandResult create(const std::string& name, const std::string& tier,
                       std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"tenant",    "create",          name, "--tier", tier,
                                     "--ssh-key", key_file_.string()};
    args.insert(args.end(), extra.begin(), extra.end());
    return coordinator().factory(args);
  }

  json tenants() {
    auto r = coordinator().factory({"tenant", "list", "-o", "json"});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    auto j = json::parse(r.output, nullptr, false);
    return j.is_discarded() ? json::array() : j["tenants"];
  }

  std::vector<std::string> tenant_names() {
    std::vector<std::string> out;
    for (const auto& t : tenants()) out.push_back(t.value("name", ""));
    return out;
  }

  json show(const std::string& name) {
    auto r = coordinator().factory({"tenant", "show", name, "-o", "json"});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    auto j = json::parse(r.output, nullptr, false);
    return j.is_discarded() ? json::object() : j;
  }

  json token_list() {
    auto r = coordinator().factory({"token", "list", "-o", "json"});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    auto j = json::parse(r.output, nullptr, false);
    return j.is_discarded() ? json::array() : j["tokens"];
  }

  TempDir dir_{"tenants"};
  FakeKube kube_;
  fs::path key_file_;
  std::unique_ptr<CoordinatorHarness> h_;
};

}  // namespace factory::testing
