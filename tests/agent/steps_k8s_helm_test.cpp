// The helm_release step (the catalog's gpu-operator and hami releases) on
// the simulated runbook tenant-2 guest (tests/guestsim, profile l4-k8s; a
// SIMULATION: helm, its installer, the chart repositories and what the
// charts run are stand-ins, see tests/guestsim/README.md), after the
// catalog's own rke2 step brought the guest cluster up.
#include <gtest/gtest.h>

#include "agent/health/gpu_health.hpp"
#include "agent/steps/helm_release.hpp"
#include "common/atomic_file.hpp"
#include "common/durations.hpp"
#include "common/yaml_json.hpp"
#include "tests/agent/k8s_harness.hpp"

namespace factory::testing {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

TEST(HelmChartVersion, ComparesWithoutTheLeadingV) {
  using agent::steps::same_chart_version;
  EXPECT_TRUE(same_chart_version("v26.3.2", "v26.3.2"));
  EXPECT_TRUE(same_chart_version("26.3.2", "v26.3.2"));
  EXPECT_TRUE(same_chart_version("2.10.0", "2.10.0"));
  EXPECT_FALSE(same_chart_version("2.9.0", "2.10.0"));
  EXPECT_FALSE(same_chart_version("", ""));
}

class HelmStep : public K8sGuest {
 protected:
  void SetUp() override {
    make();
    done("rke2");
  }
  json helm_json(std::vector<std::string> args) {
    args.insert(args.begin(), "helm");
    args.insert(args.end(), {"-o", "json", "--kubeconfig",
                             (sim_->root() / "etc/rancher/rke2/rke2.yaml").string()});
    auto r = sim_->sh(args);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return json::parse(r.output, nullptr, false);
  }
  std::filesystem::path release_file(const std::string& ns, const std::string& name) {
    return sim_->root() / ".guestsim/state/helm/releases" / (ns + "__" + name + ".json");
  }
};

TEST_F(HelmStep, GpuOperatorInstallsHelmThenThePinnedChartWithTheCatalogsValues) {
  auto h = step("gpu-operator");
  ASSERT_TRUE(h.ok());
  auto c = h.check();
  ASSERT_TRUE(c);
  EXPECT_FALSE(*c);  // no helm yet

  auto a = h.apply();
  ASSERT_TRUE(a.ok()) << describe(a);
  auto v = h.verify();
  ASSERT_TRUE(v.ok()) << describe(v);
  EXPECT_TRUE(contains(v.message, "deployed, chart gpu-operator v26.3.2")) << v.message;

  EXPECT_EQ(sim_->counter("curl.helm-v3.19.0-linux-amd64.tar.gz"), 1);  // the pinned tarball
  EXPECT_EQ(sim_->counter("helm.install.gpu-operator"), 1);
  auto calls = sim_->calls_log();
  EXPECT_TRUE(contains(calls,
                       "helm repo add nvidia https://nvidia.github.io/gpu-operator "
                       "--force-update"))
      << calls;
  EXPECT_TRUE(contains(calls,
                       "helm upgrade --install gpu-operator nvidia/gpu-operator --version "
                       "v26.3.2 --namespace gpu-operator --create-namespace -f "))
      << calls;
  EXPECT_TRUE(contains(calls, "--wait --timeout ")) << calls;

  // The values went in as the catalog has them, through a 0600 file in the
  // agent's state directory, and helm reports them back unchanged.
  auto spec = catalog_step("gpu-k8s", "gpu-operator");
  auto values_file = sim_->env().state_dir / "helm/gpu-operator.values.yaml";
  EXPECT_EQ(std::filesystem::status(values_file).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  auto parsed = parse_yaml(slurp(values_file), "values");
  ASSERT_TRUE(parsed);
  EXPECT_EQ(*parsed, spec.params["values"]);
  EXPECT_EQ(helm_json({"get", "values", "gpu-operator", "-n", "gpu-operator"}),
            spec.params["values"]);
  EXPECT_EQ(spec.params["values"]["devicePlugin"]["enabled"], false);

  // The operator's driver container now runs the card: nvidia-smi through
  // its root, at the operator's driver version (the runbook's 580.126.20).
  auto gpu = agent::collect_gpu_health(sim_->env());
  EXPECT_EQ(gpu["driver_version"], "580.126.20") << gpu.dump(2);
  EXPECT_EQ(gpu["via"], "chroot " + (sim_->root() / "run/nvidia/driver").string());

  // Done: nothing more.
  auto done_now = h.check();
  ASSERT_TRUE(done_now);
  EXPECT_TRUE(*done_now);
}

TEST_F(HelmStep, ChangedValuesMakeTheReleaseStaleAndApplyUpgradesIt) {
  done("gpu-operator");
  auto spec = catalog_step("gpu-k8s", "gpu-operator");
  // (driver.version is the catalog's pin already: another value changes.)
  spec.params["values"]["dcgmExporter"] = {{"enabled", false}};
  auto h = step(spec);
  auto c = h.check();
  ASSERT_TRUE(c);
  EXPECT_FALSE(*c);
  auto a = h.apply();
  ASSERT_TRUE(a.ok()) << describe(a);
  ASSERT_TRUE(h.verify().ok());
  EXPECT_EQ(sim_->counter("helm.install.gpu-operator"), 2);
  EXPECT_EQ(sim_->counter("curl.helm-v3.19.0-linux-amd64.tar.gz"), 1);
  auto status = helm_json({"status", "gpu-operator", "-n", "gpu-operator"});
  EXPECT_EQ(status["version"], 2);
  EXPECT_EQ(status["config"]["dcgmExporter"]["enabled"], false);
  EXPECT_EQ(status["config"]["driver"]["version"], "580.126.20");
}

// Helm comes from its release tarball, pinned by sha256 (the catalog's
// get.helm.sh sums for v3.19.0). The stand-in tarball is real gzip'd tar; the
// sha256sum stand-in reports the real release's sum for it only while it is
// the bytes curl served (tests/guestsim/bin/curl, bin/sha256sum).
const char* const kHelmAmd64Sum =
    "a7f81ce08007091b86d8bd696eb4d86b8d0f2e1b9f6c714be62f82f96a594496";

TEST_F(HelmStep, AnAlteredHelmTarballIsRefusedBeforeAnythingIsUnpacked) {
  sim_->set_knob("curl_corrupt", "helm-v3.19.0-linux-amd64.tar.gz");
  auto a = step("gpu-operator").apply();
  ASSERT_FALSE(a.ok());
  ASSERT_TRUE(a.diagnosis) << describe(a);
  EXPECT_EQ(a.diagnosis->code, "checksum_mismatch") << describe(a);
  EXPECT_EQ(a.diagnosis->details["url"], "https://get.helm.sh/helm-v3.19.0-linux-amd64.tar.gz");
  EXPECT_EQ(a.diagnosis->details["want"], kHelmAmd64Sum);
  auto got = a.diagnosis->details["got"].get<std::string>();
  EXPECT_EQ(got.size(), 64u) << got;
  EXPECT_NE(got, kHelmAmd64Sum);
  // Nothing of it reached PATH, and no chart was installed.
  EXPECT_FALSE(std::filesystem::exists(sim_->root() / "usr/local/bin/helm"));
  EXPECT_FALSE(std::filesystem::exists(sim_->root() / "usr/local/bin/.helm.new"));
  EXPECT_EQ(sim_->counter("helm.install.gpu-operator"), 0);

  // The mirror fixed, a retry installs it.
  sim_->clear_knob("curl_corrupt");
  auto again = step("gpu-operator").apply();
  EXPECT_TRUE(again.ok()) << describe(again);
  EXPECT_EQ(sim_->counter("curl.helm-v3.19.0-linux-amd64.tar.gz"), 2);
}

TEST_F(HelmStep, AHelmOfAnotherVersionIsReplacedByThePinnedOne) {
  // A helm the customer (or an older plan) left in /usr/local/bin.
  auto bin = sim_->root() / "usr/local/bin";
  std::filesystem::create_directories(bin);
  ASSERT_TRUE(write_file_atomic(bin / "helm",
                                "#!/bin/bash\nFACTORY_GUESTSIM_ROOT='" + sim_->root().string() +
                                    "' GUESTSIM_HELM_VERSION=v3.14.4 exec '" +
                                    (source_dir() / "tests/guestsim/opt/helm").string() +
                                    "' \"$@\"\n",
                                0700));
  auto before = sim_->sh({"helm", "version", "--short"});
  ASSERT_EQ(before.output, "v3.14.4\n");

  auto h = step("gpu-operator");
  auto c = h.check();
  ASSERT_TRUE(c);
  EXPECT_FALSE(*c);
  auto a = h.apply();
  ASSERT_TRUE(a.ok()) << describe(a);
  EXPECT_EQ(sim_->sh({"helm", "version", "--short"}).output, "v3.19.0\n");
  EXPECT_EQ(std::filesystem::status(bin / "helm").permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_all | std::filesystem::perms::group_read |
                std::filesystem::perms::group_exec | std::filesystem::perms::others_read |
                std::filesystem::perms::others_exec);
  auto again = h.check();
  ASSERT_TRUE(again);
  EXPECT_TRUE(*again);
}

TEST_F(HelmStep, AHelmVersionTheServerDoesNotHaveIsADownloadFailure) {
  auto spec = catalog_step("gpu-k8s", "gpu-operator");
  spec.params["helm_version"] = "v3.99.0";
  auto a = step(spec).apply();
  ASSERT_FALSE(a.ok());
  ASSERT_TRUE(a.diagnosis) << describe(a);
  EXPECT_EQ(a.diagnosis->code, "download_failed") << describe(a);
  EXPECT_TRUE(contains(a.output_tail, "404")) << describe(a);
}

TEST_F(HelmStep, AVersionTheRepositoryDoesNotHaveFailsWithHelmsWords) {
  auto spec = catalog_step("gpu-k8s", "hami");
  spec.params["version"] = "9.9.9";
  auto a = step(spec).apply();
  ASSERT_FALSE(a.ok());
  ASSERT_TRUE(a.diagnosis) << describe(a);
  EXPECT_EQ(a.diagnosis->code, "helm_release_failed");
  EXPECT_TRUE(contains(a.diagnosis->summary, "chart \"hami\" matching 9.9.9 not found"))
      << a.diagnosis->summary;
  EXPECT_EQ(sim_->counter("helm.install.hami"), 0);
}

TEST_F(HelmStep, AFailedInstallIsDiagnosedAndARetryUpgradesInPlace) {
  sim_->set_knob("helm_install_fail", "gpu-operator");
  auto h = step("gpu-operator");
  auto a = h.apply();
  ASSERT_FALSE(a.ok());
  ASSERT_TRUE(a.diagnosis) << describe(a);
  EXPECT_EQ(a.diagnosis->code, "helm_release_failed");
  EXPECT_EQ(a.diagnosis->details["status"], "failed");
  EXPECT_EQ(a.diagnosis->details["error"], "INSTALLATION FAILED: context deadline exceeded");
  EXPECT_TRUE(contains(a.output_tail, "Error: INSTALLATION FAILED")) << a.output_tail;
  auto c = h.check();
  ASSERT_TRUE(c);
  EXPECT_FALSE(*c);

  sim_->clear_knob("helm_install_fail");
  auto again = h.apply();
  ASSERT_TRUE(again.ok()) << describe(again);
  ASSERT_TRUE(h.verify().ok());
  EXPECT_EQ(sim_->counter("helm.install.gpu-operator"), 2);
}

TEST_F(HelmStep, HamiWaitingForTheOperatorsToolkitFailsTheWaitWithThePodSaid) {
  // HAMi before the GPU Operator, on a labelled node: its device plugin's
  // init container waits for the toolkit (gpuOperatorToolkitReady), so
  // `helm --wait` cannot finish.
  done("label-gpu-node");
  auto a = step("hami").apply();
  ASSERT_FALSE(a.ok());
  ASSERT_TRUE(a.diagnosis) << describe(a);
  EXPECT_EQ(a.diagnosis->code, "helm_release_failed");
  auto pods = a.diagnosis->details["pods_not_ready"];
  ASSERT_EQ(pods.size(), 1u) << pods.dump(2);
  EXPECT_EQ(pods[0]["name"], "hami-device-plugin-9vd4t");
  EXPECT_EQ(pods[0]["status"], "Init:0/1");
  EXPECT_TRUE(contains(a.output_tail, "hami-system/hami-device-plugin-9vd4t Init:0/1"))
      << a.output_tail;

  // With the operator in, the retry (an upgrade of the failed release) works.
  done("gpu-operator");
  auto h = step("hami");
  auto again = h.apply();
  ASSERT_TRUE(again.ok()) << describe(again);
  ASSERT_TRUE(h.verify().ok());
}

TEST_F(HelmStep, AReleaseLeftPendingByAKilledHelmIsCleanedUpOnceThatHelmCannotBeRunning) {
  done("gpu-operator");
  // What a helm killed during its first install leaves: pending-install,
  // started long before its --timeout could still be running.
  auto f = release_file("gpu-operator", "gpu-operator");
  auto rel = json::parse(slurp(f));
  rel["status"] = "pending-install";
  rel["revision"] = 1;
  rel["last_deployed"] = rel["last_deployed"].get<double>() - 3 * 3600;
  ASSERT_TRUE(write_file_atomic(f, rel.dump(), 0644));

  auto h = step("gpu-operator");
  auto c = h.check();
  ASSERT_TRUE(c);
  EXPECT_FALSE(*c);
  auto a = h.apply();
  ASSERT_TRUE(a.ok()) << describe(a);
  ASSERT_TRUE(h.verify().ok());
  EXPECT_EQ(sim_->counter("helm.uninstall.gpu-operator"), 1);
  EXPECT_EQ(sim_->counter("helm.install.gpu-operator"), 2);
}

TEST_F(HelmStep, AReleaseLeftPendingRecentlyIsRolledBackWhenNoHelmRuns) {
  done("gpu-operator");
  // A helm killed during an upgrade a moment ago (the agent's unit was
  // stopped, and systemd ended the helm it had started with it).
  auto f = release_file("gpu-operator", "gpu-operator");
  auto rel = json::parse(slurp(f));
  rel["status"] = "pending-upgrade";
  rel["previous"] = {{"chart_version", rel["chart_version"]},
                     {"app_version", rel["app_version"]},
                     {"values", rel["values"]},
                     {"revision", 1}};
  rel["revision"] = 2;
  ASSERT_TRUE(write_file_atomic(f, rel.dump(), 0644));
  auto h = step("gpu-operator");
  auto a = h.apply();
  ASSERT_TRUE(a.ok()) << describe(a);
  EXPECT_EQ(sim_->counter("helm.rollback.gpu-operator"), 1);
  // The rollback restored the deployed revision, which is what the plan
  // wants: no upgrade after it.
  EXPECT_TRUE(contains(a.message, "already deployed")) << a.message;
  EXPECT_EQ(sim_->counter("helm.install.gpu-operator"), 1);
  ASSERT_TRUE(h.verify().ok());
}

TEST_F(HelmStep, AReleaseStillPendingUnderARunningHelmIsNotTouched) {
  done("gpu-operator");
  auto f = release_file("gpu-operator", "gpu-operator");
  auto rel = json::parse(slurp(f));
  rel["status"] = "pending-upgrade";
  ASSERT_TRUE(write_file_atomic(f, rel.dump(), 0644));
  // A helm process in the guest (the simulated guest's /proc holds only
  // what a test puts there).
  std::filesystem::create_directories(sim_->root() / "proc/4242");
  ASSERT_TRUE(write_file_atomic(sim_->root() / "proc/4242/comm", "helm\n", 0644));

  auto h = step("gpu-operator");
  auto ctx = h.context(30s);  // less than the helm's own timeout can still take
  auto a = h.step().apply(ctx);
  ASSERT_FALSE(a.ok());
  ASSERT_TRUE(a.diagnosis) << describe(a);
  EXPECT_EQ(a.diagnosis->code, "helm_operation_in_progress");
  EXPECT_EQ(a.diagnosis->details["status"], "pending-upgrade");
  EXPECT_EQ(sim_->counter("helm.rollback.gpu-operator"), 0);
  EXPECT_EQ(sim_->counter("helm.install.gpu-operator"), 1);
}

TEST_F(HelmStep, TheOperatorsDriverMustBeThePinnedOne) {
  done("rke2");
  auto spec = catalog_step("gpu-k8s", "gpu-operator");
  ASSERT_EQ(spec.params["driver_version"], "580.126.20");
  ASSERT_EQ(spec.params["values"]["driver"]["version"], "580.126.20");
  // A pin the driver container does not run (the simulator has only the
  // runbook's 580.126.20): the release deploys, the check in its nvidia-smi fails.
  spec.params["driver_version"] = "580.159.04";
  spec.params["values"]["driver"]["version"] = "580.159.04";
  auto h = step(spec);
  auto a = h.apply();
  ASSERT_TRUE(a.ok()) << describe(a);
  auto v = h.verify(std::chrono::seconds(6));
  ASSERT_FALSE(v.ok()) << describe(v);
  EXPECT_TRUE(contains(v.message,
                       "the GPU Operator's driver is not the pinned 580.159.04: "
                       "nvidia-smi in "))
      << v.message;
}

TEST_F(HelmStep, NoClusterYetSaysSo) {
  ASSERT_EQ(sim_->sh({"rke2-killall.sh"}).exit_code, 0);
  ASSERT_EQ(sim_->sh({"rke2-uninstall.sh"}).exit_code, 0);
  auto h = step("gpu-operator");
  auto c = h.check();
  ASSERT_TRUE(c);
  EXPECT_FALSE(*c);
  auto a = h.apply();
  ASSERT_FALSE(a.ok());
  EXPECT_TRUE(contains(a.message, "rke2.yaml does not exist")) << describe(a);
  EXPECT_EQ(sim_->counter("helm.install.gpu-operator"), 0);
}

}  // namespace
}  // namespace factory::testing
