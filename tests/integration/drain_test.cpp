// Host maintenance end to end (issue 27): `factory host drain utho`
// --dry-run lists every tenant and changes nothing; the drain cordons the
// node, gives each guest notice, then has KubeVirt shut each VM down;
// `undrain` uncordons it and brings every tenant back to ready on the same
// disk and identity; a coordinator killed with SIGKILL in the middle of
// either carries on from its journals.
//
// Doubles: the cluster is the Kubernetes API test double
// (tests/fakes/kube_apiserver.py), playing KubeVirt's runStrategy, its
// graceful VMI shutdown and the Node's cordon; the guests are simulated
// (tests/guestsim/vm_runner.py boots each from its VM's real user-data, runs
// the real factory-agent, shuts it down when KubeVirt stops the VMI and
// boots the same root again for a new VMI). The order "notice before stop"
// is read from the guest's own logs (the `wall` stand-in's, the agent's
// notice file and event) and from the double's.
#include <gtest/gtest.h>

#include "tests/integration/event_reader.hpp"
#include "tests/integration/tenant_fixture.hpp"

using namespace factory::testing;
using namespace std::chrono_literals;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

class Drain : public Tenants {
 protected:
  explicit Drain(std::vector<std::string> kube_args = {"--vfio-cards", "10DE:27B8=2"})
      : Tenants(std::move(kube_args)) {}
  void start_guests(bool runbook_host = true) {
    if (runbook_host) allowlist();
    coordinator();
    runner_ = std::make_unique<Process>(
        std::vector<std::string>{"/usr/bin/python3",
                                 (source_dir() / "tests/guestsim/vm_runner.py").string(),
                                 "--kubeconfig", kube_.kubeconfig(), "--work", guests().string(),
                                 "--agent-arg=--heartbeat", "--agent-arg=1"},
        dir_.path() / "vm-runner.log");
  }
  fs::path guests() const { return dir_.path() / "guests"; }

  // Two gpu-vm tenants on the node's two L4s, both ready.
  void two_ready_tenants() {
    for (const char* t : {"tenant-1", "tenant-2"}) {
      auto r = create(t, "gpu-vm");
      ASSERT_EQ(r.exit_code, 0) << r.output;
    }
    for (const char* t : {"tenant-1", "tenant-2"})
      ASSERT_TRUE(eventually([&] { return show(t)["phase"] == "ready"; }, 120s, 250ms))
          << show(t).dump(2) << "\n"
          << slurp(guests() / t / "agent.log") << "\n"
          << slurp(dir_.path() / "vm-runner.log");
  }

  json node() { return kube_.get("/api/v1/nodes/utho"); }
  bool cordoned() { return node().value("/spec/unschedulable"_json_pointer, false); }
  std::string run_strategy(const std::string& t) {
    return kube_.get("/apis/kubevirt.io/v1/namespaces/tenants/virtualmachines/" + t)
        .value("/spec/runStrategy"_json_pointer, std::string());
  }
  bool vmi_exists(const std::string& t) {
    json v = kube_.get("/apis/kubevirt.io/v1/namespaces/tenants/virtualmachineinstances/" + t);
    return v.is_object() && v.value("kind", "") == "VirtualMachineInstance";
  }
  std::string maintenance_state(const std::string& t) {
    return show(t).value("/maintenance/state"_json_pointer, std::string());
  }
  // Requests that change something, as the double logged them.
  std::size_t writes_seen() {
    std::size_t n = 0;
    for (const auto& r : kube_.control("/_fake/requests").value("requests", json::array()))
      if (r.value("method", "GET") != "GET") ++n;
    return n;
  }
  // The unix time of the first line of `file` whose first word is `what`
  // (the guest's power.log: "shutdown <t>", "boot <t>"); 0 when none.
  double first_time(const fs::path& file, const std::string& what) {
    for (const auto& l : lines(slurp(file)))
      if (l.rfind(what + " ", 0) == 0) return std::stod(l.substr(what.size() + 1));
    return 0;
  }

  std::unique_ptr<Process> runner_;
};

