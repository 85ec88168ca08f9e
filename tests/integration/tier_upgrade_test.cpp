// Issue 27, point 3, end to end: a gpu-vm tenant provisioned on the catalog's
// driver 615, then the coordinator restarted with a catalog whose driver pin
// is newer (620.12.04, a made-up version: the built-in catalog's text with
// the pin replaced, as an admin's catalog file would be). The real
// `factory serve` and `factory-agent`; the cluster is the Kubernetes API
// double (tests/fakes/kube_apiserver.py) and the guest is simulated
// (tests/guestsim/vm_runner.py boots it from the VM's real user-data; its
// apt-get, dpkg, dkms, reboot and nvidia-smi stand-ins keep the packages,
// the DKMS build and the loaded module's version, and nvidia-smi answers with
// the runbook's captures, the loaded version in place of 615's).
//
//  - The new catalog changes nothing in the guest by itself: `tenant show`
//    says which pins differ, and the agent is not sent the new plan.
//  - `tenant upgrade --dry-run` says the driver step would run and changes
//    nothing; `tenant upgrade --wait` runs it through the simulated reboot
//    and the tenant shows the new pins.
//  - With the new driver's DKMS build failing (knob dkms_fail=620.12.04),
//    the upgrade goes back to 615: the tenant is ready on its old pins, with
//    the reason and the diagnosis.
#include <gtest/gtest.h>

#include "contract/catalog.hpp"
#include "tests/integration/tenant_fixture.hpp"

using namespace factory::testing;
using namespace std::chrono_literals;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr const char* kOld = "615.71.09";
constexpr const char* kNew = "620.12.04";

std::string builtin_with(const std::string& from, const std::string& to) {
  std::string yaml(factory::catalog::builtin_yaml());
  for (auto at = yaml.find(from); at != std::string::npos; at = yaml.find(from, at + to.size()))
    yaml.replace(at, from.size(), to);
  return yaml;
}

std::string pin_of(const json& tenant, const std::string& what) {
  for (const auto& p : tenant["tier_pins"].value("pins", json::array()))
    if (p.value("what", "") == what) return p.value("version", "");
  return "";
}

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

class TierUpgrade : public Tenants {
 protected:
  void SetUp() override {
    Tenants::SetUp();
    catalog_ = dir_.path() / "catalog.yaml";
    write_text(catalog_, std::string(factory::catalog::builtin_yaml()));
    // The coordinator reads the catalog file at start, as `catalog:` says.
    h_ = std::make_unique<CoordinatorHarness>(
        dir_.path(),
        "kube:\n  kubeconfig: " + kube_.kubeconfig() + "\ncatalog: " + catalog_.string() + "\n");
    h_->start();
    allowlist();
    guests_ = dir_.path() / "guests";
    runner_ = std::make_unique<Process>(
        std::vector<std::string>{"/usr/bin/python3",
                                 (source_dir() / "tests/guestsim/vm_runner.py").string(),
                                 "--kubeconfig", kube_.kubeconfig(), "--work", guests_.string(),
                                 "--agent-arg=--heartbeat", "--agent-arg=1",
                                 "--agent-arg=--retry-delay", "--agent-arg=0.2"},
        dir_.path() / "vm-runner.log");
    auto r = create("tenant-1", "gpu-vm", {"--wait", "--timeout", "120s"});
    ASSERT_EQ(r.exit_code, 0) << r.output << "\n" << slurp(guests_ / "tenant-1" / "agent.log");
  }

  void TearDown() override {
    if (runner_) runner_->stop();
    EXPECT_EQ(slurp(root() / ".guestsim" / "log" / "guarded.log"), "")
        << "commands reached the simulated guest's guards";
  }

  fs::path root() const { return guests_ / "tenant-1" / "root"; }
  int counter(const std::string& name) const {
    auto p = root() / ".guestsim" / "state" / "counters" / name;
    return fs::exists(p) ? std::stoi(slurp(p)) : 0;
  }
  std::string loaded_module() const {
    return trimmed(slurp(root() / "sys" / "module" / "nvidia" / "version"));
  }
  std::string package(const std::string& name) const {
    return slurp(root() / ".guestsim" / "state" / "dpkg" / name);
  }
  std::string agent_log() const { return slurp(guests_ / "tenant-1" / "agent.log"); }

