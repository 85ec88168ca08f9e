// The whole gpu-k8s tier, as the built-in catalog defines it, run by the plan
// engine with the built-in step kinds on the simulated runbook tenant-2 guest
// (tests/guestsim, profile l4-k8s; NOT a real guest: RKE2, kubectl, helm and
// the charts are stand-ins, see tests/guestsim/README.md). It ends where the
// runbook's step 7 does: one L4, ten allocatable nvidia.com/gpu, the GPU
// Operator's driver 580.126.20; running the finished plan again changes
// nothing. Then the agent's runtime (plan runner and health scheduler, wired
// as the service runs them) reports the guest cluster's health,
// and the runbook's two test pods show HAMi's 1 GiB limits.
#include <gtest/gtest.h>

#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "agent/cli/runtime.hpp"
#include "agent/health/gpu_health.hpp"
#include "agent/health/k8s_health.hpp"
#include "agent/link/spool.hpp"
#include "agent/plan/engine.hpp"
#include "common/atomic_file.hpp"
#include "tests/agent/k8s_harness.hpp"

namespace factory::testing {
namespace {

using agent::PlanEngine;
using nlohmann::json;
using namespace std::chrono_literals;

agent::StepRegistry builtin_registry() {
  agent::StepRegistry reg;
  agent::register_builtin_steps(reg);
  return reg;
}

json k8s_plan() {
  auto cat = catalog::builtin();
  EXPECT_TRUE(cat) << cat.error().message;
  auto tier = cat->tier("gpu-k8s");
  EXPECT_TRUE(tier);
  return (*tier)->plan();
}

agent::PlanEngineOptions no_sleep() {
  agent::PlanEngineOptions opts;
  opts.sleep = [](std::chrono::milliseconds) {};
  return opts;
}

// The runbook's guest/gpu-test-pods.yaml: two pods, one GPU slice and 1024
// MiB of the card each.
const char* kTestPods = R"(apiVersion: v1
kind: Pod
metadata:
  name: gpu-test-1
spec:
  containers:
    - name: cuda
      image: nvidia/cuda:13.0.0-base-ubuntu24.04
      command: ["sleep", "infinity"]
      resources:
        limits:
          nvidia.com/gpu: 1
          nvidia.com/gpumem: 1024
---
apiVersion: v1
kind: Pod
metadata:
  name: gpu-test-2
spec:
  containers:
    - name: cuda
      image: nvidia/cuda:13.0.0-base-ubuntu24.04
      command: ["sleep", "infinity"]
      resources:
        limits:
          nvidia.com/gpu: 1
          nvidia.com/gpumem: 1024
)";

// The counters of what changes the guest: without the read-only
// `systemctl is-active` lookups the checks make.
std::string effects(const std::string& counters) {
  std::string out, line;
  std::istringstream in(counters);
  while (std::getline(in, line))
    if (line.rfind("systemctl.is-active.", 0) != 0) out += line + "\n";
  return out;
}

class GpuK8sTier : public K8sGuest {};

TEST_F(GpuK8sTier, RunbookTenant2EndToEndThroughThePlanEngine) {
  make("1");  // the simulator's default: Ready a second after the server starts
  json plan = k8s_plan();
  std::vector<json> events;
  auto sink = [&](json e) { events.push_back(std::move(e)); };
  auto no_reboot = [] { return Status(Error(Errc::internal, "the gpu-k8s tier never reboots")); };

  PlanEngine engine(sim_->env(), builtin_registry(), sink, no_reboot, no_sleep());
  auto out = engine.run(plan);
  ASSERT_EQ(out, PlanEngine::Outcome::succeeded) << engine.status_json().dump(2);
  auto status = engine.status_json();
  std::vector<std::string> ids;
  for (const auto& s : status["steps"]) {
    ids.push_back(s["id"]);
    EXPECT_EQ(s["state"], "succeeded") << s.dump(2);
    EXPECT_EQ(s["failures"], 0) << s.dump(2);
  }
  EXPECT_EQ(ids, (std::vector<std::string>{"gpu-present", "rke2", "gpu-operator", "label-gpu-node",
                                           "hami", "gpus-allocatable"}));

  // The ranges, chosen around the guest's networks (the runbook's guest got
  // the host's DNS 10.43.0.10 from DHCP): the runbook's, and reported.
  std::string conf = slurp(sim_->root() / "etc/rancher/rke2/config.yaml");
  EXPECT_TRUE(contains(conf,
                       "cluster-cidr: 10.52.0.0/16\nservice-cidr: 10.53.0.0/16\n"
                       "cluster-dns: 10.53.0.10\n"))
      << conf;
  json reported;
  for (const auto& e : events)
    if (e.value("step", "") == "rke2" && e.contains("ranges")) reported = e["ranges"];
  ASSERT_TRUE(reported.is_object()) << "the rke2 step reports its ranges";
  EXPECT_EQ(reported["service-cidr"], "10.53.0.0/16");
  bool around_dns = false;
  for (const auto& f : reported["around"])
    around_dns |=
        f["range"] == "10.43.0.10" && f["source"] == "guest DNS server (resolv.conf, from DHCP)";
  EXPECT_TRUE(around_dns) << reported.dump(2);
  // The operator's driver at the catalog's pin, seen in its container's nvidia-smi.
  EXPECT_TRUE(contains(status["steps"][2].value("message", ""),
                       "driver 580.126.20 in the driver container (nvidia-smi)"))
      << status["steps"][2].dump(2);

  // Every effect once.
  EXPECT_EQ(sim_->counter("rke2.install"), 1);
  EXPECT_EQ(sim_->counter("curl.helm-v3.19.0-linux-amd64.tar.gz"), 1);
  EXPECT_EQ(sim_->counter("helm.install.gpu-operator"), 1);
  EXPECT_EQ(sim_->counter("helm.install.hami"), 1);
  EXPECT_EQ(sim_->counter("kubectl.label"), 1);
  EXPECT_EQ(sim_->counter("systemctl.enable.rke2-server"), 1);

  // The runbook's end state.
  auto k8s = agent::collect_k8s_health(sim_->env());
  EXPECT_EQ(k8s["allocatable"], 10) << k8s.dump(2);
  EXPECT_EQ(k8s["capacity"], 10) << k8s.dump(2);
  ASSERT_EQ(k8s["nodes"].size(), 1u);
  EXPECT_EQ(k8s["nodes"][0]["name"], "tenant-2");
  EXPECT_EQ(k8s["nodes"][0]["ready"], true);
  EXPECT_EQ(k8s["nodes"][0]["gpu_label"], "on");
  EXPECT_FALSE(k8s.contains("error")) << k8s.dump(2);
  EXPECT_FALSE(k8s.contains("diagnoses")) << k8s.dump(2);
  auto gpu = agent::collect_gpu_health(sim_->env());
  EXPECT_EQ(gpu["driver_version"], "580.126.20") << gpu.dump(2);
  ASSERT_EQ(gpu["gpus"].size(), 1u);  // one card, ten slices
  EXPECT_EQ(gpu["gpus"][0]["name"], "NVIDIA L4");
  auto nodes = kubectl({"get", "nodes"});
  EXPECT_EQ(nodes.output.substr(0, nodes.output.find('\n')),
            "NAME       STATUS   ROLES                AGE   VERSION");
  EXPECT_TRUE(contains(nodes.output, "tenant-2   Ready    control-plane,etcd")) << nodes.output;
  EXPECT_TRUE(contains(nodes.output, "v1.36.4+rke2r1")) << nodes.output;

  // The same plan again, by a new engine: already applied, nothing runs.
  std::string before = sim_->counters();
  PlanEngine again(sim_->env(), builtin_registry(), sink, no_reboot, no_sleep());
  EXPECT_EQ(again.run(plan), PlanEngine::Outcome::succeeded);
  EXPECT_EQ(sim_->counters(), before);

  // A lost journal: every step's check finds it done and nothing is redone.
  ASSERT_TRUE(std::filesystem::exists(again.journal().file()));
  std::filesystem::remove(again.journal().file());
  std::filesystem::remove(again.journal().prev_file());
  PlanEngine fresh(sim_->env(), builtin_registry(), sink, no_reboot, no_sleep());
  EXPECT_EQ(fresh.run(plan), PlanEngine::Outcome::succeeded) << fresh.status_json().dump(2);
  for (const auto& s : fresh.status_json()["steps"]) EXPECT_EQ(s["skipped"], true) << s.dump(2);
  EXPECT_EQ(effects(sim_->counters()), effects(before));  // the checks only looked

  // The runbook's two test pods: each gets one slice and 1 GiB of the card.
  auto pods_file = dir_.path() / "gpu-test-pods.yaml";
  ASSERT_TRUE(write_file_atomic(pods_file, kTestPods, 0644));
  ASSERT_EQ(kubectl({"apply", "-f", pods_file.string()}).exit_code, 0);
  auto health = agent::collect_k8s_health(sim_->env());
  ASSERT_EQ(health["pods"].size(), 2u) << health.dump(2);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(health["pods"][i]["name"], "gpu-test-" + std::to_string(i + 1));
    EXPECT_EQ(health["pods"][i]["status"], "Running");
    EXPECT_EQ(health["pods"][i]["gpus"], 1);
    EXPECT_EQ(health["pods"][i]["gpumem_mib"], 1024);
  }
  // What the runbook printed from inside the pod, byte for byte.
  auto smi = kubectl({"exec", "gpu-test-1", "--", "nvidia-smi"});
  EXPECT_EQ(smi.output,
            slurp(fixtures_dir() / "l4-runbook/tenant2-pod-nvidia-smi-hami-1024MiB.txt"));
}

