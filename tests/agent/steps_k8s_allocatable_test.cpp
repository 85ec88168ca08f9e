// The node_label and wait_allocatable steps on the simulated runbook
// tenant-2 guest (tests/guestsim, profile l4-k8s; a SIMULATION, see
// tests/guestsim/README.md), with the catalog's own rke2 and helm_release
// steps bringing the guest cluster, the GPU Operator and HAMi up first.
// HAMi's device plugin only runs on nodes labelled gpu=on; while it runs the
// node advertises nvidia.com/gpu: 10 (the runbook's capture).
#include <gtest/gtest.h>

#include "tests/agent/k8s_harness.hpp"

namespace factory::testing {
namespace {

using namespace std::chrono_literals;

class LabelAndAllocatable : public K8sGuest {
 protected:
  void SetUp() override {
    make();
    done("rke2");
    done("gpu-operator");
  }
};

TEST_F(LabelAndAllocatable, LabelsEveryNodeOnceAndSaysWhatIsMissingOtherwise) {
  auto h = step("label-gpu-node");
  ASSERT_TRUE(h.ok());
  auto c = h.check();
  ASSERT_TRUE(c);
  EXPECT_FALSE(*c);
  auto before = h.verify();
  ASSERT_FALSE(before.ok());
  EXPECT_TRUE(contains(before.message, "tenant-2: gpu=on")) << before.message;

  auto a = h.apply();
  ASSERT_TRUE(a.ok()) << describe(a);
  EXPECT_TRUE(contains(a.message, "node/tenant-2 labeled")) << a.message;
  auto v = h.verify();
  ASSERT_TRUE(v.ok()) << describe(v);
  EXPECT_EQ(v.message, "labelled gpu=on on every node");
  EXPECT_EQ(sim_->counter("kubectl.label"), 1);
  EXPECT_TRUE(contains(sim_->calls_log(), "label node --all gpu=on --overwrite"));
  auto done_now = h.check();
  ASSERT_TRUE(done_now);
  EXPECT_TRUE(*done_now);

  // A label someone set to another value is overwritten.
  ASSERT_EQ(kubectl({"label", "node", "tenant-2", "gpu=off", "--overwrite"}).exit_code, 0);
  auto stale = h.verify();
  EXPECT_TRUE(contains(stale.message, "(has gpu=off)")) << stale.message;
  ASSERT_TRUE(h.apply().ok());
  ASSERT_TRUE(h.verify().ok());

  // Named nodes: one that does not exist is reported, not ignored.
  auto spec = catalog_step("gpu-k8s", "label-gpu-node");
  spec.params["nodes"] = {"tenant-2", "tenant-9"};
  auto named = step(spec);
  auto nv = named.verify();
  ASSERT_FALSE(nv.ok());
  EXPECT_TRUE(contains(nv.message, "tenant-9: no such node")) << nv.message;
  auto na = named.apply();
  ASSERT_FALSE(na.ok());
  EXPECT_TRUE(contains(na.output_tail, "nodes \"tenant-9\" not found")) << na.output_tail;
}

TEST_F(LabelAndAllocatable, TenGpusOnceHamiRunsOnTheLabelledNode) {
  done("label-gpu-node");
  done("hami");
  auto h = step("gpus-allocatable");
  ASSERT_TRUE(h.ok());
  auto c = h.check();
  ASSERT_TRUE(c);
  EXPECT_TRUE(*c);
  auto a = h.apply();
  ASSERT_TRUE(a.ok()) << describe(a);
  EXPECT_EQ(a.message, "10 nvidia.com/gpu allocatable (tenant-2 10)");
  ASSERT_TRUE(h.verify().ok());

  // kubectl shows exactly the runbook's capture.
  auto described = kubectl({"describe", "node"});
  ASSERT_EQ(described.exit_code, 0) << described.output;
  auto at = described.output.find("Allocatable:");
  ASSERT_NE(at, std::string::npos) << described.output;
  std::string block;
  size_t pos = at;
  for (int line = 0; line < 7; ++line) {  // grep -A6 Allocatable
    size_t nl = described.output.find('\n', pos);
    block += described.output.substr(pos, nl - pos + 1);
    pos = nl + 1;
  }
  EXPECT_EQ(block, slurp(fixtures_dir() / "l4-runbook/tenant2-node-allocatable.txt"));
}

TEST_F(LabelAndAllocatable, NoNodeLabelledGpuOnIsHamiPodsPendingWithTheFix) {
  done("hami");  // HAMi in, but the label step skipped
  auto h = step("gpus-allocatable");
  auto c = h.check();
  ASSERT_TRUE(c);
  EXPECT_FALSE(*c);
  auto ctx = h.context(3s);
  auto a = h.step().apply(ctx);
  ASSERT_FALSE(a.ok());
  ASSERT_TRUE(a.diagnosis) << describe(a);
  EXPECT_EQ(a.diagnosis->code, "hami_pods_pending");
  EXPECT_EQ(a.diagnosis->fix, "kubectl label node --all gpu=on");
  EXPECT_EQ(a.diagnosis->details["nodes"][0]["gpu_label"], nullptr);
  // It watched and reported the count while waiting.
  bool progress = false;
  for (const auto& e : h.events) progress |= e.value("allocatable", -1) == 0;
  EXPECT_TRUE(progress);

  // The fix, and the wait ends.
  ASSERT_EQ(kubectl({"label", "node", "--all", "gpu=on", "--overwrite"}).exit_code, 0);
  auto fixed = h.apply();
  ASSERT_TRUE(fixed.ok()) << describe(fixed);
}

TEST_F(LabelAndAllocatable, ACrashingDevicePluginIsNamed) {
  done("label-gpu-node");
  done("hami");
  sim_->set_knob("hami_device_plugin_crash");
  auto h = step("gpus-allocatable");
  auto v = h.verify();
  ASSERT_FALSE(v.ok());
  ASSERT_TRUE(v.diagnosis) << describe(v);
  EXPECT_EQ(v.diagnosis->code, "device_plugin_not_running");
  EXPECT_TRUE(contains(v.diagnosis->summary,
                       "hami-system/hami-device-plugin-9vd4t is "
                       "CrashLoopBackOff"))
      << v.diagnosis->summary;
  EXPECT_TRUE(contains(v.output_tail, "CrashLoopBackOff")) << v.output_tail;
}

TEST_F(LabelAndAllocatable, TheOperatorsOwnDevicePluginBesideHamisIsNamed) {
  // The GPU Operator with its device plugin left on (the catalog turns it off).
  auto spec = catalog_step("gpu-k8s", "gpu-operator");
  spec.params["values"]["devicePlugin"]["enabled"] = true;
  auto op = step(spec);
  ASSERT_TRUE(op.apply().ok());
  done("label-gpu-node");
  done("hami");
  auto h = step("gpus-allocatable");
  auto ctx = h.context(3s);
  auto a = h.step().apply(ctx);
  ASSERT_FALSE(a.ok());
  ASSERT_TRUE(a.diagnosis) << describe(a);
  EXPECT_EQ(a.diagnosis->code, "two_device_plugins");
  EXPECT_TRUE(contains(a.diagnosis->fix, "devicePlugin.enabled: false")) << a.diagnosis->fix;
}

}  // namespace
}  // namespace factory::testing