TEST_F(Drain, DryRunChangesNothingDrainNotifiesThenStopsUndrainBringsEveryTenantBack) {
  start_guests();
  two_ready_tenants();
  auto& h = coordinator();
  std::map<std::string, std::string> agent_ids, enrolled;
  for (const char* t : {"tenant-1", "tenant-2"}) {
    json s = show(t);
    agent_ids[t] = s["agent"].value("agent_id", "");
    enrolled[t] = s["agent"].value("enrolled_at", "");
    ASSERT_FALSE(agent_ids[t].empty()) << s.dump(2);
  }

  // The impact, nothing changed.
  const std::size_t writes_before = writes_seen();
  auto dry = h.factory({"host", "drain", "utho", "--dry-run", "-o", "json"});
  ASSERT_EQ(dry.exit_code, 0) << dry.output;
  json impact = json::parse(dry.output, nullptr, false);
  ASSERT_TRUE(impact.is_object()) << dry.output;
  EXPECT_TRUE(impact.value("dry_run", false));
  std::set<std::string> listed;
  for (const auto& t : impact["tenants"]) {
    listed.insert(t.value("tenant", ""));
    EXPECT_EQ(t.value("tier", ""), "gpu-vm") << t.dump();
    EXPECT_FALSE(t.value("can_move", true)) << t.dump();
    EXPECT_FALSE(t.value("why_not", "").empty()) << "a tenant that cannot move says why";
  }
  EXPECT_EQ(listed, (std::set<std::string>{"tenant-1", "tenant-2"})) << impact.dump(2);
  EXPECT_EQ(writes_seen(), writes_before) << "a dry run wrote to the cluster";
  EXPECT_FALSE(cordoned());
  for (const char* t : {"tenant-1", "tenant-2"}) {
    EXPECT_EQ(run_strategy(t), "Always");
    EXPECT_EQ(maintenance_state(t), "");
  }
  auto table = h.factory({"host", "drain", "utho", "--dry-run"});
  EXPECT_EQ(table.exit_code, 0) << table.output;
  EXPECT_NE(table.output.find("tenant-1"), std::string::npos) << table.output;
  EXPECT_NE(table.output.find("nothing changed"), std::string::npos) << table.output;

  // The drain: cordon, notice, then the guests shut down, and it waits.
  EventReader feed(h, "/v1/events?tenant=tenant-1",
                   {{"Authorization", "Bearer " + h.admin_token()}});
  const auto t0 = std::chrono::steady_clock::now();
  auto drain = h.factory({"host", "drain", "utho", "--notice", "3s", "--message", "kernel update",
                          "--timeout", "90s", "--poll", "1s"},
                         120s);
  const double drain_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(drain.exit_code, 0) << drain.output << "\n" << h.log();
  EXPECT_TRUE(cordoned()) << node().dump(2);
  for (const char* t : {"tenant-1", "tenant-2"}) {
    json s = show(t);
    EXPECT_EQ(s.value("/maintenance/state"_json_pointer, std::string()), "drained") << s.dump(2);
    EXPECT_EQ(run_strategy(t), "Halted");
    EXPECT_FALSE(vmi_exists(t));
    // The guest got the notice (its agent's own event) before its stop.
    const std::string received = s.value("/maintenance/guest_received_at"_json_pointer, "");
    const std::string stop_asked = s.value("/maintenance/stop_requested_at"_json_pointer, "");
    EXPECT_FALSE(received.empty()) << s.dump(2);
    EXPECT_LE(received, stop_asked);
    // In the guest's own words: the wall message and the notice file came
    // before the shutdown.
    const fs::path root = guests() / t / "root";
    json notice = json::parse(slurp(root / "run/factory/maintenance"), nullptr, false);
    ASSERT_TRUE(notice.is_object()) << t;
    EXPECT_EQ(notice.value("node", ""), "utho");
    EXPECT_EQ(notice.value("message", ""), "kernel update");
    const fs::path wall = root / ".guestsim/log/wall.log";
    const std::string walls = slurp(wall);
    EXPECT_NE(walls.find("utho"), std::string::npos) << walls;
    const double shutdown_at = first_time(guests() / t / "power.log", "shutdown");
    ASSERT_GT(shutdown_at, 0) << slurp(guests() / t / "power.log");
    double wall_at = 0;
    for (const auto& l : lines(walls))
      if (wall_at == 0) wall_at = std::stod(l.substr(0, l.find(' ')));
    EXPECT_GT(wall_at, 0) << walls;
    EXPECT_LT(wall_at, shutdown_at) << "the notice reached the guest after its shutdown";
  }
  // On the feed: the notice, then the stop, then drained, in that order.
  auto noticed = feed.wait_for("action", "state", "notice");
  auto stopping = feed.wait_for("action", "state", "stopping");
  auto drained = feed.wait_for("action", "state", "drained");
  ASSERT_TRUE(noticed && stopping && drained) << feed.text();
  EXPECT_EQ(noticed->data["action"], "drain");
  EXPECT_EQ(noticed->data["node"], "utho");
  EXPECT_LT(std::stoull(noticed->id), std::stoull(stopping->id)) << "stopped before its notice";
  EXPECT_LT(std::stoull(stopping->id), std::stoull(drained->id));
  // The double's own log: the node cordoned, then each VM asked to stop.
  json vm_log = kube_.control("/_fake/vm-log");
  double cordon_at = 0;
  std::map<std::string, double> stop_at;
  for (const auto& e : vm_log.value("entries", json::array())) {
    if (e.value("event", "") == "cordoned" && cordon_at == 0) cordon_at = e.value("time", 0.0);
    if (e.value("event", "") == "stop_requested")
      stop_at.emplace(e.value("vm", ""), e.value("time", 0.0));
  }
  EXPECT_GT(cordon_at, 0) << vm_log.dump(2);
  for (const char* t : {"tenant-1", "tenant-2"}) {
    ASSERT_TRUE(stop_at.count(std::string("tenants/") + t)) << vm_log.dump(2);
    EXPECT_LT(cordon_at, stop_at[std::string("tenants/") + t]);
  }
  // No new VM lands on the cordoned node: a create now waits unscheduled.

  // Undrain: every tenant back to ready, same identity, no new enrollment.
  const auto t1 = std::chrono::steady_clock::now();
  auto undrain = h.factory({"host", "undrain", "utho", "--timeout", "120s", "--poll", "1s"}, 150s);
  const double undrain_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  ASSERT_EQ(undrain.exit_code, 0) << undrain.output << "\n" << h.log();
  EXPECT_FALSE(cordoned()) << node().dump(2);
  for (const char* t : {"tenant-1", "tenant-2"}) {
    json s = show(t);
    EXPECT_EQ(s["phase"], "ready") << s.dump(2);
    EXPECT_EQ(s.value("/maintenance/state"_json_pointer, std::string()), "back");
    EXPECT_EQ(s["agent"].value("agent_id", ""), agent_ids[t]) << "a new identity";
    EXPECT_EQ(s["agent"].value("enrolled_at", ""), enrolled[t]) << "enrolled again";
    EXPECT_TRUE(s["agent"].value("connected", false));
    EXPECT_EQ(run_strategy(t), "Always");
    EXPECT_GT(first_time(guests() / t / "power.log", "boot"), 0);
    EXPECT_FALSE(fs::exists(guests() / t / "root/run/factory/maintenance"))
        << "/run is a tmpfs: a boot clears the notice";
  }
  std::printf("drain of 2 tenants with --notice 3s: %.1f s; undrain to ready: %.1f s\n", drain_s,
              undrain_s);
  runner_->stop();
  for (const char* t : {"tenant-1", "tenant-2"})
    EXPECT_EQ(slurp(guests() / t / "root/.guestsim/log/guarded.log"), "");
}

