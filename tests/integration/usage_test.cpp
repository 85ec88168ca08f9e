// GPU usage end to end (issue 28, docs/usage.md): the real `factory serve`
// against the Kubernetes API test double playing KubeVirt (its VMIs'
// phaseTransitionTimestamps as virt-controller writes them), looking at each
// VM every second (usage.observe_every: 1s). A VM's GPU-seconds are the
// double's own Running intervals, across a coordinator killed with SIGKILL
// and started again, a drain and an undrain (a new VMI), and a delete (the
// usage archived); a project's quota refuses the create past it with the
// numbers. No guest is needed: the double runs a VMI whether or not a guest
// boots in it.
#include <gtest/gtest.h>

#include <thread>

#include "tests/integration/tenant_fixture.hpp"

using namespace factory::testing;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

class Usage : public Tenants {
 protected:
  CoordinatorHarness& serve() {
    if (!h_) {
      allowlist();
      h_ = std::make_unique<CoordinatorHarness>(
          dir_.path(), "kube:\n  kubeconfig: " + kube_.kubeconfig() +
                           "\nusage:\n  observe_every: 1s\nquotas:\n  projects:\n    ml:\n"
                           "      gpus:\n        nvidia.com/AD104GL_L4: 1\n");
      h_->start();
    }
    return *h_;
  }
  json vmi(const std::string& t) {
    return kube_.get("/apis/kubevirt.io/v1/namespaces/tenants/virtualmachineinstances/" + t);
  }
  std::string running_vmi(const std::string& t) {
    json v = vmi(t);
    if (!v.is_object() || v.value("/status/phase"_json_pointer, std::string()) != "Running")
      return "";
    return v.value("/metadata/uid"_json_pointer, std::string());
  }
  // The double's own times (time.time()) of a VM's events: "started" (a VMI
  // reached Running), "stopped" (the VMI was removed).
  std::vector<double> times(const std::string& t, const std::string& event) {
    std::vector<double> out;
    for (const auto& e : kube_.control("/_fake/vm-log").value("entries", json::array()))
      if (e.value("vm", "") == "tenants/" + t && e.value("event", "") == event)
        out.push_back(e.value("time", 0.0));
    return out;
  }
  double gpu_seconds(const std::string& t, bool* deleted = nullptr) {
    auto r = serve().factory({"usage", "--tenant", t, "--since", "1h", "-o", "json"});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    json j = json::parse(r.output, nullptr, false);
    double s = 0;
    if (!j.is_object()) return -1;
    for (const auto& row : j["tenants"]) {
      s += row.value("gpu_seconds", 0.0);
      if (deleted) *deleted = row.contains("deleted_at");
    }
    return s;
  }
  static double now() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
};

TEST_F(Usage, GpuSecondsAreTheProvidersRunningTimeAcrossAKillADrainAndADelete) {
  auto& h = serve();
  auto c = create("t1", "gpu-vm", {"--project", "ml"});
  ASSERT_EQ(c.exit_code, 0) << c.output;
  ASSERT_TRUE(eventually([&] { return !running_vmi("t1").empty(); }, 30s, 100ms)) << vmi("t1");
  const std::string first = running_vmi("t1");
  std::this_thread::sleep_for(4s);
  const double start1 = times("t1", "started").at(0);
  EXPECT_NEAR(gpu_seconds("t1"), now() - start1, 2.5);

  // Killed; down 5 s while the VM runs on; back, the same VMI's interval goes on.
  h.kill9();
  std::this_thread::sleep_for(5s);
  h.start();
  std::this_thread::sleep_for(3s);
  const double after_restart = gpu_seconds("t1");
  EXPECT_NEAR(after_restart, now() - start1, 2.5) << "the downtime counted once, nothing twice";

  // Drained: the VM stops; nothing is counted while it is off.
  auto d = h.factory({"host", "drain", "utho", "--notice", "1s", "--no-wait"});
  ASSERT_EQ(d.exit_code, 0) << d.output;
  ASSERT_TRUE(eventually([&] { return !times("t1", "stopped").empty(); }, 60s, 200ms)) << h.log();
  const double stop1 = times("t1", "stopped").at(0);
  std::this_thread::sleep_for(3s);
  const double drained = gpu_seconds("t1");
  EXPECT_NEAR(drained, stop1 - start1, 2.5);
  std::this_thread::sleep_for(3s);
  EXPECT_NEAR(gpu_seconds("t1"), drained, 0.5) << "counted while drained";

  // Undrained: a new VMI, a new interval.
  auto u = h.factory({"host", "undrain", "utho", "--no-wait"});
  ASSERT_EQ(u.exit_code, 0) << u.output;
  ASSERT_TRUE(eventually(
      [&] {
        auto r = running_vmi("t1");
        return !r.empty() && r != first;
      },
      60s, 200ms))
      << h.log();
  std::this_thread::sleep_for(4s);
  const double start2 = times("t1", "started").at(1);

  // Deleted: archived with its record, still reported for the window.
  auto del = h.factory({"tenant", "delete", "t1"});
  ASSERT_EQ(del.exit_code, 0) << del.output;
  ASSERT_TRUE(eventually([&] { return times("t1", "stopped").size() >= 2; }, 60s, 200ms));
  const double stop2 = times("t1", "stopped").at(1);
  bool deleted = false;
  const double total = gpu_seconds("t1", &deleted);
  EXPECT_TRUE(deleted);
  const double truth = (stop1 - start1) + (stop2 - start2);
  std::printf("GPU-seconds counted %.0f, the double's Running time %.1f (kill -9, drain, delete)\n",
              total, truth);
  EXPECT_NEAR(total, truth, 3.0);
  // The table says the same, and the deleted tenant is marked.
  auto table = h.factory({"usage", "--since", "1h"});
  EXPECT_EQ(table.exit_code, 0) << table.output;
  EXPECT_NE(table.output.find("t1 (deleted)"), std::string::npos) << table.output;
  auto csv = h.factory({"usage", "--since", "1h", "-o", "csv"});
  EXPECT_EQ(csv.output.rfind("tenant,project,tier,gpu_model,gpu_seconds,", 0), 0u) << csv.output;
}

TEST_F(Usage, AProjectsQuotaRefusesTheCreatePastItWithTheNumbers) {
  serve();
  auto a = create("q1", "gpu-vm", {"--project", "ml"});
  ASSERT_EQ(a.exit_code, 0) << a.output;
  auto b = create("q2", "gpu-vm", {"--project", "ml"});
  EXPECT_EQ(b.exit_code, 1) << b.output;
  EXPECT_NE(b.output.find("project ml: 1 of 1 nvidia.com/AD104GL_L4 in use"), std::string::npos)
      << b.output;
  // Nothing of the refused one was made; another project has its own count.
  EXPECT_FALSE(vmi("q2").value("kind", "") == "VirtualMachineInstance");
  auto c = create("q3", "gpu-vm");
  EXPECT_EQ(c.exit_code, 0) << c.output;
  // Bad input is a usage error, before any request.
  auto bad = serve().factory({"usage", "--since", "yesterday"});
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  auto badp = create("q4", "gpu-vm", {"--project", "ML"});
  EXPECT_EQ(badp.exit_code, 2) << badp.output;
}

}  // namespace