  // The coordinator started again with the newer catalog; the agent reconnected.
  void newer_catalog() {
    write_text(catalog_, builtin_with(kOld, kNew));
    h_->stop();
    h_->start();
    ASSERT_TRUE(eventually([&] { return h_->agent_connected("tenant-1"); }, 30s));
  }

  fs::path catalog_, guests_;
  std::unique_ptr<Process> runner_;
};

TEST_F(TierUpgrade, ANewDriverRunsThroughItsRebootAndTheTenantShowsTheNewPins) {
  auto t = show("tenant-1");
  EXPECT_EQ(pin_of(t, "NVIDIA driver"), kOld);
  EXPECT_FALSE(t["tier_pins"].value("differs", true)) << t["tier_pins"].dump(2);
  const std::string old_hash = t["tier_pins"]["plan_hash"];
  ASSERT_EQ(counter("reboot"), 1);

  newer_catalog();
  // Give a plan sent at hello the time to run, were one sent: none must be.
  std::this_thread::sleep_for(3s);
  t = show("tenant-1");
  EXPECT_EQ(t["phase"], "ready");
  EXPECT_EQ(pin_of(t, "NVIDIA driver"), kOld) << "the tenant still runs its own pins";
  EXPECT_TRUE(t["tier_pins"].value("differs", false));
  EXPECT_EQ(t["tier_pins"]["changes"]["runs"], json::array({"nvidia-driver"}));
  EXPECT_EQ(t["tier_pins"]["changes"]["pins"][0],
            json({{"what", "NVIDIA driver"}, {"from", kOld}, {"to", kNew}}));
  EXPECT_EQ(counter("reboot"), 1) << "a new catalog alone changes nothing in the guest";
  EXPECT_EQ(counter("apt-get.install.nvidia-headless-open"), 1);
  auto table = h_->factory({"tenant", "show", "tenant-1"});
  EXPECT_NE(table.output.find(std::string("NVIDIA driver ") + kOld + "  (catalog: " + kNew + ")"),
            std::string::npos)
      << table.output;

  auto dry = h_->factory({"tenant", "upgrade", "tenant-1", "--dry-run", "-o", "json"});
  ASSERT_EQ(dry.exit_code, 0) << dry.output;
  auto d = json::parse(dry.output);
  EXPECT_EQ(d["runs"], json::array({"nvidia-driver"}));
  EXPECT_EQ(d["from_hash"], old_hash);
  EXPECT_TRUE(d["steps"][0]["can_go_back"]);
  EXPECT_FALSE(d["upgraded"]);
  EXPECT_EQ(counter("apt-get.install.nvidia-headless-open"), 1) << "the dry run changed nothing";
  EXPECT_FALSE(show("tenant-1").contains("tier_upgrade"));

  auto up = h_->factory({"tenant", "upgrade", "tenant-1", "--wait", "--timeout", "120s"}, 150s);
  ASSERT_EQ(up.exit_code, 0) << up.output << "\n" << agent_log();
  t = show("tenant-1");
  EXPECT_EQ(t["phase"], "ready");
  EXPECT_EQ(t["tier_upgrade"]["state"], "succeeded") << t["tier_upgrade"].dump(2);
  EXPECT_EQ(pin_of(t, "NVIDIA driver"), kNew);
  EXPECT_FALSE(t["tier_pins"].value("differs", true));
  EXPECT_EQ(t["tier_pins"]["plan_hash"], t["tier_upgrade"]["to_hash"]);
  // In the guest: the new packages, held, the new module loaded after one
  // more reboot; Ollama and the model untouched.
  EXPECT_EQ(counter("reboot"), 2);
  EXPECT_EQ(loaded_module(), kNew);
  EXPECT_NE(package("nvidia-headless-open").find("hold ok installed\nVersion: 620.12.04-1ubuntu1"),
            std::string::npos)
      << package("nvidia-headless-open");
  EXPECT_EQ(counter("ollama.install"), 1);
  EXPECT_EQ(counter("ollama.pull_request.llama3.2:1b"), 1);

  // Journaled by the agent before it acted: its tier_upgrade "started" is
  // stored before the first progress of the new plan.
  std::vector<std::string> trail;
  for (const auto& e : h_->stored_events("tenant-1")) {
    const json& ev = e["event"];
    if (ev.value("kind", "") == "tier_upgrade")
      trail.push_back("tier_upgrade:" + ev.value("state", ""));
    if (ev.value("kind", "") == "progress" &&
        ev.value("plan_hash", "") == t["tier_upgrade"]["to_hash"])
      trail.push_back("progress");
  }
  ASSERT_GE(trail.size(), 3u);
  EXPECT_EQ(trail.front(), "tier_upgrade:started");
  EXPECT_EQ(trail.back(), "tier_upgrade:succeeded");

  // Nothing left to do.
  auto again = h_->factory({"tenant", "upgrade", "tenant-1"});
  EXPECT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("nothing to upgrade"), std::string::npos) << again.output;
}