TEST_F(Drain, ACoordinatorKilledDuringADrainOrAnUndrainCarriesOnFromItsJournals) {
  start_guests();
  two_ready_tenants();
  auto& h = coordinator();
  // Killed while the notices run: the stops come after its restart.
  auto drain = h.factory({"host", "drain", "utho", "--notice", "4s", "--no-wait"});
  ASSERT_EQ(drain.exit_code, 0) << drain.output;
  EXPECT_EQ(maintenance_state("tenant-1"), "noticed");
  h.kill9();
  h.start();
  for (const char* t : {"tenant-1", "tenant-2"})
    EXPECT_TRUE(eventually([&] { return maintenance_state(t) == "drained"; }, 90s, 250ms))
        << show(t).dump(2) << "\n"
        << h.log();
  EXPECT_TRUE(cordoned());

  // Killed at once after the undrain was journaled: the starts come after.
  auto undrain = h.factory({"host", "undrain", "utho", "--no-wait"});
  ASSERT_EQ(undrain.exit_code, 0) << undrain.output;
  h.kill9();
  h.start();
  for (const char* t : {"tenant-1", "tenant-2"})
    EXPECT_TRUE(eventually(
        [&] { return maintenance_state(t) == "back" && show(t)["phase"] == "ready"; }, 120s, 250ms))
        << show(t).dump(2) << "\n"
        << h.log();
  EXPECT_FALSE(cordoned());
  // Each VM stopped once and started once: nothing done twice.
  std::map<std::string, int> stops, starts;
  for (const auto& e : kube_.control("/_fake/vm-log").value("entries", json::array())) {
    if (e.value("event", "") == "stop_requested") ++stops[e.value("vm", "")];
    if (e.value("event", "") == "start_requested") ++starts[e.value("vm", "")];
  }
  for (const char* t : {"tenants/tenant-1", "tenants/tenant-2"}) {
    EXPECT_EQ(stops[t], 1) << t;
    EXPECT_EQ(starts[t], 1) << t;
  }
  runner_->stop();
}

// CDI's volumes as a local-path provisioner makes them (the double's
// --cdi-storage local: a `local` PersistentVolume with node affinity): the
// impact says the tenant cannot move, and why.
class DrainLocalDisk : public Drain {
 protected:
  DrainLocalDisk() : Drain({"--vfio-cards", "10DE:27B8=2", "--cdi-storage", "local"}) {}
};