TEST_F(GpuK8sTier, WithoutTheLabelStepTheTierStopsAtTheWaitWithHamiPodsPending) {
  make();
  json plan = k8s_plan();
  // The tier as someone might write it without the label step, and a short wait.
  json steps = json::array();
  for (auto& s : plan["steps"])
    if (s["id"] != "label-gpu-node") steps.push_back(s);
  steps.back()["timeout_seconds"] = 4;
  plan["steps"] = steps;
  PlanEngine engine(
      sim_->env(), builtin_registry(), [](json) {}, [] { return ok_status(); }, no_sleep());
  ASSERT_EQ(engine.run(plan), PlanEngine::Outcome::failed);
  auto last = engine.status_json()["steps"].back();
  EXPECT_EQ(last["id"], "gpus-allocatable");
  EXPECT_EQ(last["state"], "failed");
  EXPECT_EQ(last["diagnosis"]["code"], "hami_pods_pending") << last.dump(2);
  EXPECT_EQ(last["diagnosis"]["fix"], "kubectl label node --all gpu=on");
  // Health says the same while it lasts.
  auto health = agent::collect_k8s_health(sim_->env());
  EXPECT_EQ(health["allocatable"], nullptr) << health.dump(2);
  ASSERT_EQ(health["diagnoses"].size(), 1u) << health.dump(2);
  EXPECT_EQ(health["diagnoses"][0]["code"], "hami_pods_pending");
}

