// The guest simulator itself (tests/guestsim): that it answers as the real
// machines did (byte for byte where a capture exists), keeps its state, and
// that its reboot ends the agent the way the test harness expects.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "tests/guestsim/guest_sim.hpp"

namespace factory::testing {
namespace {

namespace fs = std::filesystem;

// The runbook's lines after its shell prompt line.
std::string capture_without_prompt(const fs::path& p) {
  std::string s = slurp(p);
  return s.substr(s.find('\n') + 1);
}

void install_driver_and_reboot(const GuestSim& sim) {
  for (auto argv : std::vector<std::vector<std::string>>{
           {"apt-get", "update"},
           {"apt-get", "install", "-y", "linux-headers-6.8.0-142-generic"},
           {"curl", "-fsSL", "-o", (sim.root() / "var/cache/repo.deb").string(),
            "https://developer.download.nvidia.com/compute/nvidia-driver/615.71.09/"
            "local_installers/"
            "nvidia-driver-local-repo-ubuntu2404-615.71.09_1.0-1_amd64.deb"},
           {"dpkg", "-i", (sim.root() / "var/cache/repo.deb").string()},
           {"sh", "-c",
            "cp \"$0\"/var/nvidia-driver-local-repo-ubuntu2404-615.71.09/*-keyring.gpg "
            "\"$0\"/usr/share/keyrings/",
            sim.root().string()},
           {"apt-get", "update"},
           {"apt-get", "install", "-y", "nvidia-headless-open=615.71.09-1ubuntu1",
            "nvidia-persistenced=615.71.09-1ubuntu1"}}) {
    auto r = sim.sh(argv);
    ASSERT_EQ(r.exit_code, 0) << argv[0] << ": " << r.output;
  }
  auto r = sim.reboot();
  ASSERT_EQ(r.exit_code, 0) << r.output;
}

TEST(GuestSim, AnswersWithTheRunbooksCapturesAfterTheDriverInstall) {
  TempDir dir("gsim");
  GuestSim sim(dir.path());
  auto before = sim.sh({"lspci", "-nnk", "-d", "10de:"});
  EXPECT_EQ(before.output.find("Kernel driver in use"), std::string::npos) << before.output;
  // Not installed: not on PATH.
  EXPECT_EQ(sim.sh({"sh", "-c", "command -v nvidia-smi || echo absent"}).output, "absent\n");

  install_driver_and_reboot(sim);

  // `lspci -nnk -d 10de: | grep -A3 '3D controller'` as the runbook shows it.
  auto lspci = sim.sh({"lspci", "-nnk", "-d", "10de:"});
  EXPECT_EQ(lspci.output,
            capture_without_prompt(fixtures_dir() / "l4-runbook/tenant1-lspci-nnk.txt"));
  // `nvidia-smi` as the runbook shows it after the reboot.
  auto smi = sim.sh({"nvidia-smi"});
  EXPECT_EQ(smi.exit_code, 0);
  EXPECT_EQ(smi.output, slurp(fixtures_dir() / "l4-runbook/tenant1-nvidia-smi-idle.txt"));
  EXPECT_EQ(sim.sh({"uname", "-r"}).output, "6.8.0-142-generic\n");
}

TEST(GuestSim, H200AnswersWithTheRealMachinesOutput) {
  TempDir dir("gsim");
  GuestSim sim(dir.path(), {"h200", 0});
  std::string capture = slurp(fixtures_dir() / "h200-passthrough-vm/nvidia-smi.txt");
  auto table = sim.sh({"nvidia-smi"});
  EXPECT_EQ(table.output, capture.substr(0, capture.find("GPU 0:")));
  auto list = sim.sh({"nvidia-smi", "-L"});
  EXPECT_EQ(list.output, "GPU 0: NVIDIA H200 (UUID: GPU-0108b095-397f-7583-e087-ade158522fa2)\n");
  auto xml = sim.sh({"nvidia-smi", "-q", "-x"});
  EXPECT_EQ(xml.output, slurp(fixtures_dir() / "h200-passthrough-vm/nvidia-smi-q-x.xml"));
  // The capture's own csv values, in the order asked.
  auto csv = sim.sh(
      {"nvidia-smi",
       "--query-gpu=uuid,name,pci.bus_id,driver_version,memory.total,memory.used,memory.free",
       "--format=csv,noheader,nounits"});
  EXPECT_EQ(csv.output,
            "GPU-0108b095-397f-7583-e087-ade158522fa2, NVIDIA H200, 00000000:00:06.0, 580.159.04, "
            "143771, 0, 143156\n");
  auto bad = sim.sh({"nvidia-smi", "--query-gpu=name,bogus", "--format=csv"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("Field \"bogus\" is not a valid field to query."), std::string::npos);
  // -q -d MEMORY: the memory blocks of the same kind of machine's `nvidia-smi -q`,
  // each line as captured.
  std::string q = slurp(fixtures_dir() / "h200-passthrough-vm/2026-12-01/nvidia-smi-q.txt");
  auto mem = sim.sh({"nvidia-smi", "-q", "-d", "MEMORY"});
  ASSERT_EQ(mem.exit_code, 0) << mem.output;
  std::istringstream lines(mem.output);
  size_t at = 0;
  for (std::string l; std::getline(lines, l);) {
    at = q.find(l + "\n", at);
    ASSERT_NE(at, std::string::npos) << "not in the capture, or out of order: " << l;
  }
  EXPECT_NE(mem.output.find("    FB Memory Usage\n        Total                                    "
                            "      : 143771 MiB\n"
                            "        Reserved                                       : 616 MiB\n"),
            std::string::npos)
      << mem.output;
  EXPECT_NE(mem.output.find("    BAR1 Memory Usage"), std::string::npos);
  EXPECT_EQ(mem.output.find("Utilization"), std::string::npos) << "only the memory blocks";
  // No compute process on the captured H200.
  auto apps = sim.sh({"nvidia-smi", "--query-compute-apps=gpu_uuid,pid,process_name,used_memory",
                      "--format=csv,noheader,nounits"});
  EXPECT_EQ(apps.exit_code, 0);
  EXPECT_EQ(apps.output, "");
}

TEST(GuestSim, RebootChangesTheBootIdAndRestartsEnabledServices) {
  TempDir dir("gsim");
  GuestSim sim(dir.path(), {"h200", 0});
  auto boot_id = [&] { return slurp(sim.root() / "proc/sys/kernel/random/boot_id"); };
  std::string first = boot_id();
  auto inst = sim.sh({"sh", "-c", "curl -fsSL https://ollama.com/install.sh | sh"});
  ASSERT_EQ(inst.exit_code, 0) << inst.output;
  std::string pid_before = slurp(sim.root() / ".guestsim/state/services/ollama.pid");
  ASSERT_FALSE(pid_before.empty());

  ASSERT_EQ(sim.reboot().exit_code, 0);
  EXPECT_NE(boot_id(), first);
  EXPECT_EQ(sim.counter("reboot"), 1);
  std::string pid_after = slurp(sim.root() / ".guestsim/state/services/ollama.pid");
  EXPECT_NE(pid_after, pid_before);  // stopped at shutdown, started at boot
  EXPECT_EQ(sim.sh({"systemctl", "is-active", "ollama"}).output, "active\n");
  // The H200's driver came with the image and loads again at boot.
  EXPECT_TRUE(fs::exists(sim.root() / "sys/module/nvidia"));
}

TEST(GuestSim, RebootEndsItsCallerWithSigkill) {
  TempDir dir("gsim");
  GuestSim sim(dir.path(), {"h200", 0});
  // No process named factory-agent above it: nothing is ended (never a
  // guessed process), unless told that the parent plays the agent.
  auto nobody = sim.sh({"sh", "-c", "reboot; echo survived"});
  EXPECT_EQ(nobody.exit_code, 0) << nobody.describe();
  EXPECT_NE(nobody.output.find("survived"), std::string::npos);
  EXPECT_NE(sim.calls_log().find("no factory-agent process above the reboot"), std::string::npos);
  auto r =
      sim.sh({"sh", "-c", "reboot; echo survived"}, {{"FACTORY_GUESTSIM_REBOOT_KILL", "parent"}});
  EXPECT_EQ(r.signal, 9) << r.describe() << r.output;
  EXPECT_EQ(r.output.find("survived"), std::string::npos);
  EXPECT_EQ(sim.counter("reboot"), 2);

  // The nearest ancestor named factory-agent is the one ended, however deep
  // the call (here: factory-agent -> sh -> systemctl reboot).
  fs::copy_file("/bin/sh", dir.path() / "factory-agent");
  auto agent = sim.sh({(dir.path() / "factory-agent").string(), "-c",
                       "sh -c 'systemctl reboot; true'; echo survived"});
  EXPECT_EQ(agent.signal, 9) << agent.describe() << agent.output;
  EXPECT_EQ(agent.output.find("survived"), std::string::npos);
  EXPECT_EQ(sim.counter("reboot"), 3);
  EXPECT_NE(sim.calls_log().find("(factory-agent)"), std::string::npos) << sim.calls_log();
}

TEST(GuestSim, AptWaitsForTheDpkgLockOrFailsLikeApt) {
  TempDir dir("gsim");
  GuestSim sim(dir.path());
  fs::path lock = sim.root() / "var/lib/dpkg/lock-frontend";
  // Hold the lock for a moment, as an orphaned apt-get (or unattended-upgrades) would.
  Process holder({"/usr/bin/flock", lock.string(), "-c", "sleep 1.5"}, dir.path() / "holder.log");
  ASSERT_TRUE(eventually([&] { return fs::exists(lock); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto now = sim.sh({"apt-get", "update"});
  EXPECT_EQ(now.exit_code, 100);
  EXPECT_NE(now.output.find("Could not get lock /var/lib/dpkg/lock-frontend"), std::string::npos)
      << now.output;
  auto waits = sim.sh({"apt-get", "-o", "DPkg::Lock::Timeout=30", "update"});
  EXPECT_EQ(waits.exit_code, 0) << waits.output;
}

// What a guest test can reach of this machine: its PATH lies wholly in the
// guest (stand-ins, installed programs, links to the listed host tools,
// guards); a host program not on the list does not exist there, and one that
// would act on the machine hits a guard, which runs nothing and leaves a
// record that fails the test at teardown.
TEST(GuestSim, PathHoldsOnlyStandInsListedToolsAndGuards) {
  TempDir dir("gsim");
  GuestSim sim(dir.path());
  EXPECT_EQ(run({GuestSim::script(), "path", sim.root().string()}).output, sim.path() + "\n");
  std::string entries = sim.path() + ":";
  for (size_t at = 0, colon; (colon = entries.find(':', at)) != std::string::npos; at = colon + 1) {
    fs::path dir_on_path = entries.substr(at, colon - at);
    EXPECT_EQ(dir_on_path.string().rfind(sim.root().string() + "/", 0), 0u) << dir_on_path;
    EXPECT_TRUE(fs::is_directory(dir_on_path)) << dir_on_path;
  }
  // Each listed tool is a link to one of this machine's programs.
  for (const auto& e : fs::directory_iterator(sim.root() / ".guestsim/host-bin")) {
    std::error_code ec;
    EXPECT_TRUE(fs::is_regular_file(e.path(), ec))
        << e.path() << " -> " << fs::read_symlink(e.path());
  }
  // cc is on this machine (it built the test) but not on the list.
  EXPECT_EQ(sim.sh({"sh", "-c", "command -v cc || echo absent"}).output, "absent\n");
  EXPECT_EQ(sim.sh({"sh", "-c", "command -v sed"}).output,
            (sim.root() / ".guestsim/host-bin/sed").string() + "\n");

  for (const std::vector<std::string>& argv :
       {std::vector<std::string>{"shutdown", "-r", "now"},
        {"driverctl", "set-override", "0000:01:00.0", "vfio-pci"},
        {"poweroff"},
        {"wget", "https://example.com/"}}) {
    auto r = sim.sh(argv);
    EXPECT_EQ(r.exit_code, 126) << argv[0] << ": " << r.output;
    EXPECT_NE(r.output.find("guestsim GUARD: '" + argv[0]), std::string::npos) << r.output;
  }
  EXPECT_EQ(sim.take_guarded(),
            "shutdown -r now\n"
            "driverctl set-override 0000:01:00.0 vfio-pci\n"
            "poweroff\n"
            "wget https://example.com/\n");
}

// cloud-init's runcmd in vm_runner.py uses the real curl, to loopback only.
TEST(GuestSim, CloudInitsCurlReachesLoopbackOnly) {
  TempDir dir("gsim");
  GuestSim sim(dir.path());
  fs::path ci_bin = sim.root() / ".guestsim/cloudinit-bin";
  fs::create_directories(ci_bin);
  fs::create_symlink(source_dir() / "tests/guestsim/curl-loopback", ci_bin / "curl");
  auto away = sim.sh({(ci_bin / "curl").string(), "-fsS", "https://example.com/agent"});
  EXPECT_EQ(away.exit_code, 126) << away.output;
  EXPECT_NE(away.output.find("curl to example.com, which is not loopback"), std::string::npos)
      << away.output;
  auto tricked = sim.sh({(ci_bin / "curl").string(), "-fsS", "http://example.com/@127.0.0.1/"});
  EXPECT_EQ(tricked.exit_code, 126) << tricked.output;
  EXPECT_EQ(sim.take_guarded(),
            "curl -fsS https://example.com/agent\ncurl -fsS http://example.com/@127.0.0.1/\n");
  // Loopback: the real curl runs (7: nothing listens on that port).
  auto here = sim.sh({(ci_bin / "curl").string(), "-sS", "--max-time", "5",
                      "http://127.0.0.1:" + std::to_string(free_loopback_port()) + "/"});
  EXPECT_EQ(here.exit_code, 7) << here.output;
}

// A guest test whose captures are missing ends at the simulator's set-up,
// with its message, and runs nothing: first in this process, then as a whole
// test (tests/guestsim/guestsim_probe.cpp: it would reboot the guest and
// apt-get install) run as a child with FACTORY_FIXTURES_DIR pointing nowhere.
TEST(GuestSim, MissingFixturesFailTheTestBeforeAnythingRuns) {
  TempDir dir("gsim");
  try {
    GuestSim sim(dir.path(), {"h200", 0, dir.path() / "no-fixtures"});
    ADD_FAILURE() << "a guest was made without its fixtures";
  } catch (const SetupFailed& e) {
    EXPECT_NE(std::string(e.what()).find("no fixtures at " + (dir.path() / "no-fixtures").string()),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(dir.path() / "guest/.guestsim")) << "nothing of the guest is made";

  const fs::path mark = dir.path() / "probe-ran";
  auto r = run({GUESTSIM_PROBE_BIN}, std::chrono::seconds(60),
               {{"FACTORY_FIXTURES_DIR", (dir.path() / "no-fixtures").string()},
                {"FACTORY_PROBE_MARK", mark.string()}});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("[  FAILED  ] Probe.RebootsTheGuest"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("no fixtures at " + (dir.path() / "no-fixtures").string()),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(mark)) << "the probe went on past its simulator's set-up:\n"
                                 << slurp(mark);
}

TEST(GuestSim, StandInsRefuseToRunOutsideASimulatedGuest) {
  auto r = run({(source_dir() / "tests/guestsim/bin/apt-get").string(), "update"});
  EXPECT_EQ(r.exit_code, 127);
  EXPECT_NE(r.output.find("is not a simulated guest"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace factory::testing
