// The agent runs on a stock Ubuntu 24.04 guest, not only where it was built:
// everything but glibc is linked in, and dlopen stays available for NVML.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>

#include "agent/link/version.hpp"
#include "agent/upgrade/upgrade_state.hpp"
#include "contract/agent_upgrade.hpp"
#include "tests/guestsim/guest_sim.hpp"
#include "tests/support/test_support.hpp"

using namespace factory::testing;
namespace fs = std::filesystem;

TEST(AgentBinary, DependsOnGlibcOnly) {
  const std::set<std::string> glibc = {"libc.so.6",       "libm.so.6",  "libdl.so.2",
                                       "libpthread.so.0", "librt.so.1", "ld-linux-x86-64.so.2"};
  auto libs = needed_libraries(agent_bin());
  ASSERT_FALSE(libs.empty()) << "a dynamic executable: glibc is not linked statically";
  for (auto& l : libs)
    EXPECT_TRUE(glibc.count(l)) << agent_bin() << " needs " << l << ", which a stock guest lacks";
  std::string all;
  for (auto& l : libs) all += l + " ";
  std::cout << "[ figures  ] factory-agent NEEDED: " << all << "\n";
}

TEST(AgentBinary, KeepsDlopenForNvml) {
  auto r = run({"nm", "-D", "--undefined-only", agent_bin()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(" dlopen"), std::string::npos)
      << "NVML is loaded at run time with dlopen";
  EXPECT_EQ(r.output.find("nvml"), std::string::npos) << "no link-time dependency on NVML";
}

TEST(AgentBinary, NeedsNoNewerGlibcThanUbuntu2404) {
  // Ubuntu 24.04 ships glibc 2.39; anything up to it is fine.
  auto r = run({"objdump", "-T", agent_bin()});
  ASSERT_EQ(r.exit_code, 0);
  std::istringstream in(r.output);
  std::string tok;
  int worst_minor = 0;
  while (in >> tok) {
    auto at = tok.find("GLIBC_2.");  // objdump prints "(GLIBC_2.34)" or "GLIBC_2.34"
    if (at == std::string::npos) continue;
    int minor = std::atoi(tok.c_str() + at + 8);
    worst_minor = std::max(worst_minor, minor);
  }
  EXPECT_GT(worst_minor, 0);
  EXPECT_LE(worst_minor, 39) << "needs GLIBC_2." << worst_minor;
}

TEST(AgentBinary, RunsAndPrintsItsVersion) {
  auto r = run({agent_bin(), "--version"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find(FACTORY_VERSION), std::string::npos);
  r = run({agent_bin(), "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("--coordinator-url"), std::string::npos);
  r = run({agent_bin(), "--coordinator-url", "wss://127.0.0.1:1", "--token-file", "/nonexistent"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("pin the coordinator's CA"), std::string::npos) << r.output;
}

// The version the agent reports is the one its bytes carry
// (agent/link/version.hpp), where the coordinator reads it
// (contract/agent_upgrade.hpp's agent_binary_version).
TEST(AgentBinary, CarriesTheVersionItReports) {
  auto carried = factory::proto::agent_binary_version(slurp(agent_bin()));
  ASSERT_TRUE(carried) << carried.error().message;
  EXPECT_EQ(*carried, FACTORY_VERSION);
  EXPECT_EQ(factory::agent::agent_version(), FACTORY_VERSION);
  EXPECT_EQ(*carried, factory::agent::agent_version());
}

// A build stamped with another version in place, as tests/e2e/vm_e2e.cpp
// (and a release) does: it runs, and says the new version.
TEST(AgentBinary, ABuildStampedWithAnotherVersionReportsIt) {
  TempDir dir("restamp");
  std::string bytes = slurp(agent_bin());
  const std::string_view mark = factory::proto::kAgentVersionMark;
  bool stamped = false;
  for (auto at = bytes.find(mark); at != std::string::npos && !stamped;
       at = bytes.find(mark, at + 1)) {
    const size_t field = at + mark.size();
    if (field >= bytes.size() || bytes[field] == '\0') continue;  // the decoder's needle
    std::string v = "0.9.9-restamped";
    v.resize(factory::proto::kAgentVersionField, '\0');
    bytes.replace(field, v.size(), v);
    stamped = true;
  }
  ASSERT_TRUE(stamped) << "no version mark in " << agent_bin();
  const fs::path copy = dir / "factory-agent";
  std::ofstream(copy, std::ios::binary) << bytes;
  fs::permissions(copy, fs::perms(0755));
  EXPECT_EQ(*factory::proto::agent_binary_version(bytes), "0.9.9-restamped");
  auto r = run({copy.string(), "--version"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "factory-agent 0.9.9-restamped\n");
}

// `factory-agent upgrade-guard`, as systemd runs it from the previous
// binary: no config, no network, only the state file; 0 whatever it found,
// 2 for a usage error.
TEST(AgentBinary, UpgradeGuardNeedsNothingButItsStateFile) {
  TempDir dir("guard");
  const std::string none = (dir / "no-such-state.json").string();
  for (const char* action : {"pre-start", "post-stop", "deadline"}) {
    auto r = run({agent_bin(), "upgrade-guard", action, "--state", none});
    EXPECT_EQ(r.exit_code, 0) << action << ": " << r.output;
  }
  EXPECT_EQ(run({agent_bin(), "upgrade-guard", "sideways", "--state", none}).exit_code, 2);
  EXPECT_EQ(run({agent_bin(), "upgrade-guard", "pre-start"}).exit_code, 2);
}

// The guard of the real binary at the deadline, in a simulated guest
// (tests/guestsim: systemctl is its stand-in): the previous binary is back
// at binary_path and systemd is asked to restart the unit.
TEST(AgentBinary, UpgradeGuardRollsBackAtTheDeadline) {
  TempDir dir("guard-sim");
  GuestSim sim(dir.path());
  std::ofstream(sim.root() / "etc/systemd/system/factory-agent.service") << "[Service]\n";
  const fs::path bin = sim.env().state_dir / "upgrade/bin";
  fs::create_directories(bin);
  fs::create_directories(sim.root() / "usr/local/bin");
  std::ofstream(bin / "factory-agent-stable") << "the previous build";
  std::ofstream(bin / "factory-agent-candidate") << "the new build";
  fs::create_symlink(bin / "factory-agent-candidate", sim.root() / "usr/local/bin/factory-agent");
  factory::agent::UpgradeState s;
  s.upgrade_id = "up-1";
  s.from_version = "0.1.0";
  s.to_version = "0.2.0";
  s.stable = (bin / "factory-agent-stable").string();
  s.candidate = (bin / "factory-agent-candidate").string();
  s.phase = factory::agent::UpgradePhase::trying;
  s.deadline = factory::Clock::now() - std::chrono::seconds(1);
  s.confirm_within_s = 30;
  const fs::path state = sim.env().state_dir / "upgrade/state.json";
  ASSERT_TRUE(factory::agent::save_upgrade_state(state, s).ok());

  auto r = sim.sh({agent_bin(), "upgrade-guard", "deadline", "--state", state.string(), "--root",
                   sim.root().string()});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("0.2.0 sent no health report within 30 s: rolled back to"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(fs::read_symlink(sim.root() / "usr/local/bin/factory-agent"),
            bin / "factory-agent-stable");
  auto after = factory::agent::load_upgrade_state(state);
  ASSERT_TRUE(after && *after);
  EXPECT_EQ((*after)->phase, factory::agent::UpgradePhase::rolled_back);
  EXPECT_EQ(sim.counter("systemctl.restart.factory-agent"), 1);
}
