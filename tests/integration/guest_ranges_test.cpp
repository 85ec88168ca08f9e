// A gpu-k8s tenant's guest cluster ranges picked around the host cluster's,
// end to end: the real `factory serve` reads the host's ranges through its
// Kubernetes client from the fake API server (tests/fakes/kube_apiserver.py,
// which STANDS IN FOR the host cluster: its Node's spec.podCIDRs, the
// `kubernetes` Service and the cluster DNS Service, with python3-kubernetes'
// schemas), and `factory tenant show` says what was picked and around what.
// Issue 16's acceptance, the coordinator's half.
#include <gtest/gtest.h>

#include "tests/integration/tenant_fixture.hpp"

using namespace factory::testing;
using nlohmann::json;

namespace {

class GuestRanges : public ::testing::Test {
 protected:
  void start(std::vector<std::string> kube_args, const std::string& extra_yaml = "") {
    kube_args.insert(kube_args.begin(), {"--vfio-cards", "10DE:27B8=2"});
    kube_ = std::make_unique<FakeKube>(kube_args);
    ASSERT_TRUE(kube_->ok()) << kube_->log();
    write_text(dir_ / "admin.pub", std::string(kTestEd25519Key) + "\n");
    auto r = run({factory_bin(), "kubevirt", "allowlist", "--kubeconfig", kube_->kubeconfig(),
                  "--pci-id", "10de:27b8", "--resource-name", kL4});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    h_ = std::make_unique<CoordinatorHarness>(
        dir_.path(), "kube:\n  kubeconfig: " + kube_->kubeconfig() + "\n" + extra_yaml);
    h_->start();
  }

  CommandResult create(const std::string& name) {
    return h_->factory({"tenant", "create", name, "--tier", "gpu-k8s", "--ssh-key",
                        (dir_ / "admin.pub").string()});
  }

  json show_json(const std::string& name) {
    auto r = h_->factory({"tenant", "show", name, "-o", "json"});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    auto j = json::parse(r.output, nullptr, false);
    return j.is_discarded() ? json::object() : j;
  }

  TempDir dir_{"guest-ranges"};
  std::unique_ptr<FakeKube> kube_;
  std::unique_ptr<CoordinatorHarness> h_;
};

bool has_fact(const json& avoid, const std::string& range, const std::string& source) {
  for (const auto& f : avoid)
    if (f.value("range", "") == range && f.value("source", "") == source) return true;
  return false;
}

}  // namespace

TEST_F(GuestRanges, AHostOn10_52And10_53GetsRangesOverlappingNeither) {
  start({"--pod-cidr", "10.52.0.0/24", "--service-cidr", "10.53.0.0/16", "--dns-service",
         "kube-system/kube-dns"});
  auto c = create("tenant-2");
  ASSERT_EQ(c.exit_code, 0) << c.output << h_->log();

  json t = show_json("tenant-2");
  const json gr = t["spec"]["guest_ranges"];
  EXPECT_EQ(gr["planned"], json({{"cluster-cidr", "10.54.0.0/16"},
                                 {"service-cidr", "10.55.0.0/16"},
                                 {"cluster-dns", "10.55.0.10"}}))
      << gr.dump();
  EXPECT_EQ(gr["fixed"], false);
  EXPECT_TRUE(has_fact(gr["avoid"], "10.52.0.0/24", "host node utho spec.podCIDRs")) << gr.dump();
  EXPECT_TRUE(has_fact(gr["avoid"], "10.53.0.1", "host Service default/kubernetes ClusterIP"));
  EXPECT_TRUE(
      has_fact(gr["avoid"], "10.53.0.10", "host DNS Service kube-system/kube-dns ClusterIP"));
  EXPECT_TRUE(has_fact(gr["avoid"], "10.0.2.0/24",
                       "KubeVirt masquerade network (the VM's interface binding)"));

  // As the admin reads it.
  auto table = h_->factory({"tenant", "show", "tenant-2"});
  ASSERT_EQ(table.exit_code, 0) << table.output;
  EXPECT_NE(table.output.find("Ranges:    pods 10.54.0.0/16, services 10.55.0.0/16, DNS "
                              "10.55.0.10 (planned around the host; the agent adds the "
                              "guest's own networks)"),
            std::string::npos)
      << table.output;
  EXPECT_NE(table.output.find("Around:    10.52.0.0/24  host node utho spec.podCIDRs"),
            std::string::npos)
      << table.output;
  EXPECT_NE(table.output.find("           10.53.0.10  host DNS Service kube-system/kube-dns "
                              "ClusterIP"),
            std::string::npos)
      << table.output;
}

