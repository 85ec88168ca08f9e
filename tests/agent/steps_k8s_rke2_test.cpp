// The rke2 step on the simulated runbook tenant-2 guest (tests/guestsim,
// profile l4-k8s; a SIMULATION: RKE2's installer, server, kubectl and the
// guest's DNS are stand-ins, see tests/guestsim/README.md). The guest got
// the host cluster's DNS server 10.43.0.10 from DHCP, as in the runbook.
#include <gtest/gtest.h>

#include <fstream>

#include "agent/diagnose/k8s.hpp"
#include "agent/steps/rke2.hpp"
#include "common/atomic_file.hpp"
#include "tests/agent/k8s_harness.hpp"

namespace factory::testing {
namespace {

using namespace std::chrono_literals;
using agent::StepOutcome;

// The runbook's config.yaml, with the agent's header comment.
const char* kRunbookConfig =
    "# Written by factory-agent (plan step rke2). The guest cluster's own ranges: they must\n"
    "# not clash with the host cluster's, whose DNS server the guest got from DHCP.\n"
    "cluster-cidr: 10.52.0.0/16\n"
    "service-cidr: 10.53.0.0/16\n"
    "cluster-dns: 10.53.0.10\n";

const nlohmann::json kRunbookRanges = {{"cluster-cidr", "10.52.0.0/16"},
                                       {"service-cidr", "10.53.0.0/16"},
                                       {"cluster-dns", "10.53.0.10"}};

TEST(Rke2Config, TheRunbooksKeysInItsOrderThenTheRestQuotedWhereYamlWouldRetypeThem) {
  EXPECT_EQ(agent::steps::render_rke2_config(kRunbookRanges), kRunbookConfig);

  nlohmann::json more = kRunbookRanges;
  more["write-kubeconfig-mode"] = "0644";  // would read back as a number
  more["disable"] = nlohmann::json::array({"rke2-ingress-nginx"});
  more["selinux"] = "on";  // YAML 1.1 (Go) reads a plain on as true
  more["node-name"] = "tenant-2";
  auto text = agent::steps::render_rke2_config(more);
  EXPECT_EQ(text.rfind(kRunbookConfig, 0), 0u) << text;  // the runbook's three first
  EXPECT_TRUE(contains(text, "write-kubeconfig-mode: \"0644\"\n")) << text;
  EXPECT_TRUE(contains(text, "selinux: \"on\"\n")) << text;
  EXPECT_TRUE(contains(text, "node-name: tenant-2\n")) << text;
  EXPECT_LT(text.find("cluster-dns"), text.find("disable")) << text;
}

TEST(Rke2Version, ParsesRke2sOwnLine) {
  using agent::steps::parse_rke2_version;
  EXPECT_EQ(parse_rke2_version("rke2 version v1.36.4+rke2r1 (a4ba9c3e3f7e)\n"
                               "go version go1.24.0 X:boringcrypto\n"),
            "v1.36.4+rke2r1");
  EXPECT_EQ(parse_rke2_version("sh: 1: rke2: not found\n"), "");
}

class Rke2Step : public K8sGuest {};

TEST_F(Rke2Step, FreshGuestInstallsWithTheRunbooksRangesAndWaitsForTheNode) {
  make("1");  // the node is Ready a second after the server starts
  auto h = step("rke2");
  ASSERT_TRUE(h.ok());
  auto c = h.check();
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_FALSE(*c);

  auto a = h.apply();
  ASSERT_TRUE(a.ok()) << describe(a);
  EXPECT_TRUE(contains(a.message, "node tenant-2 Ready")) << a.message;
  auto v = h.verify();
  ASSERT_TRUE(v.ok()) << describe(v);
  EXPECT_TRUE(contains(v.message, "v1.36.4+rke2r1")) << v.message;
  EXPECT_TRUE(contains(v.message, "service-cidr 10.53.0.0/16")) << v.message;

  // config.yaml: the runbook's keys, written before the install, 0600.
  auto cfg = sim_->root() / "etc/rancher/rke2/config.yaml";
  EXPECT_EQ(slurp(cfg), kRunbookConfig);
  EXPECT_EQ(std::filesystem::status(cfg).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  auto calls = sim_->calls_log();
  EXPECT_TRUE(contains(calls, "curl -fsSL https://get.rke2.io")) << calls;
  EXPECT_TRUE(contains(calls, "systemctl enable --now rke2-server")) << calls;
  EXPECT_EQ(sim_->counter("rke2.install"), 1);
  EXPECT_EQ(sim_->sh({"systemctl", "is-enabled", "rke2-server"}).output, "enabled\n");
  // The cluster took the planned ranges at its first start.
  EXPECT_EQ(agent::rke2_running_service_cidr(sim_->env()).value_or(""), "10.53.0.0/16");

  // It waited for the node, and said so.
  bool waited = false;
  for (const auto& e : h.events)
    waited |= contains(e.value("message", ""), "waiting for the guest cluster's node to be Ready");
  EXPECT_TRUE(waited);
  auto nodes = kubectl({"get", "nodes"});
  EXPECT_TRUE(contains(nodes.output, "tenant-2   Ready    control-plane,etcd")) << nodes.output;

  // Done: the check says so, and applying again installs nothing.
  auto done = h.check();
  ASSERT_TRUE(done);
  EXPECT_TRUE(*done);
  auto again = h.apply();
  ASSERT_TRUE(again.ok()) << describe(again);
  EXPECT_EQ(sim_->counter("rke2.install"), 1);
}

TEST_F(Rke2Step, RefusesRangesThatOverlapTheHostsServiceRangeBeforeTouchingAnything) {
  make();
  // RKE2's defaults: the guest's kube-proxy would own 10.43.0.10.
  auto spec = catalog_step("gpu-k8s", "rke2");
  spec.params["config"] = {{"cluster-cidr", "10.42.0.0/16"},
                           {"service-cidr", "10.43.0.0/16"},
                           {"cluster-dns", "10.43.0.10"}};
  auto h = step(spec);
  auto a = h.apply();
  ASSERT_FALSE(a.ok());
  ASSERT_TRUE(a.diagnosis) << describe(a);
  EXPECT_EQ(a.diagnosis->code, "guest_cidr_clash");
  EXPECT_EQ(a.diagnosis->details["key"], "service-cidr");
  EXPECT_EQ(a.diagnosis->details["dns_server"], "10.43.0.10");
  EXPECT_TRUE(contains(a.diagnosis->summary, "10.43.0.10")) << a.diagnosis->summary;
  EXPECT_FALSE(std::filesystem::exists(sim_->root() / "etc/rancher/rke2/config.yaml"));
  EXPECT_EQ(sim_->counter("rke2.install"), 0);

  // A pod range that swallows the host's service range is refused too.
  spec.params["config"] = {{"cluster-cidr", "10.0.0.0/8"},
                           {"service-cidr", "172.30.0.0/16"},
                           {"cluster-dns", "172.30.0.10"}};
  auto wide = step(spec).apply();
  ASSERT_TRUE(wide.diagnosis) << describe(wide);
  EXPECT_EQ(wide.diagnosis->code, "guest_cidr_clash");
  EXPECT_EQ(wide.diagnosis->details["key"], "cluster-cidr");
  EXPECT_EQ(sim_->counter("rke2.install"), 0);
}

TEST_F(Rke2Step, NodeStuckNotReadyBecauseTheClusterOwnsTheGuestsDnsIsTheRunbooksFailure) {
  make();
  // The server came up with RKE2's default ranges (as when it started
  // before config.yaml was written): its service range holds 10.43.0.10.
  sim_->set_knob("rke2_dns_clash");
  auto h = step("rke2");
  auto ctx = h.context(4s);
  auto a = h.step().apply(ctx);
  ASSERT_FALSE(a.ok());
  ASSERT_TRUE(a.diagnosis) << describe(a);
  EXPECT_EQ(a.diagnosis->code, "guest_dns_clash");
  EXPECT_EQ(a.diagnosis->details["service_cidr"], "10.43.0.0/16");
  EXPECT_EQ(a.diagnosis->details["dns_server"], "10.43.0.10");
  EXPECT_TRUE(contains(a.diagnosis->summary, "not the planned 10.53.0.0/16"))
      << a.diagnosis->summary;
  EXPECT_TRUE(contains(a.diagnosis->fix, "rke2-uninstall.sh")) << a.diagnosis->fix;
  // The output tail shows what the runbook saw: canal cannot pull its image.
  EXPECT_TRUE(contains(a.output_tail, "rke2-canal")) << a.output_tail;
  EXPECT_TRUE(contains(a.output_tail, "ImagePullBackOff")) << a.output_tail;
  EXPECT_TRUE(contains(a.output_tail, "10.43.0.10:53")) << a.output_tail;

  // Restarting does not help: a cluster's ranges are fixed at its first start.
  sim_->clear_knob("rke2_dns_clash");
  ASSERT_EQ(sim_->sh({"systemctl", "restart", "rke2-server"}).exit_code, 0);
  auto still = h.verify(3s);
  ASSERT_TRUE(still.diagnosis) << describe(still);
  EXPECT_EQ(still.diagnosis->code, "guest_dns_clash");

  // The runbook's fix: kill, uninstall, install again with the ranges.
  ASSERT_EQ(sim_->sh({"rke2-killall.sh"}).exit_code, 0);
  ASSERT_EQ(sim_->sh({"rke2-uninstall.sh"}).exit_code, 0);
  EXPECT_FALSE(std::filesystem::exists(sim_->root() / "etc/rancher/rke2/config.yaml"));
  auto c = h.check();
  ASSERT_TRUE(c);
  EXPECT_FALSE(*c);
  auto fixed = h.apply();
  ASSERT_TRUE(fixed.ok()) << describe(fixed);
  ASSERT_TRUE(h.verify().ok());
  EXPECT_EQ(sim_->counter("rke2.install"), 2);
  EXPECT_EQ(agent::rke2_running_service_cidr(sim_->env()).value_or(""), "10.53.0.0/16");
}

TEST_F(Rke2Step, ServerDownIsTheApiNotAnswering) {
  make();
  done("rke2");
  ASSERT_EQ(sim_->sh({"systemctl", "stop", "rke2-server"}).exit_code, 0);
  auto h = step("rke2");
  auto c = h.check();
  ASSERT_TRUE(c);
  EXPECT_FALSE(*c);
  // Long enough for the kubectl stand-in (a Python start) to answer on a
  // loaded machine: with 2 s, and again with 6 s under a load of 8 on 2
  // cores, it was killed first ("timed out", not "refused").
  auto v = h.verify(20s);
  ASSERT_TRUE(v.diagnosis) << describe(v);
  EXPECT_EQ(v.diagnosis->code, "rke2_api_unreachable");
  EXPECT_TRUE(contains(v.diagnosis->summary, "was refused")) << v.diagnosis->summary;
  EXPECT_TRUE(contains(v.output_tail, "rke2-server.service")) << v.output_tail;

  // apply starts it again; nothing is reinstalled.
  auto a = h.apply();
  ASSERT_TRUE(a.ok()) << describe(a);
  EXPECT_EQ(sim_->counter("rke2.install"), 1);
}

TEST_F(Rke2Step, ACutDownloadIsADownloadFailure) {
  make();
  sim_->set_knob("curl_cut");
  auto a = step("rke2").apply();
  ASSERT_FALSE(a.ok());
  ASSERT_TRUE(a.diagnosis) << describe(a);
  EXPECT_EQ(a.diagnosis->code, "download_failed");
  EXPECT_TRUE(contains(a.output_tail, "curl: (18)")) << a.output_tail;
  EXPECT_EQ(sim_->counter("rke2.install"), 0);
}

TEST_F(Rke2Step, AHostOn10_52And10_53GetsRangesOverlappingNeitherAndTheyAreKept) {
  make("1");
  // What the coordinator read of such a host, as the plan carries it.
  auto spec = catalog_step("gpu-k8s", "rke2");
  spec.params["ranges"] = {
      {"avoid",
       {{{"range", "10.52.0.0/24"}, {"source", "host node utho spec.podCIDRs"}},
        {{"range", "10.53.0.1"}, {"source", "host Service default/kubernetes ClusterIP"}},
        {{"range", "10.53.0.10"}, {"source", "host DNS Service kube-system/kube-dns ClusterIP"}}}},
      {"pool", {{"blocks", {"10.52.0.0/14"}}}}};
  auto h = step(spec);
  auto a = h.apply();
  ASSERT_TRUE(a.ok()) << describe(a);
  std::string conf = slurp(sim_->root() / "etc/rancher/rke2/config.yaml");
  EXPECT_TRUE(contains(conf,
                       "cluster-cidr: 10.54.0.0/16\nservice-cidr: 10.55.0.0/16\n"
                       "cluster-dns: 10.55.0.10\n"))
      << conf;
  EXPECT_EQ(agent::rke2_running_service_cidr(sim_->env()).value_or(""), "10.55.0.0/16");
  nlohmann::json reported;
  for (const auto& e : h.events)
    if (e.contains("ranges")) reported = e["ranges"];
  ASSERT_TRUE(reported.is_object());
  EXPECT_EQ(reported["cluster-cidr"], "10.54.0.0/16");
  EXPECT_EQ(reported["around"][0], nlohmann::json({{"range", "10.52.0.0/24"},
                                                   {"source", "host node utho spec.podCIDRs"}}));

  // Once RKE2 runs its pod network shows among the guest's routes (canal's
  // cni0): a second look keeps the choice instead of moving off its own range.
  ASSERT_TRUE(write_file_atomic(sim_->root() / "proc/net/route",
                                slurp(sim_->root() / "proc/net/route") +
                                    "cni0\t0000360A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n",
                                0644));
  auto again = step(spec);
  auto c = again.check();
  ASSERT_TRUE(c);
  EXPECT_TRUE(*c);
  EXPECT_TRUE(again.apply().ok());
  EXPECT_EQ(slurp(sim_->root() / "etc/rancher/rke2/config.yaml"), conf);
  EXPECT_EQ(sim_->counter("rke2.install"), 1);
}

TEST_F(Rke2Step, FixedRangesThatClashWithTheHostAreRefusedNamingTheClash) {
  make();
  auto spec = catalog_step("gpu-k8s", "rke2");
  spec.params["config"] = kRunbookRanges;
  spec.params["ranges"] = {
      {"avoid",
       {{{"range", "10.53.0.10"}, {"source", "host DNS Service kube-system/kube-dns ClusterIP"}}}}};
  auto a = step(spec).apply();
  ASSERT_FALSE(a.ok());
  ASSERT_TRUE(a.diagnosis) << describe(a);
  EXPECT_EQ(a.diagnosis->code, "guest_cidr_clash");
  EXPECT_TRUE(contains(a.diagnosis->summary,
                       "service-cidr 10.53.0.0/16 overlaps 10.53.0.10 (host DNS Service "
                       "kube-system/kube-dns ClusterIP)"))
      << a.diagnosis->summary;
  EXPECT_FALSE(std::filesystem::exists(sim_->root() / "etc/rancher/rke2/config.yaml"));
  EXPECT_EQ(sim_->counter("rke2.install"), 0);
}

TEST_F(Rke2Step, AChangedConfigRestartsARunningServer) {
  make();
  done("rke2");
  // Someone edited config.yaml (another key, same ranges): the plan's file
  // comes back and the server is restarted to read it.
  ASSERT_TRUE(write_file_atomic(sim_->root() / "etc/rancher/rke2/config.yaml",
                                "cluster-cidr: 10.52.0.0/16\nservice-cidr: 10.99.0.0/16\n", 0600));
  auto h = step("rke2");
  auto c = h.check();
  ASSERT_TRUE(c);
  EXPECT_FALSE(*c);
  auto a = h.apply();
  ASSERT_TRUE(a.ok()) << describe(a);
  EXPECT_EQ(slurp(sim_->root() / "etc/rancher/rke2/config.yaml"), kRunbookConfig);
  EXPECT_EQ(sim_->counter("systemctl.restart.rke2-server"), 1);
  EXPECT_EQ(sim_->counter("rke2.install"), 1);
}

}  // namespace
}  // namespace factory::testing
