// What the gpu-k8s steps read off the guest cluster and the guest, and the
// rules that turn it into diagnoses: pure functions on constructed input in
// the real tools' shapes (kubectl's v1 Node/Pod JSON, systemd 255's
// `resolvectl status`, resolv.conf), plus the guest's DNS read off the
// simulated runbook tenant-2 guest (tests/guestsim, a SIMULATION).
#include <gtest/gtest.h>

#include "agent/diagnose/k8s.hpp"
#include "agent/guest/dns.hpp"
#include "tests/agent/k8s_harness.hpp"

namespace factory::testing {
namespace {

using namespace factory::agent;
using nlohmann::json;

json node_json(bool ready, json labels, json allocatable) {
  return {
      {"apiVersion", "v1"},
      {"kind", "Node"},
      {"metadata", {{"name", "tenant-2"}, {"labels", labels}}},
      {"status",
       {{"allocatable", allocatable},
        {"capacity", allocatable},
        {"conditions", json::array({{{"type", "MemoryPressure"}, {"status", "False"}},
                                    {{"type", "Ready"},
                                     {"status", ready ? "True" : "False"},
                                     {"reason", ready ? "KubeletReady" : "KubeletNotReady"},
                                     {"message", ready ? "kubelet is posting ready status"
                                                       : "container runtime network not ready"}}})},
        {"nodeInfo", {{"kubeletVersion", "v1.36.4+rke2r1"}}}}}};
}

json pod_json(const std::string& ns, const std::string& name, json labels, json status,
              json limits = json::object()) {
  return {{"metadata", {{"namespace", ns}, {"name", name}, {"labels", labels}}},
          {"spec",
           {{"nodeName", "tenant-2"},
            {"containers", json::array({{{"name", "c"}, {"resources", {{"limits", limits}}}}})}}},
          {"status", status}};
}

json running() {
  return {
      {"phase", "Running"},
      {"containerStatuses",
       json::array(
           {{{"ready", true}, {"restartCount", 0}, {"state", {{"running", json::object()}}}}})}};
}

TEST(KubeParse, NodesFromAListWithReadinessLabelsAndResources) {
  json list = {
      {"apiVersion", "v1"},
      {"kind", "List"},
      {"items",
       json::array({node_json(true, {{"gpu", "on"}}, {{"cpu", "8"}, {"nvidia.com/gpu", "10"}})})}};
  auto nodes = parse_node_list(list);
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_EQ(nodes[0].name, "tenant-2");
  EXPECT_TRUE(nodes[0].ready);
  EXPECT_TRUE(nodes[0].has_label("gpu", "on"));
  EXPECT_EQ(nodes[0].allocatable.at("nvidia.com/gpu"), "10");
  EXPECT_EQ(nodes[0].kubelet_version, "v1.36.4+rke2r1");
  // A single object (kubectl get node NAME -o json) reads the same.
  auto one = parse_node_list(node_json(false, json::object(), json::object()));
  ASSERT_EQ(one.size(), 1u);
  EXPECT_FALSE(one[0].ready);
  EXPECT_EQ(one[0].ready_reason, "KubeletNotReady");
  EXPECT_TRUE(parse_node_list(json("nonsense")).empty());
}

TEST(KubeParse, PodStatusesAsKubectlPrintsThem) {
  json init = {
      {"phase", "Pending"},
      {"initContainerStatuses",
       json::array({{{"name", "toolkit-validation"}, {"state", {{"running", json::object()}}}}})},
      {"containerStatuses",
       json::array({{{"ready", false},
                     {"restartCount", 0},
                     {"state", {{"waiting", {{"reason", "PodInitializing"}}}}}}})}};
  json crash = {
      {"phase", "Running"},
      {"containerStatuses",
       json::array({{{"ready", false},
                     {"restartCount", 7},
                     {"state",
                      {{"waiting",
                        {{"reason", "CrashLoopBackOff"},
                         {"message", "back-off 5m0s restarting failed container"}}}}}}})}};
  json unschedulable = {
      {"phase", "Pending"},
      {"conditions",
       json::array({{{"type", "PodScheduled"},
                     {"status", "False"},
                     {"reason", "Unschedulable"},
                     {"message", "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."}}})}};
  json list = {
      {"items", json::array({pod_json("hami-system", "hami-device-plugin-x", {}, init),
                             pod_json("hami-system", "hami-device-plugin-y", {}, crash),
                             pod_json("default", "gpu-test-1", {}, unschedulable,
                                      {{"nvidia.com/gpu", 1}, {"nvidia.com/gpumem", "1024"}}),
                             pod_json("kube-system", "etcd-tenant-2", {}, running())})}};
  auto pods = parse_pod_list(list);
  ASSERT_EQ(pods.size(), 4u);
  EXPECT_EQ(pods[0].status, "Init:0/1");
  EXPECT_FALSE(pods[0].running());
  EXPECT_EQ(pods[1].status, "CrashLoopBackOff");
  EXPECT_EQ(pods[1].restarts, 7);
  EXPECT_EQ(pods[1].message, "back-off 5m0s restarting failed container");
  EXPECT_EQ(pods[2].status, "Pending");
  EXPECT_EQ(pods[2].message, "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.");
  EXPECT_EQ(pods[2].limits.at("nvidia.com/gpu"), 1);
  EXPECT_EQ(pods[2].limits.at("nvidia.com/gpumem"), 1024);
  EXPECT_TRUE(pods[3].running());
  EXPECT_TRUE(pods[3].ready);
}

TEST(KubeParse, QuantitiesAsCounts) {
  EXPECT_EQ(parse_quantity_count("10"), 10);
  EXPECT_EQ(parse_quantity_count("2k"), 2000);
  EXPECT_EQ(parse_quantity_count("1Ki"), 1024);
  EXPECT_EQ(parse_quantity_count("1500m"), std::nullopt);
  EXPECT_EQ(parse_quantity_count(""), std::nullopt);
}

TEST(GuestDns, ResolvConfSkipsTheStub) {
  EXPECT_EQ(parse_resolv_conf("# This is /run/systemd/resolve/stub-resolv.conf\n"
                              "nameserver 127.0.0.53\noptions edns0 trust-ad\n"),
            std::vector<std::string>{});
  EXPECT_EQ(parse_resolv_conf("nameserver 10.43.0.10\nsearch tenants.svc.cluster.local\n"),
            std::vector<std::string>{"10.43.0.10"});
}

TEST(GuestDns, ResolvectlStatusSystemd255) {
  // systemd 255's layout (Ubuntu 24.04), one link with DHCP's server.
  const char* out =
      "Global\n"
      "         Protocols: -LLMNR -mDNS -DNSOverTLS DNSSEC=no/unsupported\n"
      "  resolv.conf mode: stub\n"
      "\n"
      "Link 2 (enp1s0)\n"
      "    Current Scopes: DNS\n"
      "         Protocols: +DefaultRoute -LLMNR -mDNS -DNSOverTLS DNSSEC=no/unsupported\n"
      "Current DNS Server: 10.43.0.10\n"
      "       DNS Servers: 10.43.0.10 10.43.0.11#dns.example\n"
      "        DNS Domain: tenants.svc.cluster.local svc.cluster.local cluster.local\n";
  EXPECT_EQ(parse_resolvectl_status(out), (std::vector<std::string>{"10.43.0.10", "10.43.0.11"}));
}

TEST(CidrRules, RangesValidatedAndCheckedAgainstTheHostsDns) {
  ClusterRanges runbook{"10.52.0.0/16", "10.53.0.0/16", "10.53.0.10"};
  EXPECT_TRUE(validate_ranges(runbook));
  EXPECT_FALSE(validate_ranges({"10.52.0.0/16", "10.52.128.0/17", "10.52.128.10"}));
  EXPECT_FALSE(validate_ranges({"10.52.0.0/16", "10.53.0.0/16", "10.54.0.10"}));
  EXPECT_FALSE(validate_ranges({"10.52.0.0/33", "10.53.0.0/16", "10.53.0.10"}));

  EXPECT_EQ(assumed_host_service_range("10.43.0.10"), "10.43.0.0/16");
  EXPECT_EQ(assumed_host_service_range("10.96.0.10"), "10.96.0.0/16");
  EXPECT_EQ(assumed_host_service_range("192.168.1.1"), "192.168.1.1/32");

  EXPECT_FALSE(diagnose_cidr_plan(runbook, {"10.43.0.10"}));
  auto defaults =
      diagnose_cidr_plan({"10.42.0.0/16", "10.43.0.0/16", "10.43.0.10"}, {"10.43.0.10"});
  ASSERT_TRUE(defaults);
  EXPECT_EQ(defaults->code, "guest_cidr_clash");
  EXPECT_EQ(defaults->details["host_service_range_assumed"], "10.43.0.0/16");
  // Overlapping the host's /16 without holding the address is refused too.
  EXPECT_TRUE(
      diagnose_cidr_plan({"10.52.0.0/16", "10.43.128.0/17", "10.43.128.10"}, {"10.43.0.10"}));
  EXPECT_FALSE(diagnose_cidr_plan(runbook, {}));  // nothing seen, nothing refused
}

TEST(NotReadyRules, DnsInsideTheRunningServiceRangeWinsOverEverythingElse) {
  NodeNotReadyObservations o;
  o.planned = {"10.52.0.0/16", "10.53.0.0/16", "10.53.0.10"};
  o.dns_servers = {"10.43.0.10"};
  o.running_service_cidr = "10.43.0.0/16";
  o.service = "rke2-server";
  auto d = diagnose_node_not_ready(o);
  EXPECT_EQ(d.code, "guest_dns_clash");
  EXPECT_NE(d.summary.find("not the planned 10.53.0.0/16"), std::string::npos) << d.summary;

  o.running_service_cidr = "10.53.0.0/16";
  o.api_error = "kubectl exited 1: The connection to the server 127.0.0.1:6443 was refused";
  EXPECT_EQ(diagnose_node_not_ready(o).code, "rke2_api_unreachable");

  KubeNode n;
  n.name = "tenant-2";
  n.ready_reason = "KubeletNotReady";
  o.node = n;
  KubePod canal;
  canal.ns = "kube-system";
  canal.name = "rke2-canal-1";
  canal.phase = "Pending";
  canal.status = "ImagePullBackOff";
  o.system_pods = {canal};
  auto nr = diagnose_node_not_ready(o);
  EXPECT_EQ(nr.code, "rke2_node_not_ready");
  EXPECT_EQ(nr.details["failing_pods"][0]["name"], "rke2-canal-1");
}

TEST(AllocatableRules, InTheirOrder) {
  AllocatableObservations o;
  o.resource = "nvidia.com/gpu";
  o.count = 10;
  KubeNode node;
  node.name = "tenant-2";
  node.ready = true;
  o.nodes = {node};
  KubePod sched;
  sched.ns = "hami-system";
  sched.name = "hami-scheduler-1";
  sched.phase = sched.status = "Running";
  sched.ready = true;
  sched.labels = {{"app.kubernetes.io/component", "hami-scheduler"}};
  o.pods = {sched};
  // HAMi in, node not labelled.
  auto d = diagnose_allocatable(o);
  EXPECT_EQ(d.code, "hami_pods_pending");
  EXPECT_EQ(d.fix, "kubectl label node --all gpu=on");

  // Labelled, but no device plugin pod.
  o.nodes[0].labels["gpu"] = "on";
  EXPECT_EQ(diagnose_allocatable(o).code, "device_plugin_not_running");

  // The plugin waits for the toolkit.
  KubePod plugin;
  plugin.ns = "hami-system";
  plugin.name = "hami-device-plugin-1";
  plugin.phase = "Pending";
  plugin.status = "Init:0/1";
  plugin.labels = {{"app.kubernetes.io/component", "hami-device-plugin"}};
  o.pods.push_back(plugin);
  auto init = diagnose_allocatable(o);
  EXPECT_EQ(init.code, "device_plugin_not_running");
  EXPECT_NE(init.summary.find("toolkit-ready"), std::string::npos) << init.summary;

  // Running, with the GPU Operator's plugin beside it.
  o.pods.back().phase = o.pods.back().status = "Running";
  o.pods.back().ready = true;
  KubePod theirs;
  theirs.ns = "gpu-operator";
  theirs.name = "nvidia-device-plugin-daemonset-1";
  theirs.phase = theirs.status = "Running";
  theirs.labels = {{"app", "nvidia-device-plugin-daemonset"}};
  o.pods.push_back(theirs);
  EXPECT_EQ(diagnose_allocatable(o).code, "two_device_plugins");

  // Only HAMi's, running, advertising too few.
  o.pods.pop_back();
  o.found = 4;
  auto shortd = diagnose_allocatable(o);
  EXPECT_EQ(shortd.code, "allocatable_short");
  EXPECT_EQ(shortd.details["found"], 4);
}

class GuestDnsOnTheSimulatedGuest : public K8sGuest {};

TEST_F(GuestDnsOnTheSimulatedGuest, FromResolvedsFileElseFromResolvectl) {
  make();
  EXPECT_EQ(guest_dns_servers(sim_->env()), std::vector<std::string>{"10.43.0.10"});
  // Without resolved's upstream file, /etc/resolv.conf is only the stub:
  // resolvectl says what DHCP gave.
  std::filesystem::remove(sim_->root() / "run/systemd/resolve/resolv.conf");
  EXPECT_EQ(guest_dns_servers(sim_->env()), std::vector<std::string>{"10.43.0.10"});
  EXPECT_NE(sim_->calls_log().find("resolvectl status"), std::string::npos);
}

}  // namespace
}  // namespace factory::testing

namespace factory::testing {
namespace {

class FreshK8sGuest : public K8sGuest {};

// The build machine may have its own kubectl or helm in /usr/bin, which is
// on the simulated guest's PATH: the simulator's guards must answer for them
// as a fresh guest does (no such command) until the stand-ins are installed.
TEST_F(FreshK8sGuest, HasNoKubectlHelmOrRke2UntilInstalled) {
  make();
  for (const char* cmd : {"kubectl", "helm", "rke2"}) {
    auto r = sim_->sh({cmd, "version"});
    EXPECT_EQ(r.exit_code, 127) << cmd << ": " << r.output;
    EXPECT_NE(r.output.find(std::string(cmd) + ": command not found"), std::string::npos)
        << r.output;
  }
  EXPECT_FALSE(std::filesystem::exists(sim_->root() / "var/lib/rancher/rke2/bin/kubectl"));
}

}  // namespace
}  // namespace factory::testing