TEST_F(GpuK8sTier, HealthCarriesTheGuestClusterAsTheTierSays) {
  make();
  TempDir spool_dir("spool");
  auto spool = agent::EventSpool::open(spool_dir.path(), 1000);
  ASSERT_TRUE(spool) << spool.error().message;
  std::mutex mu;
  std::optional<proto::HealthSample> last;
  {
    agent::AgentRuntimeOptions options;
    options.health.interval = std::chrono::hours(1);  // the plan's end asks for one
    options.engine = no_sleep();
    options.reboot = [] { return ok_status(); };
    agent::AgentRuntime runtime(sim_->env(), **spool, options);
    runtime.set_health_sink([&](const proto::HealthSample& s) {
      std::lock_guard lk(mu);
      last = s;
    });
    runtime.start();
    runtime.on_plan({{"plan", k8s_plan()}});
    bool reported = eventually(
        [&] {
          std::lock_guard lk(mu);
          return last && last->k8s && last->k8s->allocatable.value_or(0) == 10;
        },
        120s, 100ms);
    runtime.stop();
    ASSERT_TRUE(reported) << runtime.plan().summary().dump(2);
  }
  std::lock_guard lk(mu);
  json health = last->to_json();
  EXPECT_EQ(health["k8s"]["allocatable"], 10) << health.dump(2);
  EXPECT_EQ(health["k8s"]["resource"], "nvidia.com/gpu");
  EXPECT_EQ(health["gpu"]["driver_version"], "580.126.20") << health.dump(2);
  EXPECT_EQ(health["gpu"]["via"], "chroot " + (sim_->root() / "run/nvidia/driver").string());
  EXPECT_FALSE(health.contains("ollama")) << "the gpu-k8s tier's health section has no Ollama";
}

}  // namespace
}  // namespace factory::testing