TEST_F(GuestRanges, TheRunbooksHostStillGetsTheRunbooksRanges) {
  start({});  // RKE2's defaults: node 10.42.0.0/24, services 10.43.0.0/16, DNS 10.43.0.10
  auto c = create("tenant-2");
  ASSERT_EQ(c.exit_code, 0) << c.output << h_->log();
  const json gr = show_json("tenant-2")["spec"]["guest_ranges"];
  EXPECT_EQ(gr["planned"], json({{"cluster-cidr", "10.52.0.0/16"},
                                 {"service-cidr", "10.53.0.0/16"},
                                 {"cluster-dns", "10.53.0.10"}}))
      << gr.dump();
  EXPECT_TRUE(has_fact(gr["avoid"], "10.43.0.10",
                       "host DNS Service kube-system/rke2-coredns-rke2-coredns ClusterIP"))
      << gr.dump();
  // gpu-vm has no guest cluster: nothing read, nothing recorded.
  auto v = h_->factory({"tenant", "create", "tenant-1", "--tier", "gpu-vm", "--ssh-key",
                        (dir_ / "admin.pub").string()});
  ASSERT_EQ(v.exit_code, 0) << v.output;
  EXPECT_FALSE(show_json("tenant-1")["spec"].contains("guest_ranges"));
}

TEST_F(GuestRanges, TheConfigsAvoidAndPoolAreHonoured) {
  // What the API does not show (an overlay's pool), and a pool of the admin's.
  start({},
        "guest_ranges:\n  avoid: [10.52.0.0/15]\n  pool: [10.52.0.0/14, 172.20.0.0/14]\n"
        "  service_prefix: 20\n");
  auto c = create("tenant-2");
  ASSERT_EQ(c.exit_code, 0) << c.output << h_->log();
  const json gr = show_json("tenant-2")["spec"]["guest_ranges"];
  EXPECT_EQ(gr["planned"], json({{"cluster-cidr", "10.54.0.0/16"},
                                 {"service-cidr", "10.55.0.0/20"},
                                 {"cluster-dns", "10.55.0.10"}}))
      << gr.dump();
  EXPECT_TRUE(
      has_fact(gr["avoid"], "10.52.0.0/15", "guest_ranges.avoid in the coordinator config"));
  EXPECT_EQ(gr["pool"]["blocks"], json({"10.52.0.0/14", "172.20.0.0/14"}));
}

TEST_F(GuestRanges, ACatalogThatFixesClashingRangesIsRefusedNamingTheClash) {
  std::string cat = slurp(source_dir() / "catalog" / "catalog.yaml");
  auto at = cat.find("          config: {}\n");
  ASSERT_NE(at, std::string::npos);
  cat.replace(at, std::string("          config: {}\n").size(),
              "          config:\n            cluster-cidr: 10.52.0.0/16\n"
              "            service-cidr: 10.53.0.0/16\n            cluster-dns: 10.53.0.10\n");
  write_text(dir_ / "fixed.yaml", cat);
  start({"--pod-cidr", "10.52.0.0/24", "--service-cidr", "10.53.0.0/16"},
        "catalog: " + (dir_ / "fixed.yaml").string() + "\n");
  auto c = create("tenant-2");
  expect_one_line_failure(
      c,
      "tier gpu-k8s step 'rke2' fixes the guest cluster's ranges: cluster-cidr 10.52.0.0/16 "
      "overlaps 10.52.0.0/24 (host node utho spec.podCIDRs)");
  auto list = h_->factory({"tenant", "list", "-o", "json"});
  EXPECT_EQ(json::parse(list.output)["tenants"].size(), 0u) << "refused before anything is made";
}