TEST_F(DrainLocalDisk, ADiskOnNodeLocalStorageCannotMoveAndTheImpactSaysWhy) {
  allowlist();
  auto r = create("tenant-1", "gpu-vm");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Running (no guest needed for the impact): the VMI on utho.
  ASSERT_TRUE(eventually(
      [&] {
        json v =
            kube_.get("/apis/kubevirt.io/v1/namespaces/tenants/virtualmachineinstances/tenant-1");
        return v.value("/status/phase"_json_pointer, std::string()) == "Running";
      },
      20s));
  auto dry = coordinator().factory({"host", "drain", "utho", "--dry-run", "-o", "json"});
  ASSERT_EQ(dry.exit_code, 0) << dry.output;
  json impact = json::parse(dry.output, nullptr, false);
  ASSERT_TRUE(impact.is_object() && impact["tenants"].size() == 1u) << dry.output;
  const json& t = impact["tenants"][0];
  EXPECT_FALSE(t.value("can_move", true));
  const std::string why = t.value("why_not", "");
  EXPECT_NE(why.find("node-local storage"), std::string::npos) << why;
  EXPECT_NE(why.find("a local volume at /var/lib/local-volumes/pvc-"), std::string::npos) << why;
}

// --move: a cluster of two nodes with one L4 each and CDI volumes on network
// storage (the double's --extra-node and --cdi-storage network). The tenant
// on utho is shut down there after its notice and started again while utho
// is cordoned, so it lands on gpu-2: the same disk and identity, ready.
class DrainMove : public Drain {
 protected:
  DrainMove()
      : Drain({"--vfio-cards", "10DE:27B8=1", "--extra-node", "gpu-2=10DE:27B8=1", "--cdi-storage",
               "network"}) {}
};

TEST_F(DrainMove, ATenantThatCanMoveIsStartedAgainOnAnotherNodeWithItsIdentity) {
  auto al = run({factory_bin(), "kubevirt", "allowlist", "--kubeconfig", kube_.kubeconfig(),
                 "--pci-id", "10de:27b8", "--resource-name", kL4});
  ASSERT_EQ(al.exit_code, 0) << al.output;
  start_guests(/*runbook_host=*/false);
  auto& h = coordinator();
  auto r = create("tenant-1", "gpu-vm");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(eventually([&] { return show("tenant-1")["phase"] == "ready"; }, 120s, 250ms))
      << show("tenant-1").dump(2);
  const std::string vmi_path =
      "/apis/kubevirt.io/v1/namespaces/tenants/virtualmachineinstances/tenant-1";
  ASSERT_EQ(kube_.get(vmi_path).value("/status/nodeName"_json_pointer, std::string()), "utho");
  const std::string agent_id = show("tenant-1")["agent"].value("agent_id", "");

  auto dry = h.factory({"host", "drain", "utho", "--dry-run", "-o", "json"});
  ASSERT_EQ(dry.exit_code, 0) << dry.output;
  json impact = json::parse(dry.output, nullptr, false);
  ASSERT_TRUE(impact.is_object() && impact["tenants"].size() == 1u) << dry.output;
  EXPECT_TRUE(impact["tenants"][0].value("can_move", false)) << dry.output;

  auto drain = h.factory(
      {"host", "drain", "utho", "--move", "--notice", "1s", "--timeout", "90s", "--poll", "1s"},
      120s);
  ASSERT_EQ(drain.exit_code, 0) << drain.output << "\n" << h.log();
  json s = show("tenant-1");
  EXPECT_EQ(s.value("/maintenance/state"_json_pointer, std::string()), "back") << s.dump(2);
  EXPECT_EQ(s.value("/maintenance/node_after"_json_pointer, std::string()), "gpu-2");
  EXPECT_EQ(s["phase"], "ready");
  EXPECT_EQ(s["agent"].value("agent_id", ""), agent_id) << "a new identity";
  EXPECT_EQ(kube_.get(vmi_path).value("/status/nodeName"_json_pointer, std::string()), "gpu-2");
  EXPECT_TRUE(cordoned()) << "the drained node stays cordoned";
  runner_->stop();
}

TEST_F(Drain, BadInputIsRefusedInOneLine) {
  allowlist();
  auto& h = coordinator();
  expect_one_line_failure(h.factory({"host", "drain", "Not_A_Node", "--dry-run"}),
                          "not a Kubernetes node name");
  expect_one_line_failure(h.factory({"host", "drain", "utho", "--notice", "soon"}), "--notice");
  expect_one_line_failure(h.factory({"host", "drain", "no-such-node", "--notice", "1s"}),
                          "no node no-such-node");
  EXPECT_FALSE(cordoned());
}

}  // namespace