TEST_F(TierUpgrade, ANewDriverThatFailsGoesBackTo615AndTheTenantStaysReady) {
  const std::string old_hash = show("tenant-1")["tier_pins"]["plan_hash"];
  newer_catalog();
  // The new driver's module does not build against the guest's kernel.
  write_text(root() / ".guestsim" / "knobs" / "dkms_fail", kNew);

  auto up = h_->factory({"tenant", "upgrade", "tenant-1", "--wait", "--timeout", "120s"}, 150s);
  EXPECT_EQ(up.exit_code, 1) << up.output << "\n" << agent_log();
  EXPECT_NE(up.output.find("went back: the tenant is ready on its previous pins"),
            std::string::npos)
      << up.output;
  EXPECT_NE(up.output.find("dkms_build_failed"), std::string::npos) << up.output;

  auto t = show("tenant-1");
  EXPECT_EQ(t["phase"], "ready");
  const json& u = t["tier_upgrade"];
  EXPECT_EQ(u["state"], "rolled_back") << u.dump(2);
  EXPECT_EQ(u["failed_step"], "nvidia-driver");
  EXPECT_EQ(u["diagnosis"]["code"], "dkms_build_failed");
  EXPECT_NE(u.value("message", "").find("step 'nvidia-driver' failed"), std::string::npos)
      << u.dump(2);
  EXPECT_EQ(t["tier_pins"]["plan_hash"], old_hash) << "still pinned to the previous plan";
  EXPECT_EQ(pin_of(t, "NVIDIA driver"), kOld);
  EXPECT_TRUE(t["tier_pins"].value("differs", false));
  EXPECT_EQ(t["plan"]["hash"], old_hash) << "the agent's journal is back on it";
  EXPECT_EQ(t["plan"]["state"], "succeeded");

  // In the guest: 615's packages back and held, its module loaded.
  EXPECT_EQ(loaded_module(), kOld);
  EXPECT_NE(package("nvidia-headless-open").find("hold ok installed\nVersion: 615.71.09-1ubuntu1"),
            std::string::npos)
      << package("nvidia-headless-open");
  EXPECT_NE(package("nvidia-persistenced").find("hold ok installed\nVersion: 615.71.09-1ubuntu1"),
            std::string::npos)
      << package("nvidia-persistenced");
  EXPECT_NE(package("nvidia-dkms-open").find("install ok installed\nVersion: 615.71.09-1ubuntu1"),
            std::string::npos)
      << package("nvidia-dkms-open");
  auto smi = run({"bash", "-c",
                  "PATH=" + (root() / ".guestsim/installed-bin").string() + ":" +
                      (root() / ".guestsim/bin").string() + ":" +
                      (root() / ".guestsim/host-bin").string() +
                      " nvidia-smi --query-gpu=driver_version --format=csv,noheader"});
  EXPECT_EQ(trimmed(smi.output), kOld) << smi.output;

  // A second try, with the cause fixed, lands on the new pins.
  fs::remove(root() / ".guestsim" / "knobs" / "dkms_fail");
  auto again = h_->factory({"tenant", "upgrade", "tenant-1", "--wait", "--timeout", "120s"}, 150s);
  EXPECT_EQ(again.exit_code, 0) << again.output << "\n" << agent_log();
  EXPECT_EQ(loaded_module(), kNew);
  EXPECT_EQ(pin_of(show("tenant-1"), "NVIDIA driver"), kNew);
}
